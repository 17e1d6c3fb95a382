"""The programs a collection runs, as argv lists (never a shell), and where to find them.

cyclictest and stress-ng follow the report's protocol (../shared/BRIEF.md): cyclictest
SCHED_FIFO 99 with memory locked on the isolated CPU, one stress-ng --tlb-shootdown
worker per stress CPU. The reproducer's VMM and probe come from reproducer/build/.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tracekit.cpus import format_cpu_list
from tracekit.errors import TracekitError

REPRODUCER_BUILD = Path(__file__).resolve().parents[2] / "reproducer" / "build"


@dataclass(frozen=True)
class ToolPaths:
    """Absolute paths of every program a collection may start."""

    cyclictest: str
    stress_ng: str
    vmm: str
    probe: str
    perf: str | None  # only needed with --perf-counters
    trace_cmd: str | None = None  # only needed with --capture trace-cmd


def _which(name: str, package: str) -> str:
    """Find a program on PATH, or fail naming the Debian package that provides it."""
    path = shutil.which(name)
    if path is None:
        raise TracekitError(f"{name} not found on PATH; install Debian's {package} package")
    return path


def _reproducer(name: str, given: str | None) -> str:
    """Find a reproducer binary: the given path, else reproducer/build/, else PATH."""
    candidates = [given] if given else [str(REPRODUCER_BUILD / name), shutil.which(name)]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return str(Path(candidate).resolve())
    raise TracekitError(
        f"the reproducer's {name} was not found; build it with `make -C reproducer` "
        f"(on arm64) or pass its path with --{name}"
    )


def find_tools(
    vmm: str | None = None,
    probe: str | None = None,
    perf: bool = False,
    trace_cmd: bool = False,
) -> ToolPaths:
    """Locate every program up front, so nothing on the host changes before a failure."""
    return ToolPaths(
        cyclictest=_which("cyclictest", "rt-tests"),
        stress_ng=_which("stress-ng", "stress-ng"),
        vmm=_reproducer("vmm", vmm),
        probe=_reproducer("tlbiprobe", probe),
        perf=_which("perf", "linux-perf") if perf else None,
        trace_cmd=find_trace_cmd() if trace_cmd else None,
    )


def find_trace_cmd() -> str:
    """trace-cmd for --capture trace-cmd, or one line saying how to get it or do without."""
    path = shutil.which("trace-cmd")
    if path is None:
        raise TracekitError(
            "--capture trace-cmd: trace-cmd not found on PATH; install Debian's trace-cmd "
            "package, or leave --capture at raw (tracekit reads the buffers itself)"
        )
    return path


def tool_version(argv: list[str]) -> str:
    """First line a program prints for its version query, or why it printed none."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unknown ({err})"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


# cyclictest's histogram has one bucket per unit, and -N makes the unit a nanosecond:
# 1-ns buckets up to 200 us (1.6 MB of counters); longer wake-ups count as overflows and
# are in the verbose samples anyway.
HISTOGRAM_NS = 200_000


def cyclictest_argv(
    tools: ToolPaths,
    rt_cpu: int,
    interval_us: int,
    duration_s: int,
    json_path: Path,
    hist_path: Path | None = None,
) -> list[str]:
    """cyclictest as in the report: FIFO 99, mlockall, one thread on the rt CPU.

    -v prints every sample (n:count:latency), -N in ns; the main thread is kept off the
    rt CPU so only the measurement thread runs there. With `hist_path`, its -h histogram
    goes to that file (and into the JSON).
    """
    histogram = [f"--histogram={HISTOGRAM_NS}", f"--histfile={hist_path}"] if hist_path else []
    return [
        tools.cyclictest,
        "--mlockall",
        "--priority=99",
        "--policy=fifo",
        "--threads=1",
        f"--affinity={rt_cpu}",
        f"--interval={interval_us}",
        f"--duration={duration_s}",
        "--nsecs",
        "--verbose",
        "--quiet",
        f"--json={json_path}",
        *histogram,
    ]


# What compact_histogram leaves out, line by line: an empty bucket (its value, then a zero
# count per thread), and the overflow cycle list (its heading and one line per thread).
# One regular expression over the whole file: a Python loop over its 200,000 lines took
# ~0.9 s natively and ~10 s in the emulated host, once per quiet or traced run.
_LEFT_OUT = re.compile(
    r"^(?:[ \t]*\d+(?:[ \t]+0+)+[ \t]*|# Thread.*|# Histogram Overflow at.*)\n", re.MULTILINE
)
COMPACT_HEADING = "# tracekit: empty buckets and the overflow cycle list left out; buckets in ns"


def compact_histogram(text: str) -> str:
    """cyclictest's --histfile without its empty buckets and its list of overflow cycles.

    With 1-ns buckets the file has a line per nanosecond, nearly all zero; the cycles
    that overflowed are every sample above the range, which cyclictest.txt holds already.
    """
    body = text if not text or text.endswith("\n") else text + "\n"
    return f"{COMPACT_HEADING}\n{_LEFT_OUT.sub('', body)}"


def stress_argv(tools: ToolPaths, stress_cpus: list[int], duration_s: int, yaml: Path) -> list[str]:
    """stress-ng --tlb-shootdown, one worker per stress CPU, with its YAML metrics."""
    return [
        tools.stress_ng,
        "--tlb-shootdown",
        str(len(stress_cpus)),
        "--taskset",
        format_cpu_list(stress_cpus),
        "--timeout",
        f"{duration_s}s",
        "--metrics-brief",
        # Its temporary files must be on a local filesystem (the bundle may be on 9p/NFS).
        "--temp-path",
        tempfile.gettempdir(),
        "--yaml",
        str(yaml),
    ]


def vmm_argv(
    tools: ToolPaths,
    guest: Path,
    guest_cpus: list[int],
    trace_marker: Path | None,
    repeat: int = 1,
    extra: list[str] | None = None,
    vcpus: int | None = None,
) -> list[str]:
    """The reproducer's VMM: one guest (or --repeat N) pinned to the guest CPUs.

    vCPU i runs on the i-th guest CPU, cycled when there are more vCPUs than CPUs.
    """
    argv = [
        tools.vmm,
        "--cpus",
        format_cpu_list(guest_cpus),
        "--vcpus",
        str(vcpus or len(guest_cpus)),
        "--clock",
        "boottime",
    ]
    if repeat != 1:
        argv += ["--repeat", str(repeat)]
    if trace_marker is not None:
        argv += ["--trace-marker", str(trace_marker)]
    return [*argv, *(extra or []), str(guest)]


def probe_argv(
    tools: ToolPaths,
    cpu: int,
    helpers: list[int],
    mode: str,
    duration_s: int,
    out: Path,
    trace_marker: Path | None,
    pages: int = 1,
) -> list[str]:
    """The broadcast-TLBI probe on one CPU, its helper threads on others."""
    argv = [tools.probe, "--cpu", str(cpu), "--mode", mode, "--duration", str(duration_s)]
    if mode != "page":
        argv += ["--pages", str(pages)]  # page mode is one page and refuses --pages
    if helpers:
        argv += ["--helpers", format_cpu_list(helpers)]
    argv += ["--out", str(out)]
    if trace_marker is not None:
        argv += ["--trace-marker", str(trace_marker)]
    return argv


def perf_stat_argv(
    tools: ToolPaths, cpus: list[int], events: list[str], interval_ms: int, out: Path
) -> list[str]:
    """perf stat per CPU (-A) in CSV (-x,) with interval prints, until it is stopped."""
    if tools.perf is None:
        raise TracekitError("perf is needed for --perf-counters; install linux-perf")
    return [
        tools.perf,
        "stat",
        "-x,",
        "-A",
        "-C",
        format_cpu_list(cpus),
        "-I",
        str(interval_ms),
        "-e",
        ",".join(events),
        "-o",
        str(out),
    ]


def vmm_settings(**settings: int) -> list[str]:
    """VMM options from keyword values: ipa_bits=40 -> ["--ipa-bits", "40"]."""
    argv: list[str] = []
    for name, value in settings.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv
