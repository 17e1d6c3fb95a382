"""VM lifecycles: per VM the VMM ran in a traced run, create -> vCPU runs -> teardown.

Thin: numbers come from tracekit/analysis/vm.py. Runs are those whose directory holds the
VMM's output (vmm.txt) and a trace. A run without VMM markers (the after-guest rollover
batch runs the VMM without them) still gives its VMIDs and rollovers.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis import vm
from tracekit.analysis.calls import probe_missed
from tracekit.bundle import RunFile, RunKind, run_trace_path
from tracekit.ingest.bundle import BundleData, open_run_trace
from tracekit.ingest.trace import Trace
from tracekit.report.header import is_emulated
from tracekit.report.model import Section, Table, run_key, used_runs
from tracekit.report.sections.vmruns import VmRun, vm_runs

# Above this many VMs a run's steps are summarised per IPA size instead of listed.
MAX_LISTED_VMS = 8


def section(bundles: list[BundleData]) -> Section | None:
    """One finding per VM run, step and exit tables, VMIDs and rollovers, EL2 events."""
    runs = vm_runs(bundles)
    if not runs:
        return None
    findings: list[str] = []
    tables: list[Table] = []
    unknowns: list[str] = []
    for found in runs:
        if found.lost:
            findings.append(
                f"{found.label}: lost {found.lost} trace events; its event counts may be low"
            )
        lines, more, missing = _run(found)
        findings += lines
        tables += more
        unknowns += missing
    findings += [line for data in bundles for line in _background_stops(data)]
    if any(is_emulated(b) for b in bundles):
        findings.append("emulated host: these durations are QEMU TCG times, not hardware times")
    return Section(
        key="vm",
        title="VM lifecycle (create -> vCPU runs -> teardown)",
        findings=findings,
        tables=tables,
        unknowns=sorted(set(unknowns)),
        **used_runs({run_key(f.data, f.run): f.lost for f in runs}),
    )


def _background_stops(data: BundleData) -> list[str]:
    """How each background guest (a during phase's) ended, from its stop run's markers.

    Its create and vCPU entries are in the guest-start run, its stop and teardown in the
    guest-stop run; the quiet runs between them are untraced, so only the ends are told.
    """
    out = []
    for run in data.manifest.runs:
        if run.kind != RunKind.GUEST_STOP or run_trace_path(data.path, run.run_id) is None:
            continue
        trace = open_run_trace(data, run)
        name = next((n for n in vm.MARKER_EVENTS if n in trace.event_names), None)
        steps = vm.vmm_markers(trace.event(name)) if name else None
        at = {} if steps is None else dict(zip(steps["event"], steps["ts"], strict=True))
        if "teardown-start" in at and "teardown-end" in at:
            took = (at["teardown-end"] - at["teardown-start"]) / 1e6
            how = "stopped by a signal" if "stop" in at else "ended"
            out.append(f"{run.run_id}: the background guest {how}, torn down in {took:.1f} ms")
        else:
            out.append(
                f"{run.run_id}: the background guest's teardown is not in the trace (its VMM "
                "was killed, or predates teardown on SIGTERM): teardown not measured"
            )
    return out


def _run(found: VmRun) -> tuple[list[str], list[Table], list[str]]:
    """Findings, tables and unknowns of one run."""
    findings: list[str] = []
    tables: list[Table] = []
    label = found.label
    unknowns = _unrecorded(found.trace, label)
    updates, bits, bits_from = _vmid_updates(found)
    if found.windows is None:
        findings.append(
            f"{label}: {found.vmm.vms.height} VMs in the VMM output but no VMM markers in the "
            "trace (run without --trace-marker): no per-VM lifecycle"
        )
    else:
        counted = {
            column: rows
            for column, event in vm.COUNTED.items()
            if (rows := found.attributed(event)) is not None
        }
        vmids = None
        if updates is not None and bits is not None:
            vmids = vm.vm_vmids(found.give_to_vms(updates), bits)
        table = vm.lifecycle(found.windows, counted, vmids)
        findings += _lifecycle_findings(table, label)
        tables += _lifecycle_tables(table, label)
        if "exits" in counted:
            tables.append(_exit_table(counted["exits"], label))
        if "hvcs" in counted:
            findings += _hvc_finding(counted["hvcs"], label)
        maps = found.attributed(vm.STAGE2_MAP_EVENT)
        if maps is not None:
            line, table = _stage2_maps(maps, found.run.probe_misses, label)
            findings.append(line)
            tables += [table] if table is not None else []
    if updates is not None and bits is not None:
        findings.append(_rollover_finding(updates, bits, bits_from, label))
        missed = vm.vmid_misses(found.run.probe_misses)
        findings += [f"{label}: VMIDs and rollovers: {missed}"] if missed else []
    return findings, tables, unknowns


def _stage2_maps(
    maps: pl.DataFrame, probe_misses: dict[str, int] | None, label: str
) -> tuple[str, Table | None]:
    """The stage-2 page and block sizes the kernel mapped, per VM: a finding and a table."""
    per = vm.stage2_mappings(maps)
    missed = probe_missed(probe_misses, vm.STAGE2_MAP_EVENT)
    lost = f"; the kprobe missed {missed} call(s) (kprobe_profile)" if missed else ""
    if per.is_empty():
        return f"{label}: no stage-2 map call seen (kvm_pgtable_stage2_map){lost}", None
    totals = per.group_by("size").agg(pl.col("maps").sum()).sort("size")
    said = ", ".join(f"{n} x {vm.size_name(size)}" for size, n in totals.iter_rows())
    # A call installs at most one page or block (the review of 17, F6): calls, not mappings.
    line = f"{label}: stage-2 map calls (kvm_pgtable_stage2_map) by size: {said}{lost}"
    table = Table(
        f"{label}: stage-2 map calls per VM",
        per.select(
            pl.col("vm_seq").alias("vm"),
            pl.col("size").map_elements(vm.size_name, return_dtype=pl.String).alias("size"),
            "maps",
            (pl.col("mapped") // 1024).alias("kib_at_most"),
        ),
        note=(
            "maps: kvm_pgtable_stage2_map calls; each installs at most one page or block of "
            "that size (a lost race or an unchanged entry installs none; re-maps count), so "
            "kib_at_most, their sizes summed, bounds what they mapped"
        ),
    )
    return line, table


def _hvc_finding(hvcs: pl.DataFrame, label: str) -> list[str]:
    """The guest's HVCs by PSCI name, over the run's VMs."""
    calls = vm.hvc_calls(hvcs)
    if calls.is_empty():
        return []
    totals = calls.group_by("call").agg(pl.col("count").sum()).sort("call")
    return [f"{label}: guest HVCs: " + ", ".join(f"{c} x{n}" for c, n in totals.iter_rows())]


def _unrecorded(trace: Trace, label: str) -> list[str]:
    """What the trace cannot tell about the hypervisor side."""
    out = []
    hyp = vm.hypervisor_events(trace.events)
    if not hyp:
        out.append(
            "hypervisor (EL2) events: not recorded (the kernel has no EL2 tracing; Debian's "
            "kernels have none), so nothing here is seen from inside the hypervisor"
        )
    if "kvm_arm_vmid_update" not in trace.event_names:
        out.append(f"{label}: VMIDs: not recorded ({vm.VMID_HOW})")
    return out


def _vmid_updates(found: VmRun) -> tuple[pl.DataFrame | None, int | None, str]:
    """The VMID probe's rows, the VMID width and where the width came from."""
    updates = vm.vmid_readings(found.event(vm.VMID_EVENT), found.event(vm.VMID_RETURN_EVENT))
    if updates is None or updates.is_empty():
        return None, None, ""
    recorded = found.data.run(found.run).vmid_bits
    bits = vm.vmid_width(updates, recorded)
    if recorded is not None:
        return updates, bits, f"the run's {RunFile.ROLLOVER}"
    return (
        updates,
        bits,
        (
            "inferred from the smallest VMID+generation value read (valid on a fresh host,"
            " whose generation is 1)"
        ),
    )


def _rollover_finding(updates: pl.DataFrame, bits: int, bits_from: str, label: str) -> str:
    """VMID rollovers seen, with the width used."""
    rolls = vm.vmid_rollovers(updates, bits)
    if rolls.is_empty():
        return f"{label}: no VMID rollover seen ({bits}-bit VMIDs, {bits_from})"
    steps = ", ".join(
        f"generation {a} -> {b}"
        for a, b in rolls.select("from_generation", "to_generation").iter_rows()
    )
    return f"{label}: {rolls.height} VMID rollover(s): {steps} ({bits}-bit VMIDs, {bits_from})"


def _count(value: int | None, what: str) -> str:
    """'3 guest faults', '1 guest fault', or 'guest faults not recorded'."""
    if value is None:
        return f"{what} not recorded"
    return f"{value} {what.removesuffix('s') if value == 1 else what}"


def _ms(ns: int | None) -> str:
    """Nanoseconds as milliseconds with one decimal, or '?'."""
    return "?" if ns is None else f"{ns / 1e6:.1f} ms"


def _lifecycle_findings(table: pl.DataFrame, label: str) -> list[str]:
    """One sentence per VM when few, else one for the run."""
    if table.height > MAX_LISTED_VMS:
        med = table.select(pl.col("setup_ns", "run_ns", "teardown_marker_ns").median())
        setup, ran, down = (med.item(0, i) for i in range(3))
        return [
            f"{label}: {table.height} VMs; median create {_ms(setup)}, run {_ms(ran)}, "
            f"teardown {_ms(down)} (trace markers)"
        ]
    out = []
    for row in table.iter_rows(named=True):
        vmid = f", VMID {row['vmid']}" if row.get("vmid") is not None else ""
        out.append(
            f"{label}: VM {row['vm_seq']} ({row['ipa_bits']}-bit IPA, {row['vcpus']} vCPU"
            f"{vmid}): create {_ms(row['setup_ns'])}, {_run_and_teardown(row)}; "
            f"{_count(row['exits'], 'exits')}, "
            f"{_count(row['guest_faults'], 'guest faults')}, "
            f"{_count(row['cache_toggles'], 'cache toggles')}"
        )
    return out


def _run_and_teardown(row: dict[str, object]) -> str:
    """'run X, teardown Y', or that the VM outlived the run's trace (a background guest)."""
    if row["run_ns"] is None and row["teardown_marker_ns"] is None and row["setup_ns"] is not None:
        return "still running when this run's trace ended"
    stopped = " (stopped by a signal)" if row.get("stopped") else ""
    return f"run {_ms(row['run_ns'])}{stopped}, teardown {_ms(row['teardown_marker_ns'])}"  # type: ignore[arg-type]


def _lifecycle_tables(table: pl.DataFrame, label: str) -> list[Table]:
    """Steps and events per VM (or per IPA size when there are many VMs)."""
    ms = [
        (pl.col(c).cast(pl.Float64) / 1e6).alias(f"{name}_ms")
        for c, name in (("setup_ns", "create"), ("run_ns", "run"), ("teardown_marker_ns", "down"))
    ]
    if table.height > MAX_LISTED_VMS:
        per = table.group_by("ipa_bits").agg(
            pl.len().alias("vms"), *(m.median() for m in ms), pl.col("exits").median()
        )
        return [
            Table(
                f"{label}: VM steps per IPA size (medians)",
                per.sort("ipa_bits"),
                note="ms from the VMM's trace markers; emulated timings are not hardware timings",
            )
        ]
    steps = table.select(pl.col("vm_seq").alias("vm"), "ipa_bits", "vcpus", *ms)
    events = table.select(
        pl.col("vm_seq").alias("vm"),
        "exits",
        pl.col("guest_faults").alias("faults"),
        pl.col("cache_toggles").alias("toggles"),
        pl.col("set_way_flushes").alias("setway"),
        "hvcs",
    )
    return [
        Table(f"{label}: VM steps (ms)", steps, note="from the VMM's trace markers"),
        Table(
            f"{label}: KVM events per VM",
            events,
            note="null: the event was not recorded; 0: recorded, never fired",
        ),
    ]


def _exit_table(exits: pl.DataFrame, label: str) -> Table:
    """Exits by reason over the run's VMs."""
    per = vm.exits_by_reason(exits)
    summary = (
        per.group_by("reason")
        .agg(pl.col("count").sum(), pl.col("vm_seq").n_unique().alias("vms"))
        .sort(["count", "reason"], descending=[True, False])
    )
    return Table(f"{label}: guest exits by reason", summary, note="kvm_exit: kind and ESR class")
