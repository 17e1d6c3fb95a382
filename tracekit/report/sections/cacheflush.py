"""Full-VM cache flushes per vCPU when a guest toggles its caches or does set/way.

Thin: numbers come from tracekit/analysis/cacheflush.py. A run counts when it is a
cache-toggle scenario run or ran one of the set/way guest variants. Flush durations have
no second source: they come from the trace alone, and each finding says how.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis import cacheflush as cf
from tracekit.analysis import teardown as td
from tracekit.analysis.calls import missed_note, returns_missed
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData
from tracekit.report.header import is_emulated
from tracekit.report.model import Plot, Section, Table, run_key, used_runs
from tracekit.report.sections.vmruns import VmRun, vm_runs

# Guest variants made for this case, and the flushes each vCPU should cause on a CPU
# without FWB: (kvm_toggle_cache flushes, kvm_set_way_flush flushes). reproducer/README.md.
EXPECTED_PER_VCPU = {"cache-toggle": (1, 0), "setway-after-on": (1, 1)}
RAM_BASE = 0x4000_0000  # the VMM's guest RAM starts here (reproducer/README.md)


def section(bundles: list[BundleData]) -> Section | None:
    """Per-vCPU counts, flush time vs vCPUs and memory touched, redundant flushes."""
    runs = [r for r in vm_runs(bundles) if _is_cache_run(r)]
    if not runs:
        return None
    findings: list[str] = []
    unknowns: list[str] = []
    vcpu_rows: list[pl.DataFrame] = []
    vm_rows: list[pl.DataFrame] = []
    no_setway: list[str] = []
    for found in runs:
        if found.windows is None:
            unknowns.append(f"{found.label}: no VMM markers: flushes cannot be given to vCPUs")
            continue
        if found.lost:
            findings.append(f"{found.label} left out: its trace lost {found.lost} events")
            continue
        try:
            flushes, method = _flushes(found)
        except TracekitError as err:
            unknowns.append(f"{found.label}: {err}")
            continue
        per_vcpu = cf.per_vcpu(flushes).with_columns(pl.lit(found.label).alias("run_id"))
        per_vm = cf.per_vm(flushes, _vm_sizes(found)).with_columns(
            pl.lit(found.label).alias("run_id")
        )
        vcpu_rows.append(per_vcpu)
        vm_rows.append(per_vm)
        findings += _run_findings(found, per_vcpu, per_vm, method)
        if _variant(found) == "cache-toggle" and per_vcpu["set_way_flushes"].sum() == 0:
            no_setway.append(found.label)
    if no_setway:
        findings.append(
            f"{', '.join(no_setway)}: the guest's set/way instructions trapped but flushed "
            "nothing (TVM was still set: a CPU without FWB); every flush came from "
            "kvm_toggle_cache when the caches went on"
        )
    if not vm_rows:
        return Section("cacheflush", "Cache-toggle flushes", findings, unknowns=unknowns)
    if any(is_emulated(b) for b in bundles):
        findings.append("emulated host: flush durations are QEMU TCG times, not hardware times")
    vcpus, vms = pl.concat(vcpu_rows), pl.concat(vm_rows)
    return Section(
        key="cacheflush",
        title="Full-VM cache flushes on cache toggle and set/way, per vCPU",
        findings=findings,
        tables=_tables(vcpus, vms),
        plots=[_plot(vms)],
        unknowns=sorted(set(unknowns)),
        **used_runs({run_key(f.data, f.run): f.lost for f in runs}),
    )


def _variant(found: VmRun) -> str:
    """The guest variant the VMM ran (from its `run` record)."""
    return found.vmm.runs[0].get("variant", "?") if found.vmm.runs else "?"


def _is_cache_run(found: VmRun) -> bool:
    """A cache-toggle scenario run, or a run of a guest variant made for this case.

    (This compared the run's kind with "cache-toggle", a scenario name no run kind has.)
    """
    scenario = found.data.manifest.scenario.get("name")
    return scenario == "cache-toggle" or _variant(found) in EXPECTED_PER_VCPU


def _flushes(found: VmRun) -> tuple[pl.DataFrame, str]:
    """The run's flushes with durations, VM/vCPU and redundancy, and how they were timed."""
    cf.check_events(found.available)
    flushes = cf.flush_rows(found.event("kvm_toggle_cache"), found.event("kvm_set_way_flush"))
    method = cf.BY_NEIGHBOUR
    for name in cf.FLUSH_FUNCTIONS:
        entries, returns = found.event(name), found.event(f"{name}_ret")
        if entries is not None and returns is not None and not entries.is_empty():
            flushes = cf.probe_durations(flushes, td.function_spans(entries, returns))
            method = f"{cf.BY_PROBE} ({name})"
            missed = returns_missed(found.run.probe_misses, name)
            unclosed = missed_note(name, entries, returns, missed)
            method += f"; {unclosed}" if unclosed else ""
            break
    else:
        flushes = cf.neighbour_durations(flushes, found.trace.events)
    flushes = found.give_to_vms(flushes)
    faults = found.attributed("kvm_guest_fault")
    if faults is None:
        raise TracekitError(f"no kvm_guest_fault events ({cf.FAULT_HOW})")
    ram_mb = found.vmm.vms["ram_mb"].max()
    ram = (RAM_BASE, RAM_BASE + int(ram_mb) * 2**20) if ram_mb is not None else None  # type: ignore[arg-type]
    return cf.mark_redundant(flushes, faults, ram), method


def _vm_sizes(found: VmRun) -> pl.DataFrame:
    """vm_seq, vcpus, touch_kb of each VM, from the VMM's records."""
    return found.vmm.vms.select(
        pl.int_range(pl.len(), dtype=pl.Int32).alias("vm_seq"), "vcpus", "touch_kb"
    )


def _run_findings(
    found: VmRun, per_vcpu: pl.DataFrame, per_vm: pl.DataFrame, method: str
) -> list[str]:
    """Counts against the guest's design, redundant flushes, and how durations were timed."""
    variant = _variant(found)
    toggles, setway = int(per_vcpu["toggle_flushes"].sum()), int(per_vcpu["set_way_flushes"].sum())
    vcpus = int(per_vm["vcpus"].sum())
    redundant, flushes = int(per_vm["redundant"].sum()), int(per_vm["flushes"].sum())
    lines = [
        f"{found.label} ({variant}, {vcpus} vCPU): {flushes} full-VM flushes "
        f"({toggles} on cache toggle, {setway} on set/way), {redundant} redundant (no new "
        f"stage-2 mapping since the VM's previous flush); "
        f"{per_vm['flush_ms'].sum():.2f} ms in all; durations: {method}"
    ]
    expected = EXPECTED_PER_VCPU.get(variant)
    if expected is not None:
        want = (expected[0] * vcpus, expected[1] * vcpus)
        verdict = "as designed" if (toggles, setway) == want else "NOT as designed"
        lines.append(
            f"{found.label}: {verdict}: the guest should cause {want[0]} toggle and {want[1]}"
            f" set/way flushes on a CPU without FWB, one of each kind per vCPU it names"
        )
    return lines


def _tables(vcpus: pl.DataFrame, vms: pl.DataFrame) -> list[Table]:
    """Per-vCPU counts and per-VM totals across the runs."""
    return [
        Table(
            "flushes per vCPU",
            vcpus.select(
                "run_id",
                "vcpu",
                "toggles",
                pl.col("toggle_flushes").alias("t_flush"),
                pl.col("set_way_flushes").alias("sw_flush"),
                pl.col("flush_ms").round(3),
            ),
            note="toggles: trapped VM-register writes; t_flush: those that switched the caches",
        ),
        Table(
            "flush time vs vCPUs and memory touched",
            vms.select(
                "run_id", "vcpus", "touch_kb", "flushes", "redundant", pl.col("flush_ms").round(3)
            ),
            note="touch_kb: guest RAM each vCPU wrote before the flush (the flush walks it)",
        ),
    ]


def _plot(vms: pl.DataFrame) -> Plot:
    """Total flush time per VM against its vCPU count, one series per memory touched."""
    frame = vms.select(
        "vcpus", "flush_ms", pl.format("{} KiB touched per vCPU", "touch_kb").alias("touched")
    )
    return Plot(
        "full-VM flush time vs vCPUs",
        "xy",
        frame,
        x="vcpus",
        y="flush_ms",
        series="touched",
        x_label="vCPUs",
        y_label="total flush time per VM (ms)",
    )
