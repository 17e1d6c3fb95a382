"""Per-run metrics from per-sample values: the run, not the sample, is what gets compared.

Generic over what a sample is: a cyclictest wake-up latency (`latency_ns`) or a probe's
duration; the caller names the value column and the column that says which run a sample
belongs to.
"""

from __future__ import annotations

import polars as pl

from tracekit.errors import TracekitError

# Metric name -> column of run_metrics()'s result; the names compare() reports under.
RUN_METRICS: dict[str, str] = {
    "max": "max_ns",
    "p99": "p99_ns",
    "p99.9": "p99_9_ns",
    "mean": "mean_ns",
}
# "higher": a percentile is a latency some sample really had, never an interpolation, so
# with fewer than 1000 samples a run's p99.9 is its maximum (as cyclictest users expect).
QUANTILE_INTERPOLATION = "higher"
# A tail metric that rests on TOP_N samples of a run, never on one: the mean of its TOP_N
# longest (all of them in a shorter run). Asked for by name (benchmarks/simulate_null_fpr.py
# measures it beside p99.9, docs/simulate.md: on the emulated host's short runs p99.9 is
# the max), not in RUN_METRICS' family of every report.
TOP_N = 10
TAIL_METRICS: dict[str, str] = {"top10": "top10_ns"}


def run_metrics(
    samples: pl.DataFrame, value: str = "latency_ns", run: str = "run_id", tail: bool = False
) -> pl.DataFrame:
    """One row per run: run, samples, max_ns, p99_ns, p99_9_ns, mean_ns (sorted by run);
    with `tail`, top10_ns too."""
    _check_columns(samples, value, run)
    v = pl.col(value)
    extra = [v.top_k(TOP_N).cast(pl.Float64).mean().alias("top10_ns")] if tail else []
    return (
        samples.group_by(run)
        .agg(
            pl.len().alias("samples"),
            v.max().cast(pl.Float64).alias("max_ns"),
            v.quantile(0.99, QUANTILE_INTERPOLATION).alias("p99_ns"),
            v.quantile(0.999, QUANTILE_INTERPOLATION).alias("p99_9_ns"),
            v.mean().alias("mean_ns"),
            *extra,
        )
        .sort(run)
    )


def _check_columns(samples: pl.DataFrame, value: str, run: str) -> None:
    """Refuse missing columns, non-numeric values and null values (they would vanish)."""
    missing = [c for c in (value, run) if c not in samples.columns]
    if missing:
        raise TracekitError(
            f"run metrics: no column {', '.join(missing)} (have {', '.join(samples.columns)});"
            " add a run id column per sample before computing per-run metrics"
        )
    if not samples[value].dtype.is_numeric():
        raise TracekitError(f"run metrics: column {value} is {samples[value].dtype}, not numbers")
    nulls = samples[value].null_count() + samples[run].null_count()
    if nulls:
        raise TracekitError(
            f"run metrics: {nulls} samples have no {value} or no {run}; fill or drop them"
            " explicitly before computing per-run metrics"
        )
    if samples.height == 0:
        raise TracekitError("run metrics: no samples; check that the runs recorded any")


def metric_values(per_run: pl.DataFrame, metric: str) -> list[float]:
    """A metric's per-run values (one per run, in run order) for compare()."""
    known = RUN_METRICS | TAIL_METRICS
    if metric not in known:
        raise TracekitError(
            f"run metrics: unknown metric {metric!r}; choose one of {', '.join(known)}"
        )
    if known[metric] not in per_run.columns:
        raise TracekitError(f"run metrics: {metric} needs run_metrics(..., tail=True)")
    return [float(x) for x in per_run[known[metric]].to_list()]
