"""Guest broadcast TLBIs: the rt CPU's wake-ups and the probe cost per CPU during a guest.

Thin: numbers come from tracekit/analysis/broadcast.py. A bundle counts when it has a
"during" phase (the guest-broadcast scenario). The comparisons' ratios are phase/before:
"during/before" is the load, "after/before" the control that it stops with the guest.
"""

from __future__ import annotations

from dataclasses import replace

from tracekit.analysis import broadcast as bc
from tracekit.analysis.compare import Comparison
from tracekit.cpus import format_cpu_list
from tracekit.ingest.bundle import BundleData
from tracekit.ingest.probe import probe_samples
from tracekit.report.header import bundle_label, is_emulated
from tracekit.report.model import Section, Table
from tracekit.report.sections.tlbi import PROBE_NOTE

RATIO_NOTE = (
    "ratios are phase/before: during/before is the load of the guest's broadcast TLBIs, "
    "after/before the control (the load should stop with the guest)"
)


def section(bundles: list[BundleData]) -> Section | None:
    """During vs before (and after vs before) per bundle with a during phase."""
    chosen = [b for b in bundles if bc.has_during([r.phase for r in b.manifest.runs])]
    if not chosen:
        return None
    many = len(chosen) > 1
    findings = [RATIO_NOTE]
    comparisons: list[Comparison] = []
    tables: list[Table] = []
    unknowns: list[str] = []
    for data in chosen:
        prefix = f"{bundle_label(data)}: " if many else ""
        found, more, missing = _bundle(data, prefix)
        comparisons += found
        tables += more
        unknowns += missing
    if any(is_emulated(b) for b in chosen):
        findings.append("emulated host: QEMU TCG timings, not hardware timings")
    return Section(
        key="broadcast",
        title="Guest broadcast TLBIs: the host during a TLBI-loop guest",
        findings=findings,
        comparisons=comparisons,
        tables=tables,
        unknowns=unknowns,
    )


def _bundle(data: BundleData, prefix: str) -> tuple[list[Comparison], list[Table], list[str]]:
    """One bundle's comparisons (during, then after, each against before) and tables."""
    comparisons: list[Comparison] = []
    unknowns: list[str] = []
    phases = set(data.latencies["phase"].to_list())
    for phase in ("during", "after"):
        if {"before", phase} <= phases:
            found = bc.latency_comparisons(data.latencies, phase)
            comparisons += [replace(c, metric=prefix + c.metric) for c in found]
        else:
            unknowns.append(f"{prefix}cyclictest {phase}/before: no quiet runs in both phases")
    samples = probe_samples(data)
    tables: list[Table] = []
    if samples.height:
        for phase in ("during", "after"):
            found = bc.probe_comparisons(samples, phase)
            comparisons += [replace(c, metric=prefix + c.metric) for c in found]
        guest = [int(c) for c in data.manifest.options.get("guest_cpus") or []]
        unprobed = bc.unprobed_guest_cpus(samples, guest)
        said = f"; guest CPU {format_cpu_list(unprobed)}: no slot during the guest (the guest"
        tables.append(
            Table(
                f"{prefix}probe cost per CPU and phase (us)",
                bc.probe_by_phase(samples),
                note=PROBE_NOTE + (f"{said} runs there)" if unprobed else ""),
            )
        )
    else:
        unknowns.append(f"{prefix}probe cost per CPU: no probe slots in the bundle")
    return comparisons, tables, unknowns
