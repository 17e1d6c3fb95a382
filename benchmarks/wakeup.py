#!/usr/bin/env python3
"""Wake-up decomposition and correlation benchmark over a bundle's traced runs.

Times tracekit.analysis.wakeup.decompose and the correlation steps on each traced run,
as recorded and repeated end to end `--repeat` times (copies shifted in time, so the
analyses see a run that many times longer), and prints events, wake-ups and events/s.

    python3 benchmarks/wakeup.py BUNDLE [--repeat 4]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import polars as pl

from tracekit.analysis.correlation import (
    activity_intervals,
    exposure,
    latency_windows,
    window_activity,
)
from tracekit.analysis.wakeup import decompose
from tracekit.ingest.bundle import load_bundle, open_run_trace, traced_runs


def repeated(events: dict[str, pl.DataFrame], times: int) -> dict[str, pl.DataFrame]:
    """The run's tables `times` times back to back (ts and row shifted per copy)."""
    frames = [t for t in events.values() if t.height]
    span = max(int(t["ts"].max()) for t in frames) - min(int(t["ts"].min()) for t in frames) + 1
    rows = max(int(t["row"].max()) for t in frames) + 1
    return {
        name: pl.concat(
            t.with_columns(pl.col("ts") + k * span, pl.col("row") + k * rows) for k in range(times)
        )
        for name, t in events.items()
    }


def main() -> None:
    """Time each traced run of the bundle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--repeat", type=int, default=4)
    args = parser.parse_args()
    data = load_bundle(args.bundle)
    rt_cpu = int(data.manifest.options["rt_cpu"])
    for run in traced_runs(data):
        trace = open_run_trace(data, run)
        events = repeated({n: trace.event(n) for n in trace.event_names}, args.repeat)
        n = sum(t.height for t in events.values())
        start = time.perf_counter()
        wakeups = decompose(events, rt_cpu, trace.meta.get("clock", "boot")).frame
        middle = time.perf_counter()
        intervals, _ = activity_intervals(events, rt_cpu)
        window_activity(latency_windows(wakeups), intervals)
        exposure(wakeups, intervals)
        end = time.perf_counter()
        print(
            f"{run.run_id} x{args.repeat}: {n} events, {wakeups.height} wake-ups;"
            f" decompose {middle - start:.2f} s ({n / (middle - start):,.0f} events/s),"
            f" correlation {end - middle:.2f} s"
        )


if __name__ == "__main__":
    main()
