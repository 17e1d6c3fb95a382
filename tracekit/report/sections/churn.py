"""The teardown fix's cost (vm-churn bundles): per-VM time and rt latency, fix off vs on.

Thin: every number comes from tracekit/analysis/churn.py; this groups the bundles' churn
runs by their teardown_flush state and draws the tables and the per-VM plot.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis import churn as ch
from tracekit.bundle import RunKind
from tracekit.ingest.bundle import BundleData
from tracekit.report.header import bundle_label, is_emulated
from tracekit.report.model import Plot, Section, Table

EMULATED_NOTE = (
    "EMULATED host: per-VM times and latencies are QEMU TCG times, not hardware times; "
    "compare the states with each other, never with the brief's 32.1 vs 33.4 ms or 15 vs 13 us"
)
BRIEF_NOTE = (
    "the brief's hardware figures: 500 VMs, 32.1 ms each with the fix, 33.4 ms without; "
    "isolated-CPU latency meanwhile 15 us vs 13 us"
)


def section(bundles: list[BundleData]) -> Section | None:
    """Per switch state: per-VM time distribution, ms each, the rt CPU's latency; vs off."""
    by_state, kernels, unknowns = _churns(bundles)
    if not by_state:
        return None
    result = ch.churn_result(by_state)
    findings = [c.statement() for c in result.comparisons]
    findings += ch.shared_boots(_boots(bundles))
    if ch.BASELINE not in by_state:
        unknowns.append(
            f"no churn with teardown_flush {ch.BASELINE}: nothing to compare the states with"
        )
    findings.append(
        "kernels: " + "; ".join(f"{state} {', '.join(sorted(k))}" for state, k in kernels.items())
    )
    findings.append(
        "per-VM time: the VMM's create start to teardown end; the first VM of each churn is "
        "left out of the distributions (one-time costs: first_vm_ms); ms each: the whole "
        "churn's span / its VMs"
    )
    findings.append(BRIEF_NOTE)
    if any(is_emulated(b) for b in bundles):
        findings.insert(0, EMULATED_NOTE)
    tables = [Table("vm-churn per teardown_flush state", ch.summary_frame(result.states))]
    if result.comparisons:
        tables.append(_comparison_table(result.comparisons))
    return Section(
        key="churn",
        title="VM churn: the teardown fix's cost",
        findings=findings,
        tables=tables,
        plots=[_plot(result.points)],
        unknowns=unknowns,
    )


def _churns(bundles: list[BundleData]) -> tuple[ch.Churns, dict[str, set[str]], list[str]]:
    """Each churn run's per-VM table and cyclictest samples, by switch state; kernels."""
    by_state: ch.Churns = {}
    kernels: dict[str, set[str]] = {}
    unknowns: list[str] = []
    for data in bundles:
        state = ch.switch_state(data.manifest.host.get("kpatch"))
        for run in data.manifest.runs:
            if run.kind != RunKind.CHURN:
                continue
            found = data.run(run)
            if found.vmm is None or found.vmm.vms.is_empty():
                unknowns.append(f"{bundle_label(data)}: {run.run_id}: no VM recorded")
                continue
            samples = found.cyclictest
            if samples is None:
                unknowns.append(f"{bundle_label(data)}: {run.run_id}: no cyclictest sample")
            by_state.setdefault(state, []).append((ch.per_vm(found.vmm.vms), samples))
            release = str(data.manifest.host.get("kernel_release") or "kernel ?")
            kernels.setdefault(state, set()).add(release)
    return by_state, kernels, unknowns


def _boots(bundles: list[BundleData]) -> dict[str, set[str | None]]:
    """The boots (host.boot_id, None if unrecorded) of each state's churn bundles."""
    boots: dict[str, set[str | None]] = {}
    for data in bundles:
        if any(run.kind == RunKind.CHURN for run in data.manifest.runs):
            state = ch.switch_state(data.manifest.host.get("kpatch"))
            boots.setdefault(state, set()).add(data.manifest.host.get("boot_id") or None)
    return boots


def _comparison_table(comparisons: list[ch.StateComparison]) -> Table:
    """One row per state compared with off."""
    frame = pl.DataFrame(
        [
            {
                "teardown_flush": c.state,
                "vm_mean_ratio": c.mean_ratio,
                "ci_low": c.ci_low,
                "ci_high": c.ci_high,
                "median_diff_ms": c.median_diff_ms,
                "each_ratio": c.each_ratio,
                "rt_max_ratio": c.latency_max_ratio,
                "rt_p99_ratio": c.latency_p99_ratio,
            }
            for c in comparisons
        ]
    ).with_columns(pl.col(pl.Float64).round(3))
    return Table(
        f"each state against teardown_flush {ch.BASELINE}",
        frame,
        note=f"{comparisons[0].confidence:.0%} percentile bootstrap over VMs of the mean ratio",
    )


def _plot(points: pl.DataFrame) -> Plot:
    """Each VM's create->destroy time, in churn order, one series per state."""
    return Plot(
        "per-VM time over the churn",
        "xy",
        points,
        x="vm_seq",
        y="vm_ms",
        series="state",
        x_label="VM (churn order, first left out)",
        y_label="create -> destroy (ms, VMM clock)",
    )
