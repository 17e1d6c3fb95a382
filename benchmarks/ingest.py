#!/usr/bin/env python3
"""Ingest benchmark: trace-cmd report vs tracekit binary ingest vs tracekit text ingest.

Records a large real trace on this machine's tracefs (an instance of its own with
syscall, sched, timer and irq events and a big buffer, then `trace-cmd extract`; run
as root), or uses the trace.dat given with --dat. Each contender runs in its own
process so that its peak memory (ru_maxrss) is its own: once to warm up, then --repeat
times, the contenders taking turns (a shared machine's speed drifts, and memory a VM
touches first costs more); the figures are the medians. Prints events per second (wall
clock: what a user waits; tracekit uses every core, trace-cmd one) and per CPU second
(the work done, whatever the cores), the ratio to trace-cmd on both, peak RSS, and the
binary ingest's peak RSS over the ring-buffer data with and without the fixed cost of
the interpreter and its libraries (RSS of a process that only imports tracekit and
polars): the target is on the plain ratio, the other shows what grows with the trace.
Data goes under $TRACEKIT_CACHE or ~/.cache/tracekit/bench, never into the repo.

    python3 benchmarks/ingest.py [--dat FILE] [--buffer-mb 160] [--seconds 8] [--repeat 3]

--seconds is the workload size: millions of bytes copied by each of two 1-byte `dd`s.
The defaults fill the buffers (about 6.5 million events, 320 MB of ring buffer on this
2-CPU machine; the rest are counted as dropped), so that the fixed cost of the
interpreter and libraries is a small share of the peak memory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
INSTANCE = "tk-ingest-bench"


def cache_root() -> Path:
    """Where big benchmark files go."""
    base = os.environ.get("TRACEKIT_CACHE") or str(Path.home() / ".cache" / "tracekit")
    out = Path(base) / "bench"
    out.mkdir(parents=True, exist_ok=True)
    return out


def record(out: Path, buffer_mb: int, seconds: float) -> None:
    """Fill an instance's buffer with function-tracer events, then trace-cmd extract it."""
    inst = TRACEFS / "instances" / INSTANCE
    if inst.exists():
        inst.rmdir()
    inst.mkdir()
    try:
        (inst / "buffer_size_kb").write_text(str(buffer_mb * 1024))
        (inst / "options" / "overwrite").write_text("0")  # stop when full: no overruns
        for system in ("raw_syscalls", "sched", "timer", "irq"):
            (inst / "events" / system / "enable").write_text("1")
        (inst / "tracing_on").write_text("1")
        # dd with 1-byte blocks: two syscalls (four events) per byte, on both CPUs.
        dd = ["dd", "if=/dev/zero", "of=/dev/null", "bs=1", f"count={int(seconds * 1e6)}"]
        procs = [subprocess.Popen(dd, stderr=subprocess.DEVNULL) for _ in range(2)]
        for p in procs:
            p.wait()
        (inst / "tracing_on").write_text("0")
        subprocess.run(["trace-cmd", "extract", "-B", INSTANCE, "-o", str(out)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    finally:
        if inst.exists():
            (inst / "tracing_on").write_text("0")
            inst.rmdir()


def measure(argv: list[str], stdout: Path | None = None) -> tuple[float, float, int, str]:
    """Run argv; return (wall seconds, CPU seconds, peak RSS in bytes, its stderr).

    Both times are kept: wall time is what a user waits (and what using both cores
    buys), CPU time (user + system) the work done, which moves less with whatever else
    this shared machine runs.
    """
    out = open(stdout, "w") if stdout else subprocess.DEVNULL  # noqa: SIM115
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    err = proc.stderr.read() if proc.stderr else ""
    if stdout:
        out.close()  # type: ignore[union-attr]
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"benchmark step failed: {' '.join(argv)}\n{err}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, err


BASELINE_CHILD = "import tracekit, polars"

TRACEKIT_CHILD = (
    "import sys, tracekit; t = tracekit.open(sys.argv[1], use_cache=False); "
    "print(t.events.height, t.meta.get('cpu_bytes', 0), file=sys.stderr)"
)


Figures = tuple[float, float, int, str]


def medians(contenders: list[tuple[list[str], Path | None]], repeat: int) -> list[Figures]:
    """measure() each contender once to warm up, then `repeat` times taking turns, so that a
    machine whose speed drifts (shared, throttled) slows every contender alike; per
    contender the median wall, CPU and peak RSS (and the last run's stderr).

    In order: the text contender reads what trace-cmd report (the first) wrote.
    """
    for argv, stdout in contenders:  # one warm-up each, not counted: caches, first touch
        measure(argv, stdout)
    runs: list[list[Figures]] = [[] for _ in contenders]
    for _ in range(max(repeat, 1)):
        for (argv, stdout), done in zip(contenders, runs, strict=True):
            done.append(measure(argv, stdout))
            os.sync()  # written output goes back to disk now, not under the next contender
    return [
        (
            statistics.median(r[0] for r in done),
            statistics.median(r[1] for r in done),
            int(statistics.median(r[2] for r in done)),
            done[-1][3],
        )
        for done in runs
    ]


def main() -> None:
    """Record (or take) a trace, run the three contenders, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dat", type=Path, help="use this trace.dat instead of recording one")
    ap.add_argument("--buffer-mb", type=int, default=160, help="per-CPU buffer when recording")
    ap.add_argument(
        "--seconds",
        type=float,
        default=8.0,
        help="workload size when recording (millions of dd bytes)",
    )
    ap.add_argument("--repeat", type=int, default=3, help="runs per contender (medians)")
    args = ap.parse_args()
    if shutil.which("trace-cmd") is None:
        sys.exit("benchmarks/ingest.py needs trace-cmd (apt-get install trace-cmd)")
    root = cache_root()
    dat = args.dat or root / "bench.dat"
    if args.dat is None:
        record(dat, args.buffer_mb, args.seconds)
    text = root / "bench.report.txt"
    tc, binary, txt, baseline = medians(
        [
            (["trace-cmd", "report", str(dat)], text),
            ([sys.executable, "-c", TRACEKIT_CHILD, str(dat)], None),
            ([sys.executable, "-c", TRACEKIT_CHILD, str(text)], None),
            ([sys.executable, "-c", BASELINE_CHILD], None),
        ],
        args.repeat,
    )
    events, data_bytes = (int(x) for x in binary[3].split()[-2:])
    base = baseline[2]
    text_events = int(txt[3].split()[-2])
    print(
        f"trace: {dat} ({dat.stat().st_size / 1e6:.1f} MB file, "
        f"{data_bytes / 1e6:.1f} MB ring-buffer data, {events} events; "
        f"medians of {args.repeat} runs)"
    )
    head = ("contender", "wall s", "CPU s", "events/s", "events/CPU s", "peak RSS MB",
            "x wall", "x CPU")  # fmt: skip
    widths = (26, 8, 8, 12, 14, 13, 8, 7)
    cells = zip(head[1:], widths[1:], strict=True)
    print(f"{head[0]:<{widths[0]}}" + "".join(f"{h:>{w}}" for h, w in cells))
    rows = [
        ("trace-cmd report (text)", tc, events),
        ("tracekit binary ingest", binary, events),
        ("tracekit text ingest", txt, text_events),
    ]
    for name, (wall, cpu, mem, _), n in rows:
        print(
            f"{name:<26}{wall:>8.2f}{cpu:>8.2f}{n / wall:>12,.0f}{n / cpu:>14,.0f}"
            f"{mem / 1e6:>13.0f}{tc[0] / wall:>7.1f}x{tc[1] / cpu:>6.1f}x"
        )
    m_bin, data = binary[2], max(data_bytes, 1)
    print(f"baseline RSS (a process that only imports tracekit, polars): {base / 1e6:.0f} MB")
    print(f"binary ingest peak RSS / ring-buffer data: {m_bin / data:.2f}")
    print(f"binary ingest (peak RSS - baseline) / ring-buffer data: {(m_bin - base) / data:.2f}")


if __name__ == "__main__":
    main()
