"""The teardown fix's cost: per-VM time and the rt CPU's latency of a vm-churn, by switch state.

The brief's figures: 500 VMs created, run and torn down one after another took 32.1 ms
each with the fix and 33.4 ms without, and the isolated CPU's latency meanwhile was 15 us
against 13 us. Here each state of reproducer/kpatch's `teardown_flush` (off, alle1is,
last-ran; a kernel without the series is its own state) is one or more vm-churn bundles.

- Per-VM time is the VMM's own: `teardown_end_ns - create_start_ns` of its `record=vm`
  line (KVM_CREATE_VM to the last munmap after the VM's fd closed), one clock
  (CLOCK_BOOTTIME). `each_ms` is the brief's measure: the whole churn (first create to
  last teardown end, gaps between VMs included) divided by its VMs.
- The distributions leave out the first VM of each VMM invocation (one-time costs, as
  analysis/teardown.steady_state) and VMs that did not run to power-off.
- The rt CPU's latency is cyclictest's per-loop samples over the churn (the run starts
  it a second before the first VM and stops it after the last).
- A state is compared with `off` (the stock teardown) by the ratio of mean per-VM times,
  with a percentile bootstrap over VMs (compare.bootstrap_ratio_ci), and the
  difference of medians; latency by the ratio of maxima and of 99th percentiles (one
  churn per state gives no spread for those: stated, never an interval).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis.compare import DEFAULT_THRESHOLDS, Thresholds, bootstrap_ratio_ci
from tracekit.analysis.teardown import steady_state
from tracekit.errors import TracekitError

BASELINE = "off"
# A kernel without the debug series: the unpatched twin (or any stock kernel).
NO_SERIES = "no debug series"
LATENCY_QUANTILE = 0.99


def switch_state(kpatch: Any) -> str:
    """The bundle's teardown_flush state from its host fact `kpatch` (preflight's record)."""
    if not isinstance(kpatch, dict):
        return NO_SERIES
    return str(kpatch.get("teardown_flush") or "unknown")


def per_vm(vms: pl.DataFrame) -> pl.DataFrame:
    """One row per VM of a churn: its create->destroy time and its phases, in ns."""
    if vms.is_empty():
        raise TracekitError("the churn's VMM output holds no VM: nothing to time")
    return vms.select(
        "batch",
        "vm",
        "result",
        "create_start_ns",
        "teardown_end_ns",
        (pl.col("teardown_end_ns") - pl.col("create_start_ns")).alias("total_ns"),
        "create_ns",
        "run_ns",
        "teardown_ns",
    )


@dataclass(frozen=True)
class Distribution:
    """A set of per-VM times in ms: how many, median, 10th/90th percentiles, mean."""

    n: int
    median: float
    p10: float
    p90: float
    mean: float

    @classmethod
    def of(cls, values_ns: np.ndarray) -> Distribution:
        """The distribution of nanosecond values, in ms."""
        ms = values_ns / 1e6
        p10, median, p90 = np.percentile(ms, [10, 50, 90])
        return cls(len(ms), float(median), float(p10), float(p90), float(ms.mean()))


@dataclass(frozen=True)
class Latency:
    """The rt CPU's cyclictest samples over the churn, in us."""

    samples: int
    median: float
    p99: float
    max: float

    @classmethod
    def of(cls, latency_ns: np.ndarray) -> Latency | None:
        """The summary of per-loop latencies (None: no sample)."""
        if len(latency_ns) == 0:
            return None
        us = latency_ns / 1e3
        median, p99 = np.percentile(us, [50, LATENCY_QUANTILE * 100])
        return cls(len(us), float(median), float(p99), float(us.max()))


@dataclass(frozen=True)
class StateSummary:
    """One switch state's churns: VMs, per-VM time and phases, each_ms, the rt latency."""

    state: str
    churns: int
    vms: int  # every VM recorded
    failed: int  # VMs that did not run to power-off (error, stopped)
    total: Distribution  # create->destroy, steady state
    teardown: Distribution  # the teardown phase alone (closing the fds, unmapping RAM)
    each_ms: float  # whole churns' span / VMs (the brief's "ms each")
    latency: Latency | None
    first_vm_ms: float  # the first VM of the first churn (left out of the distributions)


def summarize(state: str, churns: list[tuple[pl.DataFrame, pl.DataFrame | None]]) -> StateSummary:
    """One state's summary from its churns: (per_vm table, cyclictest samples or None)."""
    tables = [table for table, _ in churns]
    steady = pl.concat([steady_state(t) for t in tables])
    if steady.is_empty():
        raise TracekitError(
            f"teardown_flush {state}: no VM after the first ran to power-off; run the churn "
            "with --repeat 2 or more"
        )
    span = sum(int(t["teardown_end_ns"].max() - t["create_start_ns"].min()) for t in tables)
    count = sum(t.height for t in tables)
    samples = [s["latency_ns"].to_numpy() for _, s in churns if s is not None]
    return StateSummary(
        state=state,
        churns=len(churns),
        vms=count,
        failed=sum(t.filter(pl.col("result") != "ok").height for t in tables),
        total=Distribution.of(steady["total_ns"].to_numpy()),
        teardown=Distribution.of(steady["teardown_ns"].to_numpy()),
        each_ms=span / count / 1e6,
        latency=Latency.of(np.concatenate(samples)) if samples else None,
        first_vm_ms=float(tables[0]["total_ns"][0]) / 1e6,
    )


@dataclass(frozen=True)
class StateComparison:
    """A state against `off`: per-VM time ratio with its interval, latency ratios."""

    state: str
    mean_ratio: float
    ci_low: float  # NaN: too few VMs for an interval
    ci_high: float
    median_diff_ms: float
    each_ratio: float
    latency_max_ratio: float | None
    latency_p99_ratio: float | None
    confidence: float

    def statement(self) -> str:
        """The comparison as one sentence of the report."""
        interval = (
            f" ({self.confidence:.0%} CI {self.ci_low:.3f}-{self.ci_high:.3f})"
            if not np.isnan(self.ci_low)
            else " (too few VMs for an interval)"
        )
        text = (
            f"teardown_flush {self.state} vs {BASELINE}: per-VM time x{self.mean_ratio:.3f}"
            f"{interval}, median {self.median_diff_ms:+.2f} ms, ms each x{self.each_ratio:.3f}"
        )
        if self.latency_max_ratio is not None:
            text += (
                f"; rt CPU latency max x{self.latency_max_ratio:.2f}, "
                f"p99 x{self.latency_p99_ratio:.2f} (one churn each: no interval)"
            )
        return text


def compare_with_off(
    base: StateSummary,
    base_vms: np.ndarray,
    other: StateSummary,
    other_vms: np.ndarray,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> StateComparison:
    """`other` against the baseline: ratio of mean per-VM times (bootstrap over VMs)."""
    low, high = bootstrap_ratio_ci(base_vms, other_vms, thresholds)
    max_ratio = p99_ratio = None
    if base.latency is not None and other.latency is not None:
        max_ratio = other.latency.max / base.latency.max
        p99_ratio = other.latency.p99 / base.latency.p99
    return StateComparison(
        state=other.state,
        mean_ratio=other.total.mean / base.total.mean,
        ci_low=low,
        ci_high=high,
        median_diff_ms=other.total.median - base.total.median,
        each_ratio=other.each_ms / base.each_ms,
        latency_max_ratio=max_ratio,
        latency_p99_ratio=p99_ratio,
        confidence=thresholds.confidence,
    )


@dataclass(frozen=True)
class ChurnResult:
    """Every state's summary, and each state compared with `off` where both exist."""

    states: list[StateSummary]
    comparisons: list[StateComparison]
    # Per-VM times (steady state) with their state, for the distribution plot.
    points: pl.DataFrame


Churns = dict[str, list[tuple[pl.DataFrame, pl.DataFrame | None]]]


def churn_result(by_state: Churns) -> ChurnResult:
    """Summaries per state (off first), comparisons with off, the per-VM points."""
    order = sorted(by_state, key=lambda s: (s != BASELINE, s))
    states = [summarize(state, by_state[state]) for state in order]
    steady = {
        state: pl.concat([steady_state(table) for table, _ in by_state[state]]) for state in order
    }
    comparisons = []
    if BASELINE in by_state:
        base = states[0]
        for summary in states[1:]:
            comparisons.append(
                compare_with_off(
                    base,
                    steady[BASELINE]["total_ns"].to_numpy().astype(float),
                    summary,
                    steady[summary.state]["total_ns"].to_numpy().astype(float),
                )
            )
    points = pl.concat(
        [
            frame.select(
                pl.lit(state).alias("state"),
                pl.int_range(pl.len(), dtype=pl.Int32).alias("vm_seq"),
                (pl.col("total_ns") / 1e6).alias("vm_ms"),
            )
            for state, frame in steady.items()
        ]
    )
    return ChurnResult(states, comparisons, points)


def shared_boots(boots: dict[str, set[str | None]]) -> list[str]:
    """One sentence per boot that churned more than one state (host.boot_id), and one for
    states whose bundles do not record their boot: the comparison asks a fresh boot per
    state, since what one churn leaves may weigh on the next."""
    by_boot: dict[str, list[str]] = {}
    unrecorded = sorted(state for state, ids in boots.items() if None in ids)
    for state, ids in boots.items():
        for boot in ids - {None}:
            by_boot.setdefault(boot, []).append(state)
    notes = [
        f"teardown_flush {', '.join(states)} were churned in one boot ({boot[:8]}): not a "
        "fresh boot each, so an order effect is not excluded"
        for boot, states in by_boot.items()
        if len(states) > 1
    ]
    if unrecorded:
        notes.append(
            f"teardown_flush {', '.join(unrecorded)}: bundles without host.boot_id, so "
            "whether each state had a fresh boot is unknown"
        )
    return notes


def summary_frame(states: list[StateSummary]) -> pl.DataFrame:
    """One row per state: VMs, per-VM time, teardown, ms each, the rt CPU's latency."""
    rows = []
    for s in states:
        latency = s.latency
        rows.append(
            {
                "teardown_flush": s.state,
                "churns": s.churns,
                "vms": s.vms,
                "failed": s.failed,
                "vm_median_ms": s.total.median,
                "vm_p10_ms": s.total.p10,
                "vm_p90_ms": s.total.p90,
                "vm_mean_ms": s.total.mean,
                "teardown_median_ms": s.teardown.median,
                "each_ms": s.each_ms,
                "first_vm_ms": s.first_vm_ms,
                "rt_samples": latency.samples if latency else None,
                "rt_median_us": latency.median if latency else None,
                "rt_p99_us": latency.p99 if latency else None,
                "rt_max_us": latency.max if latency else None,
            }
        )
    return pl.DataFrame(rows).with_columns(pl.col(pl.Float64).round(2))
