"""Emulated ground truth: the invalidations QEMU saw each CPU execute, against what KVM
should run (signatures as data), and the kprobes named after a path checked by it.

Thin: tracekit/analysis/groundtruth.py computes it all. A step that contradicts its
signature goes into the report's lead (Section.contradictions), not only here. A bundle
without ground truth says so: a board has none.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis import groundtruth as gt
from tracekit.analysis import gtvmid, vm
from tracekit.analysis.calls import misses_over_runs, pair_calls
from tracekit.analysis.conditions import bundle_condition
from tracekit.analysis.gtsignatures import REQUIRE_FIELDS, kernel_series, packaged_signatures
from tracekit.bundle import PROBE_GROUP, RunKind
from tracekit.cpus import parse_cpu_list
from tracekit.ingest.bundle import BundleData
from tracekit.ingest.gtalign import ClockFit
from tracekit.report.header import bundle_label, is_emulated, kvm_mode
from tracekit.report.model import Section, Table
from tracekit.report.sections.vmruns import open_vm_run

EMULATED_TRUTH = (
    "emulated ground truth from a QEMU TCG plugin: what the emulated CPUs executed, not hardware"
)
NO_VMID = (
    "the VMID each EL2 invalidation acted on is never read (QEMU 7.2's plugin API reads no "
    "registers): the vmid column is inferred from the host trace (the VM whose vCPU was on "
    "that CPU, its kvm_arm_vmid_update readings) or stated by the source, each row saying "
    "which (vmid_basis), and null wherever neither tells"
)


def section(bundles: list[BundleData]) -> Section | None:
    """Per bundle: counts by phase, instruction and step; signature checks; probe checks."""
    findings, tables, unknowns, contradictions = [], [], [], []
    for data in bundles:
        label = bundle_label(data)
        found = data.ground_truth()
        if found is None:
            findings.append(f"{label}: no ground truth ({_why_none(data)})")
            continue
        truth, given = found
        summary = bundle_summary(data, given)
        # notes()[0] is the emulated-ground-truth line, said once for the section.
        findings += [f"{label}: {note}" for note in truth.notes()[1:]]
        findings += [f"{label}: signature {line}" for line in summary.signature_lines]
        if summary.repeat_line is not None:
            findings.append(f"{label}: {summary.repeat_line}")
        contradictions += [f"{label}: {line}" for line in summary.findings]
        if summary.findings:
            findings.append(
                f"{label}: {len(summary.findings)} contradiction(s) of the signatures, stated "
                "in the report's lead"
            )
        elif not summary.checks.is_empty():
            findings.append(f"{label}: every checked step executed what its signature says")
        tables += _tables(label, summary)
        if summary.vmids is not None and not summary.vmids.is_empty():
            findings.append(f"{label}: {gtvmid.margin_line(_fit(data))}")
        unknowns += [
            f"{label}: the {step} step is not checked against a signature (none for this "
            "kernel and KVM mode, the bundle is outside its conditions, or it needs CPUs "
            "the bundle does not name): what it executed is shown, not checked"
            for step in summary.uncovered
        ]
        findings += [
            f"{label}: probe {r['probe']}: {r['verdict']}"
            for r in summary.probes.iter_rows(named=True)
        ]
    return Section(
        key="groundtruth",
        title="Ground truth (emulated, QEMU TCG plugin): the invalidations each CPU executed",
        findings=[EMULATED_TRUTH, *findings],
        tables=tables,
        unknowns=[*unknowns, NO_VMID] if tables else unknowns,
        contradictions=contradictions,
    )


def _why_none(data: BundleData) -> str:
    """Why a bundle has no ground truth."""
    if not is_emulated(data):
        return "collected on a board: only the emulated host's QEMU plugin records it"
    return "emulated, but collected without `tracekit vhost run --ground-truth`"


def bundle_summary(data: BundleData, given: pl.DataFrame) -> gt.GroundTruthSummary:
    """The analysis of one bundle's ground truth, its steps and probes from its runs."""
    manifest = data.manifest
    options, host = manifest.options, manifest.host
    action = str(options.get("after_guest", "none"))
    guest = tuple(int(c) for c in options.get("guest_cpus") or [])
    online = (
        tuple(parse_cpu_list(str(host.get("online_cpus", "")))) if host.get("online_cpus") else ()
    )
    context = gt.StepContext(online, guest, target_cpus(manifest.scenario, action, guest))
    hits = dict.fromkeys(gt.entry_probes(manifest.scenario.get("kprobes") or []), 0)
    traced: list[str] = []
    windows: dict[str, list[pl.DataFrame]] = {}
    recorded = []  # the traced runs' kprobe misses
    for run in manifest.runs:
        found = data.run(run)
        trace = found.trace if hits else None
        if trace is not None:
            traced.append(run.run_id)
            recorded.append(run.probe_misses)
            for name, count in _probe_counts(trace.events).items():
                if name in hits:
                    hits[name] += count
            for name, calls in _probe_calls(trace.events, hits).items():
                windows.setdefault(name, []).append(calls)
    frame = bundle_steps(data)
    setup = (
        kernel_series(str(host.get("kernel_release", "?"))),
        kvm_mode(data).rstrip("?"),
        gt.signature_model(host.get("cpus") or [{}], guest),
    )
    calls = {name: pl.concat(found) for name, found in windows.items()}
    condition = bundle_condition(manifest)
    facts = {n: getattr(condition, n) for n in REQUIRE_FIELDS if hasattr(condition, n)}
    signatures = packaged_signatures()
    inputs = vmid_inputs(data)
    misses = {name: misses_over_runs(recorded, name) for name in hits}
    return gt.summarise(
        given, frame, signatures, setup, context, hits, traced, calls, facts, inputs, misses
    )


def bundle_steps(data: BundleData) -> pl.DataFrame:
    """Each VM's create, run and teardown windows (the VMM's) and the after-guest
    action's run window (analysis.groundtruth.STEP_SCHEMA)."""
    action = str(data.manifest.options.get("after_guest", "none"))
    steps = [pl.DataFrame(schema=gt.STEP_SCHEMA)]
    for run in data.manifest.runs:
        vmm = data.run(run).vmm
        if vmm is not None and vmm.vms.height:
            steps.append(gt.vm_steps(vmm.vms, run.run_id))
        if run.kind == RunKind.AFTER_GUEST and run.start_ns is not None and run.end_ns is not None:
            steps.append(gt.action_step(run.run_id, action, run.start_ns, run.end_ns))
    return pl.concat(steps)


def _fit(data: BundleData) -> ClockFit | None:
    """The bundle's clock fit (None without ground truth)."""
    found = data.ground_truth()
    return found[0].fit if found is not None else None


def vmid_inputs(data: BundleData) -> gtvmid.VmidInputs:
    """The traced VMM runs' vCPU spans and kvm_arm_vmid_update readings (gtvmid), the
    clock fit's bound, the traced runs whose VMM wrote no markers and the after-guest
    actions' VMID requests (their el2-maint.txt)."""
    fit = _fit(data)
    margin_ns = fit.bound_ns if fit is not None else gtvmid.MARGIN_CEILING_NS
    spans, found, bits, unmarked = [], [], {}, set()
    asked = [gtvmid.VmidInputs().requests]
    for run in data.manifest.runs:
        maint = data.run(run).maint
        if maint is not None:
            asked.append(gtvmid.requests(run.run_id, maint))
        vmm = data.run(run).vmm
        if vmm is None or data.run(run).trace is None:
            continue
        opened = open_vm_run(data, run, vmm, run.run_id)
        if opened.windows is None or opened.threads is None:
            unmarked.add(run.run_id)
            continue
        spans.append(gtvmid.vcpu_spans(run.run_id, opened.windows, opened.threads))
        for event, at in ((vm.VMID_EVENT, "entry"), (vm.VMID_RETURN_EVENT, "return")):
            rows = opened.event(event)
            if rows is not None and "vmid_id" in rows.columns:
                found.append(gtvmid.readings(run.run_id, opened.give_to_vms(rows), at))
        updates = vm.vmid_readings(opened.event(vm.VMID_EVENT), opened.event(vm.VMID_RETURN_EVENT))
        width = vm.vmid_width(updates, data.run(run).vmid_bits) if updates is not None else None
        if width is not None:
            bits[run.run_id] = width
    empty = gtvmid.VmidInputs()
    return gtvmid.VmidInputs(
        pl.concat(spans) if spans else empty.spans,
        pl.concat(found) if found else empty.readings,
        bits,
        margin_ns,
        frozenset(unmarked),
        pl.concat(asked),
    )


def _probe_calls(events: pl.DataFrame, names: dict[str, int]) -> dict[str, pl.DataFrame]:
    """Each named probe's calls in one trace (pair_calls of NAME and NAME_ret)."""
    ours = events.filter(pl.col("system") == PROBE_GROUP).with_columns(
        pl.col("event").cast(pl.String)
    )
    found = {}
    for name in names:
        entries = ours.filter(pl.col("event") == name)
        if entries.height:
            found[name] = pair_calls(entries, ours.filter(pl.col("event") == f"{name}_ret"))[0]
    return found


def target_cpus(scenario: dict, action: str, guest: tuple[int, ...]) -> tuple[int, ...]:
    """The after-guest action's CPUs as the manifest records them; bundles from before
    that record them: the guest's for hotplug, none (unknown) for anything else."""
    recorded = scenario.get("action_cpus")
    if recorded is not None:
        return tuple(int(c) for c in recorded)
    return guest if action == "hotplug" else ()


def _probe_counts(events: pl.DataFrame) -> dict[str, int]:
    """Entry-probe hits of the tracekit group in one trace, by probe name."""
    mine = events.filter(pl.col("system") == "tracekit").group_by("event").len()
    return dict(zip(mine["event"].to_list(), mine["len"].to_list(), strict=True))


def _tables(label: str, summary: gt.GroundTruthSummary) -> list[Table]:
    """The counts and checks of one bundle as tables."""
    tables = [
        Table(
            f"{label}: invalidations per phase, run and CPU",
            summary.by_phase,
            "TLBI and IC IALLU(IS) executed; reach: broadcast when the effective "
            f"shareability is inner or outer; {gt.REPEAT_REACH}: the erratum workaround's "
            "repeat TLBI VALE1IS/VALE2IS, XZR, counted apart from the kernel's own",
        ),
        Table(
            f"{label}: invalidations by instruction and where",
            summary.by_instruction,
            "where: the code's text (hyp = nVHE hypervisor text), not the exception level",
        ),
    ]
    if not summary.by_step.is_empty():
        tables.append(
            Table(
                f"{label}: invalidations per VM step and after-guest action",
                summary.by_step,
                "steps: how many such steps the run had; count: summed over them",
            )
        )
    if not summary.checks.is_empty():
        checks = gt.checks_per_step_kind(summary.checks)
        tables.append(
            Table(
                f"{label}: expected against executed, per step",
                checks,
                "expected: per step and CPU; ok false = a finding in the report's lead",
            )
        )
    if summary.vmids is not None and not summary.vmids.is_empty():
        tables.append(
            Table(
                f"{label}: EL2 invalidations by VMID (attributed, never read)",
                summary.vmids,
                gtvmid.basis_legend(summary.vmids["vmid_basis"].to_list()),
            )
        )
    if not summary.probes.is_empty():
        tables.append(
            Table(
                f"{label}: kprobes named after a path, against the ground truth",
                summary.probes,
                "fired: entry-probe hits in the traced runs; inside: the path's "
                "invalidations inside the probe's entry-to-return windows on the same CPU; "
                "not_attributable: the path's invalidations outside them; entries_missed, "
                "returns_missed: the probes' misses over those runs (kprobe_profile; null: "
                "not recorded)",
            )
        )
    return tables
