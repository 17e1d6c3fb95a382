"""Intervals from paired trace events, and how much of each window they cover.

Shared by the wake-up decomposition and the correlation analysis. Everything is sorted
array arithmetic (join_asof, searchsorted, prefix sums), never a Python loop over events:
a traced run holds ~100k events and a report reads several runs.
"""

from __future__ import annotations

import numpy as np
import polars as pl

INTERVAL_SCHEMA = {"cpu": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64}


def pair_intervals(
    starts: pl.DataFrame, ends: pl.DataFrame, by: list[str]
) -> tuple[pl.DataFrame, int]:
    """Each start with the first end after it in its group: (cpu, start_ns, end_ns), unpaired.

    `starts` and `ends` have `ts` and the `by` columns (which include `cpu`). A start
    whose end comes after the group's next start lost its end (lost events, or a trace
    that stopped inside it): it is not paired, and counted, never stretched.
    """
    if starts.height == 0:
        return pl.DataFrame(schema=INTERVAL_SCHEMA), 0
    left = (
        starts.select(*by, pl.col("ts").alias("start_ns"))
        .sort("start_ns", maintain_order=True)
        .with_columns(pl.col("start_ns").shift(-1).over(by).alias("next_start_ns"))
    )
    right = ends.select(*by, pl.col("ts").alias("end_ns")).sort("end_ns", maintain_order=True)
    paired = left.join_asof(
        right,
        left_on="start_ns",
        right_on="end_ns",
        by=by,
        strategy="forward",
        check_sortedness=False,  # both sides are sorted just above
    )
    ok = pl.col("end_ns").is_not_null() & (
        pl.col("next_start_ns").is_null() | (pl.col("end_ns") <= pl.col("next_start_ns"))
    )
    good = paired.filter(ok)
    intervals = good.select(
        pl.col("cpu").cast(pl.Int32), "start_ns", "end_ns", *[c for c in by if c != "cpu"]
    )
    return intervals, paired.height - good.height


def overlap(windows: pl.DataFrame, intervals: pl.DataFrame) -> pl.DataFrame:
    """Per window (start_ns, end_ns): intervals that overlap it (n) and covered ns, summed.

    Intervals may overlap each other (two tasks' syscalls on one CPU); `overlap_ns` then
    counts the shared time once per interval, which is what "activity" means here.
    """
    a = windows["start_ns"].to_numpy().astype(np.int64)
    b = windows["end_ns"].to_numpy().astype(np.int64)
    s = np.sort(intervals["start_ns"].to_numpy().astype(np.int64))
    e = np.sort(intervals["end_ns"].to_numpy().astype(np.int64))
    # An interval overlaps [a, b] when it starts before b and ends after a.
    n = np.searchsorted(s, b, side="left") - np.searchsorted(e, a, side="right")
    covered = _covered_until(s, e, b) - _covered_until(s, e, a)
    return pl.DataFrame({"n": n.astype(np.int64), "overlap_ns": covered.astype(np.int64)})


def _covered_until(s: np.ndarray, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Sum over intervals of their length before each t (starts s and ends e sorted)."""
    s_sum = np.concatenate(([0], np.cumsum(s)))
    e_sum = np.concatenate(([0], np.cumsum(e)))
    ns = np.searchsorted(s, t, side="left")
    ne = np.searchsorted(e, t, side="left")
    # started before t: (t - s) each; of those, ended before t: minus (t - e) each.
    return (ns * t - s_sum[ns]) - (ne * t - e_sum[ne])
