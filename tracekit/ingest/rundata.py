"""One run's data, opened through one object that loads each piece once, on first use.

Report sections and the Perfetto export ask a bundle for a run's RunData
(`BundleData.run(run)`) and never open a run's files themselves: its trace, the VMM's
output, the probe's samples, cyclictest's samples and its interval, the JSON a run left
(rollover.json, guest-stop.json), and its lost events, each defined here once. A file
whose size differs from the manifest's record is refused with one line (the fast check;
`tracekit.bundle.verify_files` hashes every file), so a changed file never changes a
number silently. A killed run's files are read as far as they are whole
(bundle.cut_files): a line cut mid-way or a CPU's partial last page is left out, a
stopped tool's output without results gives none, and each is one of the run's
`problems`, which the bundle's problems (shown first by every output) include.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from tracekit.bundle import Manifest, RunFile, RunRecord, run_file, run_trace_path
from tracekit.errors import TracekitError

if TYPE_CHECKING:
    from tracekit.ingest.probe import ProbeHeader
    from tracekit.ingest.trace import Trace
    from tracekit.ingest.vmm import VmmOutput

T = TypeVar("T")


@dataclass(eq=False)
class RunData:
    """A bundle run's files, each read at most once (None where the run has no such file)."""

    root: Path
    manifest: Manifest
    run: RunRecord
    damaged: set[str] = field(default_factory=set)  # files found missing or changed: not read
    cut: set[str] = field(default_factory=set)  # files a stopped writer cut: read while whole
    problems: list[str] = field(default_factory=list)  # what reading found (one line each)
    trace_options: dict[str, Any] = field(default_factory=dict)
    derived: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.run.run_id

    @property
    def stopped(self) -> bool:
        """Whether the run did not end normally (killed, interrupted, failed)."""
        return self.run.stopped

    def _cut(self, rel: str) -> bool:
        """Whether `rel`, or a file under it, was cut by a stopped writer."""
        return any(c == rel or c.startswith(f"{rel}/") for c in self.cut)

    @cached_property
    def lost_per_cpu(self) -> dict[int, int]:
        """CPU -> events the run's trace lost (tracekit.ingest.lost: the one definition)."""
        from tracekit.ingest.lost import lost_per_cpu

        trace = self.trace
        return lost_per_cpu(trace.lost if trace is not None else None, self.run.lost_events)

    @property
    def lost_events(self) -> int:
        """Events the run's trace lost, over its CPUs."""
        return sum(self.lost_per_cpu.values())

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """A value derived from this run's data, made once per report (e.g. its event tables)."""
        if key not in self.derived:
            self.derived[key] = make()
        return self.derived[key]  # type: ignore[no-any-return]

    def path(self, name: str) -> Path | None:
        """A file of this run; None when absent, resized or (verified) changed.

        A resized file is never read: its numbers would change silently. It is one of the
        bundle's problems (bundle.bundle_problems), which every output shows first.
        """
        rel = run_file(self.run_id, name)
        path = self.root / rel
        if not path.exists() or rel in self.damaged:
            return None
        recorded = self.manifest.files.get(rel)
        if recorded is not None and path.is_file() and path.stat().st_size != recorded["size"]:
            return None
        return path

    @cached_property
    def trace_path(self) -> Path | None:
        """The run's trace (raw capture directory or trace.dat); None without one, or when
        a file of it is missing or changed (a bundle problem every output shows)."""
        path = run_trace_path(self.root, self.run_id)
        if path is None:
            return None
        rel = path.relative_to(self.root).as_posix()
        hit = any(d == rel or d.startswith(f"{rel}/") for d in self.damaged)
        return None if hit else path

    @cached_property
    def trace(self) -> Trace | None:
        """The run's trace, ingested once (Parquet-cached beside it)."""
        if self.trace_path is None:
            return None
        from tracekit.ingest.opening import open_trace

        options = dict(self.trace_options)
        if self._cut(self.trace_path.relative_to(self.root).as_posix()):
            options["salvage"] = True  # the whole pages before the cut; the cut is a problem
        return open_trace(self.trace_path, **options)

    @cached_property
    def kallsyms(self) -> dict[int, str] | None:
        """Addresses -> names from the kallsyms copy a raw capture keeps, if it has one."""
        own = self.trace_path / "kallsyms" if self.trace_path is not None else None
        if own is None or not own.is_file():
            return None
        from tracekit.symbols.kallsyms import address_names

        return address_names(own)

    @cached_property
    def vmm(self) -> VmmOutput | None:
        """The VMM's output, when the run ran it."""
        path = self.path(RunFile.VMM)
        if path is None:
            return None
        from tracekit.ingest.vmm import parse_vmm_output, read_vmm_output

        if run_file(self.run_id, RunFile.VMM) not in self.cut:
            return read_vmm_output(path)
        text = path.read_text(errors="replace")  # a cut record's numbers may be shortened
        return parse_vmm_output(text[: text.rfind("\n") + 1], str(path))

    @cached_property
    def maint(self) -> pl.DataFrame | None:
        """The after-guest EL2 maintenance requests (tracekit.ingest.maint), when it ran."""
        path = self.path(RunFile.MAINT)
        if path is None:
            return None
        from tracekit.ingest.maint import parse_maint_log

        return parse_maint_log(path.read_text(errors="replace"), str(path.name))

    @cached_property
    def probe(self) -> tuple[ProbeHeader, pl.DataFrame] | None:
        """The probe's header and per-call samples, when the run was a probe slot."""
        path = self.path(RunFile.PROBE)
        if path is None:
            return None
        from tracekit.ingest.probe import read_probe_file

        return read_probe_file(path)

    @cached_property
    def cyclictest(self) -> pl.DataFrame | None:
        """cyclictest's per-loop samples (thread, cycle, latency_ns)."""
        path = self.path(RunFile.CYCLICTEST)
        if path is None:
            return None
        from tracekit.ingest.tools import read_cyclictest_verbose

        rel = run_file(self.run_id, RunFile.CYCLICTEST)
        samples = read_cyclictest_verbose(path, self.stopped or rel in self.cut)
        if samples.height == 0:
            self.problems.append(f"{rel}: no sample (cyclictest was stopped before printing one)")
            return None
        return samples

    @cached_property
    def cyclictest_counted(self) -> int | None:
        """The loops cyclictest itself counted (its --json, all threads): what -v should
        have printed; None without the file, when it is cut, or a stopped run's unread."""
        unknown = "the loops cyclictest counted are not known"
        return self._whole(RunFile.CYCLICTEST_JSON, cyclictest_cycles, unknown)

    @cached_property
    def stress_ops_per_s(self) -> float | None:
        """stress-ng's bogo-ops per second of wall time, all workers (its --yaml metrics);
        None without the file, when it is cut, or when a stopped run's has no metrics."""
        return self._whole(RunFile.STRESS_YAML, stress_throughput, "its throughput is not known")

    @cached_property
    def probe_summary(self) -> dict[str, Any] | None:
        """The probe slot's JSON summary (its first line); None without the file, when it
        is cut, or when a stopped run's is empty or not whole."""
        unknown = "the probe slot's summary is not known"
        return self._whole(RunFile.PROBE_SUMMARY, read_probe_summary, unknown)

    def _whole(self, name: str, read: Callable[[Path], T], unknown: str) -> T | None:
        """`read` of one of the run's files; None without it or when it is cut. A stopped
        run's file that `read` refuses (a tool stopped before it printed, or mid-way) is
        one of the run's problems, saying what is `unknown`, never an error."""
        path = self.path(name)
        rel = run_file(self.run_id, name)
        if path is None or rel in self.cut:
            return None
        try:
            return read(path)
        except TracekitError as err:
            if not self.stopped:
                raise
            reason = str(err).replace(f"{path}: ", "")
            self.problems.append(
                f"{rel}: not read, the run ended {self.run.status} ({reason}): {unknown}"
            )
            return None

    @cached_property
    def cyclictest_interval_ns(self) -> int | None:
        """cyclictest's --interval from the run's own command line, else the bundle's options."""
        argv = self._argv(RunFile.CYCLICTEST)
        for n, arg in enumerate(argv):
            if arg.startswith("--interval="):
                return int(arg.split("=", 1)[1]) * 1000
            if arg in ("-i", "--interval") and n + 1 < len(argv):
                return int(argv[n + 1]) * 1000
        value = self.manifest.options.get("interval_us")
        return int(value) * 1000 if value else None

    @cached_property
    def vmid_bits(self) -> int | None:
        """The VMID width a rollover run recorded (its rollover.json), else None."""
        extra = self.extra(RunFile.ROLLOVER)
        bits = extra.get("vmid_bits") if extra is not None else None
        return bits if isinstance(bits, int) else None

    def extra(self, name: str) -> dict[str, Any] | None:
        """A JSON object the run left beside its outputs (e.g. rollover.json), or None."""
        path = self.path(name)
        if path is None:
            return None
        try:
            loaded = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise TracekitError(f"{path}: not readable JSON ({err})") from None
        return loaded if isinstance(loaded, dict) else None

    def _argv(self, output: str) -> list[str]:
        """The command line that wrote one of the run's outputs (its .argv record)."""
        path = self.path(f"{output}.argv")
        if path is None:
            return []
        try:
            argv = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise TracekitError(f"{path}: not the collector's argv record ({err})") from None
        return [str(a) for a in argv] if isinstance(argv, list) else []


STRESS_RATE = "bogo_ops_per_second_real_time"


def stress_throughput(path: Path) -> float:
    """stress-ng's bogo-ops/s of wall time summed over its stressors, from its --yaml.

    Every stressor must have the number: a sum that skipped one would be too low, silently.
    """
    from tracekit.ingest.tools import read_tool

    _, tables, _ = read_tool(path)
    table = tables.get("stress_ng")
    whole = (
        table is not None
        and table.height > 0
        and STRESS_RATE in table.columns
        and table[STRESS_RATE].dtype.is_numeric()
        and table[STRESS_RATE].null_count() == 0
    )
    if not whole:
        raise TracekitError(
            f"{path}: no stress-ng bogo-ops-per-second-real-time for every stressor; "
            "the run's stress-ng did not finish"
        )
    return float(table[STRESS_RATE].sum())


# What a probe summary holds that the bundle's probe table takes (tlbiprobe's first line).
PROBE_SUMMARY_KEYS = ("cpu", "mode", "count", "p50_ns", "p99_ns", "max_ns", "mean_ns")


def read_probe_summary(path: Path) -> dict[str, Any]:
    """The probe's JSON summary line, with every key the probe table takes."""
    try:
        summary = json.loads(path.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError) as err:
        raise TracekitError(f"{path}: not the probe's JSON summary ({err})") from None
    missing = [
        key for key in PROBE_SUMMARY_KEYS if not isinstance(summary, dict) or key not in summary
    ]
    if missing:
        raise TracekitError(f"{path}: not the probe's JSON summary (no {', '.join(missing)})")
    return summary  # type: ignore[no-any-return]


def cyclictest_cycles(path: Path) -> int:
    """Loops cyclictest itself counted, all threads: what -v should have printed."""
    try:
        threads = json.loads(path.read_text())["thread"]
        return sum(int(t["cycles"]) for t in threads.values())
    except (ValueError, KeyError, TypeError) as err:
        raise TracekitError(f"{path}: not cyclictest's --json output ({err})") from None
