"""Where a simulated model's injected delays landed, beside what the model intended.

Thin: tracekit/simulate/landed.py computes it from the plugin's log (groundtruth/ of a
simulated bundle: the whole boot's, so bundles of one boot share it and it is shown
once) and the bundle's probe slots against its ground truth. A bundle that was not
simulated takes no part; none simulated: None.
"""

from __future__ import annotations

from tracekit.analysis.conditions import simulated_label
from tracekit.ingest.bundle import BundleData
from tracekit.ingest.probe import probe_samples
from tracekit.report.header import bundle_label
from tracekit.report.model import Section, Table
from tracekit.simulate.expected import paying_windows
from tracekit.simulate.landed import landed_line, landed_table, probe_accounts
from tracekit.simulate.model import Model
from tracekit.simulate.simlog import SimLog
from tracekit.vhost.runner import GT_BUNDLE_DIR

TABLE_NOTE = (
    "the plugin's totals over the whole boot (every bundle of it): asked is the model's"
    " intent, took what the busy waits really lasted; held up is how much of that vCPU's"
    " own TLBI -> DSB spans overlapped another vCPU's delay (multi-threaded TCG runs a"
    " broadcast's flush in an exclusive section, which waits for a busy wait to end)"
)
PROBE_UNKNOWN = (
    "a probe's increase beyond the model's intent and the held-up time is this machine's"
    " (host load, busy-wait overrun): emulated timings, not the model's"
)


def section(bundles: list[BundleData]) -> Section | None:
    """Per boot: asked, took and held up per vCPU; per bundle: its probes' accounts."""
    simulated = [b for b in bundles if simulated_label(b.manifest) != "none"]
    if not simulated:
        return None
    findings: list[str] = []
    tables: list[Table] = []
    unknowns: list[str] = []
    shown: set[str] = set()
    checked: set[tuple[str, ...]] = set()
    for data in simulated:
        label = bundle_label(data)
        simulation = data.simulation()
        if simulation is None:
            unknowns.append(
                f"{label}: no simulation log in {GT_BUNDLE_DIR}/ (QEMU's exit left none)"
            )
            continue
        if simulation.text not in shown:
            shown.add(simulation.text)
            log = simulation.log
            findings.append(f"{label}: {log.model}: {landed_line(log)}")
            tables.append(
                Table(f"{label}: where the delays landed, per vCPU", landed_table(log), TABLE_NOTE)
            )
        # Once per boot too, but by what it found: a bundle whose files were copied apart
        # (another boot's iomem, say) says its own.
        lines = simulation.entry.lines() if simulation.entry is not None else []
        if lines and (simulation.text, *lines) not in checked:
            checked.add((simulation.text, *lines))
            findings += [f"{label}: {line}" for line in lines]
        findings += _probe_findings(data, label, simulation.log, simulation.model)
    return Section(
        key="simulated",
        title="Simulated effect: where the injected delays landed",
        findings=findings,
        tables=tables,
        unknowns=[*unknowns, PROBE_UNKNOWN],
        lost_events=None,
    )


def _probe_findings(data: BundleData, label: str, log: SimLog, model: Model | None) -> list[str]:
    """One line per probe CPU whose after slot paid anything (intent > 0; the cost of
    dose 1, so a dose model's larger doses show as rest)."""
    found = data.ground_truth() if model is not None else None
    if found is None or model is None:
        return []
    windows = paying_windows(log.events, len(log.vcpus), model.where == "every")
    accounts = probe_accounts(probe_samples(data), found[1], model.cost_ns(1), windows)
    return [
        f"{label}: probe on CPU {cpu} ({mode}): {account.line()}"
        for cpu, mode, account in accounts
        if account.intended_ns > 0
    ]
