"""The trace's wake-up latencies checked against cyclictest's own numbers, same run.

cyclictest reads the clock back in user space, after the switch-in, the return from
clock_nanosleep and its own bookkeeping, so its numbers sit above the trace's by that
path's length: a steady offset is expected, a spread one means the two disagree. The
n-th sample of `cyclictest -v` is the n-th loop, so the two can be paired loop by loop.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl


def against_cyclictest(wakeups: pl.DataFrame, samples: pl.DataFrame) -> pl.DataFrame:
    """Trace latencies beside cyclictest's own for one run: count and percentiles (us).

    Rows: samples, median, p99, max; columns trace, cyclictest, cyclictest minus trace.
    """
    trace = wakeups["total_ns"].cast(pl.Float64)
    tool = samples["latency_ns"].cast(pl.Float64)
    rows = []
    for name, fn in _CHECK_STATS.items():
        t, c = fn(trace), fn(tool)
        diff = None if t is None or c is None else c - t
        rows.append((name, t, c, diff))
    return pl.DataFrame(
        rows,
        schema={
            "statistic": pl.String,
            "trace_us": pl.Float64,
            "cyclictest_us": pl.Float64,
            "difference_us": pl.Float64,
        },
        orient="row",
    )


def paired_offset(wakeups: pl.DataFrame, samples: pl.DataFrame) -> pl.DataFrame:
    """cyclictest minus trace, loop by loop (the n-th sample is the n-th wake-up).

    Only meaningful when the trace saw the run's first loop; the share of pairs with a
    non-negative offset says whether the pairing holds (it should be close to 1).
    """
    trace = wakeups.sort("wake_id")["total_ns"]
    tool = samples["latency_ns"]
    n = min(trace.len(), tool.len())
    diff = (tool.head(n).cast(pl.Int64) - trace.head(n)).cast(pl.Float64) / 1000
    return pl.DataFrame(
        {
            "pairs": [n],
            "median_us": [diff.median() if n else None],
            "p99_us": [diff.quantile(0.99, "higher") if n else None],
            "non_negative": [float((diff >= 0).mean()) if n else None],
        }
    )


def _us_stat(fn: str, q: float | None = None) -> Callable[[pl.Series], float | None]:
    """A statistic of a latency series in microseconds (None when empty)."""

    def stat(values: pl.Series) -> float | None:
        if values.len() == 0:
            return None
        if fn == "count":
            return float(values.len())
        x = values.quantile(q, "higher") if q is not None else values.max()
        return None if x is None else round(float(x) / 1000, 1)

    return stat


_CHECK_STATS = {
    "samples": _us_stat("count"),
    "median": _us_stat("q", 0.5),
    "p99": _us_stat("q", 0.99),
    "max": _us_stat("max"),
}
