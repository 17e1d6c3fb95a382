"""The teardown fix's cost (vm-churn bundles): per-VM time and rt latency, fix off vs on.

Thin: every number, grouping and comparison comes from tracekit/analysis/churn.py; this
reads each churn run's recorded facts from its bundle and draws the tables and plots.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.analysis import churn as ch
from tracekit.analysis.compare import runs_needed
from tracekit.bundle import RunFile, RunKind
from tracekit.ingest.bundle import BundleData
from tracekit.report.header import bundle_condition_of, bundle_label, is_emulated
from tracekit.report.model import Plot, Section, Table

EMULATED_NOTE = (
    "EMULATED host: per-VM times and latencies are QEMU TCG times, not hardware times; "
    "compare the states with each other, never with the brief's 32.1 vs 33.4 ms or 15 vs 13 us; "
    "under TCG a broadcast TLBI flushes every vCPU's softmmu TLB and runs as safe work, "
    "with every vCPU (the rt CPU's too) out of its execution loop (accel/tcg/cputlb.c: "
    "tlb_flush_*_all_cpus_synced, async_safe_run_on_cpu), costs unrelated to the "
    "hardware's, so the emulated A/B says nothing about the fix's hardware cost, not even "
    "its sign, and its rt latencies get no state ratio"
)
BRIEF_NOTE = (
    "the brief's hardware figures: 500 VMs, 32.1 ms each with the fix, 33.4 ms without; "
    "isolated-CPU latency meanwhile 15 us vs 13 us; its VMM, guest and RAM size are not "
    "known to be this one's, so not even the scale transfers"
)


def section(bundles: list[BundleData]) -> Section | None:
    """Per condition and switch state: per-VM time and its phases, ms each, the rt CPU's
    latency and its coverage; each state against off, alle1is against last-ran."""
    churns, unknowns = _churns(bundles)
    if not churns and not unknowns:
        return None
    result = ch.churn_result(churns)
    findings: list[str] = list(result.notes)
    tables, plots = [], []
    for group in result.groups:
        prefix = f"{group.label}: " if group.label else ""
        findings += [prefix + c.statement() for c in group.comparisons]
        findings += [prefix + note for note in group.notes]
        title = f" ({group.label})" if group.label else ""
        tables.append(
            Table(f"vm-churn per teardown_flush state{title}", ch.summary_frame(group.states))
        )
        if group.comparisons:
            tables.append(_comparison_table(group.comparisons, title))
        plots.append(_plot(group.points, title))
    findings += ch.shared_boots(ch.churn_boots(churns))
    unknowns += result.left_out
    unknowns += [text for group in result.groups if (text := ch.no_verdict(group))]
    kernels: dict[str, set[str]] = {}
    for c in churns:
        kernels.setdefault(c.state, set()).add(c.release)
    if kernels:
        findings.append(
            "kernels: "
            + "; ".join(f"{state} {', '.join(sorted(k))}" for state, k in kernels.items())
        )
    findings.append(
        "per-VM time: the VMM's create start to teardown end, and its phases (create, run, "
        "teardown); the first VM of each churn is left out of the distributions (one-time "
        "costs: first_vm_ms); ms each: the whole churn's span / its VMs; the boot is the "
        "unit of every interval"
    )
    findings.append(BRIEF_NOTE)
    if any(is_emulated(b) for b in bundles):
        findings.insert(0, EMULATED_NOTE)
    return Section(
        key="churn",
        title="VM churn: the teardown fix's cost",
        findings=findings,
        tables=tables,
        plots=plots,
        unknowns=unknowns,
        contradictions=result.contradictions,
    )


def _churns(bundles: list[BundleData]) -> tuple[list[ch.Churn], list[str]]:
    """Each churn run as the analysis takes it (what its bundle recorded); the runs that
    recorded no VM."""
    churns: list[ch.Churn] = []
    unknowns: list[str] = []
    for data in bundles:
        host = data.manifest.host
        state = ch.switch_state(host.get("kpatch"))
        condition = bundle_condition_of(data)
        params = data.manifest.scenario.get("parameters") or {}
        for run in data.manifest.runs:
            if run.kind != RunKind.CHURN:
                continue
            found = data.run(run)
            label = f"{bundle_label(data)}: {run.run_id}"
            if found.vmm is None or found.vmm.vms.is_empty():
                unknowns.append(f"{label}: no VM recorded")
                continue
            samples = found.cyclictest
            if samples is None:
                unknowns.append(f"{label}: no cyclictest sample")
            churns.append(
                ch.Churn(
                    label=label,
                    state=state,
                    condition=condition,
                    vms=ch.per_vm(found.vmm.vms),
                    samples=samples,
                    boot=host.get("boot_id") or None,
                    status=run.status,
                    note=run.note,
                    start_ns=run.start_ns,
                    clock=found.vmm.runs[0].get("clock") or None,  # unsaid: not assumed
                    interval_ns=found.cyclictest_interval_ns,
                    counted=found.cyclictest_counted,
                    vmid_bits=_vmid_bits(host),
                    guest_cpus=tuple(data.manifest.options.get("guest_cpus") or ()),
                    switch=found.extra(RunFile.TEARDOWN_FLUSH),
                    repeat=_int(params.get("repeat")),
                    hold_vm=bool(params.get("hold_vm")),
                )
            )
    return churns, unknowns


def _int(value: Any) -> int | None:
    """An int parameter, or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _vmid_bits(host: dict[str, Any]) -> int | None:
    """The host's VMID width: its facts' (kvmstate), else the debug series' own."""
    bits = host.get("vmid_bits")
    if not isinstance(bits, int):
        bits = (host.get("kpatch") or {}).get("vmid_bits")
    return bits if isinstance(bits, int) else None


def _comparison_table(comparisons: list[ch.StateComparison], title: str) -> Table:
    """One row per comparison."""
    floor = comparisons[0].each.thresholds
    return Table(
        f"each state against teardown_flush {ch.BASELINE} (and alle1is against last-ran){title}",
        ch.comparison_frame(comparisons),
        note=(
            "the boot is the unit: ratios of the geometric means of per-boot values; for ms "
            f"each (the primary metric) a {comparisons[0].confidence:.0%} Welch t interval on "
            "the log per-boot values and an exact rank test, with two boots or more a side; "
            f"verdicts by the project's rule, none below {runs_needed(floor.alpha)}+"
            f"{runs_needed(floor.alpha)} boots; the other metrics' p Holm-adjusted over "
            "the group; detectable_ratio: what these boots detect with 80% power at the "
            "spread seen; rt ratios of the churn's per-period latencies (max always)"
        ),
    )


def _plot(points: pl.DataFrame, title: str) -> Plot:
    """Each VM's create->destroy time, in churn order, one series per state."""
    return Plot(
        f"per-VM time over the churn{title}",
        "xy",
        points,
        x="vm_seq",
        y="vm_ms",
        series="state",
        x_label="VM (churn order, first left out)",
        y_label="create -> destroy (ms, VMM clock)",
    )
