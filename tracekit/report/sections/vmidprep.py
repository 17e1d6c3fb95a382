"""Bundles whose guest was given a VMID (collect --vmid): the throwaway VMs that did it.

Those VMs ran before the before phase, so that phase is not a fresh host's: it is the
cell's own baseline, and the report says so. The numbers come from
tracekit.analysis.factorial.vmid_prep.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis.factorial import VmidPrep, vmid_prep
from tracekit.bundle import RunFile, RunKind
from tracekit.ingest.bundle import BundleData
from tracekit.report.header import bundle_label
from tracekit.report.model import Section, Table

BASELINE = (
    "the guest's VMID was chosen by running VMID-1 throwaway MMU-off VMs on the guest CPUs"
    " before the before phase: that phase is each such bundle's own baseline, not a fresh"
    " host's, and a VMID factor carries those VMs with it. On 6.1 in nVHE (non-protected)"
    " mode, creating a VM while none exists re-initialises KVM's EL2 on every CPU and"
    " destroying the last one resets it (hardware_enable_all/hardware_disable_all), so each"
    " throwaway VM did so"
)


def section(bundles: list[BundleData]) -> Section | None:
    """Per bundle with a vmid-prep run: the VMID asked, VMs run, VMIDs seen; None if none."""
    found = [(b, p) for b in bundles if (p := _prep(b)) is not None]
    if not found:
        return None
    frame = pl.DataFrame(
        {
            "bundle": [bundle_label(b) for b, _ in found],
            "vmid": [p.vmid for _, p in found],
            "throwaway VMs": [p.vms for _, p in found],
            "VMIDs seen": [_seen(p) for _, p in found],
            "as planned": [_planned(p) for _, p in found],
        }
    )
    unknowns = [
        f"{bundle_label(b)}: which VMIDs the throwaway VMs got ({p.why_unread})"
        for b, p in found
        if p.seen is None and p.vms
    ]
    unknowns += [
        f"{bundle_label(b)}: the throwaway VMs did not take VMIDs 1..{p.vmid - 1}, so the"
        f" guest's VMID is not {p.vmid}"
        for b, p in found
        if p.as_planned is False
    ]
    return Section(
        key="vmidprep",
        title="The guest's VMID (collect --vmid): throwaway VMs before the before phase",
        findings=[BASELINE],
        tables=[Table("VMIDs asked and the throwaway VMs that gave them", frame)],
        unknowns=unknowns,
    )


def _prep(data: BundleData) -> VmidPrep | None:
    """The bundle's vmid-prep run, read."""
    for run in data.manifest.runs:
        if run.kind == RunKind.VMID_PREP:
            return vmid_prep(data.run(run).extra(RunFile.VMID_PREP))
    return None


def _seen(p: VmidPrep) -> str:
    """The VMIDs seen, as a range when they are one."""
    if p.seen is None:
        return "unread"
    if not p.seen:
        return "-"
    return (
        f"{p.seen[0]}-{p.seen[-1]}"
        if p.seen == tuple(range(p.seen[0], p.seen[-1] + 1))
        else ",".join(map(str, p.seen))
    )


def _planned(p: VmidPrep) -> str:
    """yes / NO / unknown."""
    return {True: "yes", False: "NO", None: "unknown"}[p.as_planned]
