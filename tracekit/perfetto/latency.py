"""cyclictest's wake-up latencies as a counter per run, and its worst wake-ups as slices.

`cyclictest -v -N` prints (thread, cycle, latency) per loop, with no timestamps; the
times are rebuilt. Each loop sleeps until an absolute due time (clock_nanosleep,
TIMER_ABSTIME), then adds the interval to that due time, and keeps adding it while the
result is already past. So due times lie on the interval's grid, and each sample's
latency gives the next one: due[i+1] = due[i] + interval * (latency[i] // interval + 1).
Only due[0] is unknown.

A traced run's trace gives it, more precisely than the sched_switch to cyclictest would
(a switch-in is neither the due time nor the moment cyclictest reads its clock, and a
loop whose due time is already past does not switch at all): every sleep is an
hrtimer_start of `hrtimer_wakeup` by the measuring thread, whose `softexpires` is the due
time. The first one is due[0]; the rest are checked against the rebuilt grid (hrtimer
times are CLOCK_MONOTONIC, the trace's clock CLOCK_BOOTTIME: equal unless the host
suspended, which the check would catch). Without a trace (quiet runs) or when the check
fails, due[0] is the run's start in the manifest: the times are then late or early by
cyclictest's start-up, and the track's description says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from tracekit.perfetto.tracks import TrackWriter, write_spans

WORST = 10
MATCH_NEEDED = 0.9  # share of the trace's due times that must fall on the rebuilt grid
BY_TRACE = "due times from the trace's hrtimer_start (hrtimer_wakeup) of cyclictest"
BY_START = (
    "APPROXIMATE times: the first due time taken as the run's start (no trace, or the "
    "trace's timers did not match); the spacing between samples is exact"
)


@dataclass
class Timeline:
    """One cyclictest thread's samples with their due times."""

    thread: int
    cycles: np.ndarray
    latency_ns: np.ndarray
    due_ns: np.ndarray
    method: str
    matched: float | None = None  # share of the trace's timers on the grid


def grid_steps(latency_ns: np.ndarray, interval_ns: int) -> np.ndarray:
    """Due time of each sample in intervals after the first (see the module docstring)."""
    steps = latency_ns // interval_ns + 1
    return np.concatenate([[0], np.cumsum(steps)[:-1]]).astype(np.int64)


def timelines(
    samples: pl.DataFrame, interval: int, start_ns: int, timers: list[np.ndarray]
) -> list[Timeline]:
    """Every thread's samples with due times, from its timers when they fit the grid."""
    out = []
    for n, (thread,) in enumerate(samples.select("thread").unique().sort("thread").iter_rows()):
        own = samples.filter(pl.col("thread") == thread).sort("cycle")
        latency = own["latency_ns"].to_numpy().astype(np.int64)
        steps = grid_steps(latency, interval)
        cycles = own["cycle"].to_numpy()
        expires = timers[n] if n < len(timers) else np.array([], dtype=np.int64)
        matched = _grid_match(expires, steps, interval)
        if matched is not None and matched >= MATCH_NEEDED:
            due = int(expires[0]) + steps * interval
            out.append(Timeline(thread, cycles, latency, due, BY_TRACE, matched))
        else:
            due = start_ns + steps * interval
            out.append(Timeline(thread, cycles, latency, due, BY_START, matched))
    return out


def _grid_match(expires: np.ndarray, steps: np.ndarray, interval: int) -> float | None:
    """Share of the timers (up to the last sample's due time) that lie on the rebuilt grid."""
    if len(expires) == 0 or len(steps) == 0:
        return None
    offsets = expires.astype(np.int64) - int(expires[0])
    on_grid = offsets % interval == 0
    index = offsets // interval
    considered = index <= steps[-1]
    if not considered.any():
        return None
    hits = on_grid & np.isin(index, steps)
    return float(hits[considered].sum() / considered.sum())


def write_latencies(
    tracks: TrackWriter,
    parent: int,
    run_id: str,
    lines: list[Timeline],
    window: tuple[int | None, int | None],
    rt_cpu: Any,
) -> None:
    """Per thread: the latency counter at each due time, and the worst wake-ups as slices."""
    t0 = window[0] if window[0] is not None else -(2**62)
    t1 = window[1] if window[1] is not None else 2**62
    for line in lines:
        keep = (line.due_ns >= t0) & (line.due_ns <= t1)
        if not keep.any():
            continue
        where = f"CPU {rt_cpu}" if rt_cpu is not None else f"thread {line.thread}"
        description = f"cyclictest wake-up latency (ns) at each due time; {line.method}"
        if line.matched is not None:
            description += f" ({line.matched:.0%} of the trace's timers on the grid)"
        counter = tracks.track(
            f"{run_id}/cyclictest:{line.thread}",
            f"cyclictest latency, {where} ({run_id})",
            parent,
            counter=True,
            description=description,
            unit_ns=True,
        )
        for due, latency in zip(line.due_ns[keep], line.latency_ns[keep], strict=True):
            tracks.counter(counter, int(due), float(latency))
        _write_worst(tracks, parent, run_id, line, keep, where)


def _write_worst(
    tracks: TrackWriter, parent: int, run_id: str, line: Timeline, keep: np.ndarray, where: str
) -> None:
    """The WORST largest latencies as slices from the due time to the wake-up."""
    index = np.flatnonzero(keep)
    worst = index[np.argsort(-line.latency_ns[index], kind="stable")[:WORST]]
    spans = []
    for rank, i in enumerate(worst, 1):
        latency = int(line.latency_ns[i])
        args = {
            "rank": rank,
            "cycle": int(line.cycles[i]),
            "latency_ns": latency,
            "thread": line.thread,
            "due_ts": int(line.due_ns[i]),
            "timing": line.method,
        }
        name = f"#{rank}: {latency / 1000:.0f} us wake-up"
        spans.append((int(line.due_ns[i]), int(line.due_ns[i]) + latency, name, args))
    name = f"cyclictest worst {len(spans)} wake-ups, {where} ({run_id})"
    write_spans(tracks, f"{run_id}/worst:{line.thread}", name, parent, spans)
