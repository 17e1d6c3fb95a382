"""The main case's before/after comparisons over a bundle's tables (pure, no I/O).

Headline numbers come from the quiet runs; the traced runs are compared on their own,
so the report can show the observer effect beside them. The primary metric is declared
up front (cyclictest p99.9 on the rt CPU unless the caller names another); every other
metric is secondary and Holm-corrected.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from tracekit.analysis.compare import Comparison, compare, compare_all
from tracekit.analysis.runs import RUN_METRICS, metric_values, run_metrics
from tracekit.bundle import NO_CPUIDLE, RunRecord

PRIMARY = "p99.9"


# What a saturated rt CPU's comparisons say instead of the runs a verdict would need.
SATURATED_NO_VERDICT = "the rt CPU is saturated (more runs measure its backlog)"


def latency_comparisons(
    latencies: pl.DataFrame,
    kind: str = "quiet",
    primary: str = PRIMARY,
    interval_us: float | None = None,
) -> list[Comparison]:
    """cyclictest max, p99, p99.9 and mean: per-run values, after vs before.

    With the run's `interval_us`, a phase of `kind` whose median wake-up is above it
    (saturated_phases) makes every comparison unreachable by more runs (no_verdict).
    """
    runs = latencies.filter(pl.col("kind") == kind)
    per_phase = {
        phase: run_metrics(runs.filter(pl.col("phase") == phase)) for phase in ("before", "after")
    }
    comparisons = [
        compare(
            metric_values(per_phase["before"], metric),
            metric_values(per_phase["after"], metric),
            f"cyclictest {metric}",
            before_runs=per_phase["before"]["run_id"].to_list(),
            after_runs=per_phase["after"]["run_id"].to_list(),
        )
        for metric in RUN_METRICS
    ]
    return while_saturated(
        compare_all(comparisons, f"cyclictest {primary}"), saturated(runs, interval_us)
    )


def saturated(latencies: pl.DataFrame, interval_us: float | None) -> bool:
    """Whether any phase and kind of these latencies is saturated (False: no interval)."""
    return interval_us is not None and not saturated_phases(latencies, interval_us).is_empty()


def while_saturated(comparisons: list[Comparison], is_saturated: bool) -> list[Comparison]:
    """Comparisons of a saturated rt CPU's latencies: no run count makes them a verdict."""
    if not is_saturated:
        return comparisons
    return [replace(c, needed_runs=None, no_verdict=SATURATED_NO_VERDICT) for c in comparisons]


def stress_comparison(stress: pl.DataFrame, kind: str = "quiet") -> Comparison:
    """stress-ng --tlb-shootdown throughput (bogo-ops/s), after vs before."""
    rows = stress.filter(pl.col("kind") == kind)
    return compare(
        rows.filter(pl.col("phase") == "before")["bogo_ops_per_s"].to_list(),
        rows.filter(pl.col("phase") == "after")["bogo_ops_per_s"].to_list(),
        "stress-ng bogo-ops/s",
    )


def phase_summary(latencies: pl.DataFrame) -> pl.DataFrame:
    """Per phase and kind: runs, samples, and the mean of per-run max/p99.9 (us)."""
    runs = latencies.select("run_id", "phase", "kind").unique(maintain_order=True)
    per_run = run_metrics(latencies).join(runs, on="run_id", maintain_order="left")
    return (
        per_run.group_by("phase", "kind")
        .agg(
            pl.len().alias("runs"),
            pl.col("samples").sum(),
            (pl.col("max_ns").mean() / 1000).round(1).alias("max_us"),
            (pl.col("p99_9_ns").mean() / 1000).round(1).alias("p99_9_us"),
        )
        .sort("kind", pl.col("phase").replace({"before": "0", "after": "1"}))
    )


def saturated_phases(latencies: pl.DataFrame, interval_us: float) -> pl.DataFrame:
    """Phases and kinds whose median wake-up is later than cyclictest's interval.

    Columns phase, kind, median_us. Such a thread wakes after its next period was already
    due: the CPU cannot keep up with the timer, and latencies then measure its backlog.
    """
    return (
        latencies.group_by("phase", "kind")
        .agg((pl.col("latency_ns").median() / 1000).round(1).alias("median_us"))
        .filter(pl.col("median_us") > interval_us)
        .sort("kind", pl.col("phase").replace({"before": "0", "after": "1"}))
    )


def idle_after_guest(runs: list[RunRecord]) -> str | None:
    """Which power-down idle states the guest CPUs entered between the guest's end and the
    last after-phase run's start (RunRecord.idle_since_guest); None: not recorded.

    A power-down state may lose a CPU's TLB contents, so state the guest left in its CPU
    could be gone before the after runs measure; WFI alone powers nothing down.
    """
    recorded = [r for r in runs if r.phase == "after" and r.idle_since_guest is not None]
    if not recorded:
        return None
    last = recorded[-1]
    counts = last.idle_since_guest or {}
    took = "" if last.since_guest_ns is None else f"{last.since_guest_ns / 1e9:.0f} s, "
    until = f"({took}to {last.run_id}'s start)"
    none = sorted(k.split("/")[0] for k, n in counts.items() if k.endswith(f"/{NO_CPUIDLE}"))
    entered = {k: n for k, n in counts.items() if not k.endswith(f"/{NO_CPUIDLE}") and n}
    unused = sorted(k for k, n in counts.items() if not k.endswith(f"/{NO_CPUIDLE}") and not n)
    parts = []
    if none:
        parts.append(f"{', '.join(none)} WFI only, no power-down cpuidle state")
    if entered:
        said = ", ".join(f"{k} x{n}" for k, n in sorted(entered.items()))
        parts.append(
            f"entered {said}: a power-down state may lose the CPU's TLB contents, so the"
            " after runs may measure without what the guest left"
        )
    if unused:
        parts.append(f"never entered {', '.join(unused)}")
    return f"guest CPUs' idle after the guest {until}: " + "; ".join(parts or ["none recorded"])
