"""Stage-2 teardown time versus the requested IPA size, per kernel, side by side.

Thin: numbers come from tracekit/analysis/teardown.py. A run counts when its VMM output
has VMs of at least two IPA sizes (the teardown scenario's `--ipa-bits LIST --repeat N`).
The fit uses the VMM's own teardown times (they need no trace, so a run that lost trace
events still counts); the trace gives the cross-check and the kernel function's share.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis import teardown as td
from tracekit.analysis.calls import missed_note, returns_missed
from tracekit.bundle import RunKind
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData
from tracekit.report.header import bundle_label, is_emulated
from tracekit.report.model import Plot, Section, Table, run_key, used_runs
from tracekit.report.sections.vmruns import VmRun, vm_runs

EMULATED_NOTE = "emulated host: teardown times are QEMU TCG times, not hardware times"


def section(bundles: list[BundleData]) -> Section | None:
    """Per kernel: teardown per IPA size, trace/VMM agreement, growth per bit; a plot."""
    groups = _teardown_runs(bundles)
    if not groups:
        return None
    findings: list[str] = []
    tables: list[Table] = []
    unknowns: list[str] = []
    points: list[pl.DataFrame] = []
    growths: list[tuple[str, td.Growth]] = []
    for label, kernel, runs in groups:
        parts = []
        for found in runs:
            table, notes, missing = _per_vm(found)
            findings += notes
            unknowns += missing
            parts.append(table.with_columns(pl.lit(found.run.run_id).alias("run_id")))
        table = pl.concat(parts, how="diagonal_relaxed")
        points.append(
            table.select("ipa_bits", (pl.col("vmm_ns") / 1e6).alias("teardown_ms")).with_columns(
                pl.lit(kernel).alias("kernel")
            )
        )
        tables.append(_size_table(table, label, kernel))
        try:
            growth = td.growth_per_bit(td.steady_state(table), "vmm_ns")
        except TracekitError as err:
            unknowns.append(f"{label}{kernel}: growth per IPA bit: {err}")
            continue
        growths.append((kernel, growth))
        findings.append(f"{label}{kernel}: {growth.statement()}")
    if growths:
        findings.append(
            "growth fits leave out the first VM of each VMM invocation (one-time costs; it "
            "is still in the tables)"
        )
    if len(growths) > 1:
        tables.append(_side_by_side(growths))
    if any(is_emulated(b) for b in bundles):
        findings.append(EMULATED_NOTE)
    return Section(
        key="teardown",
        title="Stage-2 teardown time versus IPA size",
        findings=findings,
        tables=tables,
        plots=[_plot(pl.concat(points))],
        unknowns=sorted(set(unknowns)),
        **used_runs({run_key(f.data, f.run): f.lost for f in runs}),
    )


def _kernel(data: BundleData) -> str:
    """The kernel release the bundle ran on."""
    return str(data.manifest.host.get("kernel_release") or "kernel ?")


def _is_teardown_run(found: VmRun) -> bool:
    """A sweep run of VMs (the teardown scenario: one IPA size per run) or one VMM run
    that cycled several IPA sizes itself."""
    return found.run.kind == RunKind.VMS or found.vmm.vms["ipa_bits"].n_unique() >= 2


def _teardown_runs(bundles: list[BundleData]) -> list[tuple[str, str, list[VmRun]]]:
    """(label prefix, kernel, runs) per bundle whose teardown runs span two IPA sizes."""
    everything = [r for r in vm_runs(bundles) if _is_teardown_run(r)]
    many = len(bundles) > 1
    groups = []
    for data in bundles:
        runs = [r for r in everything if r.data is data]
        sizes = {size for r in runs for size in r.vmm.vms["ipa_bits"].to_list()}
        if len(sizes) >= 2:
            prefix = f"{bundle_label(data)}: " if many else ""
            groups.append((prefix, _kernel(data), runs))
    return groups


def _kernel_spans(found: VmRun) -> tuple[pl.DataFrame | None, str | None, str | None]:
    """The first probed teardown function's time per VM, its name, and what its calls
    without a return may be (calls.missed_note: missed returns, a trace that ended)."""
    if found.windows is None:
        return None, None, None
    for name in td.TEARDOWN_FUNCTIONS:
        entries, returns = found.event(name), found.event(f"{name}_ret")
        if entries is None or returns is None or entries.is_empty():
            continue
        spans = td.function_spans(entries, returns)
        missed = returns_missed(found.run.probe_misses, name)
        note = missed_note(name, entries, returns, missed)
        return td.spans_in_windows(spans, found.windows), name, note
    return None, None, None


def _per_vm(found: VmRun) -> tuple[pl.DataFrame, list[str], list[str]]:
    """The per-VM table (trace columns null when unusable), findings and unknowns."""
    vms = found.vmm.vms.filter(pl.col("result") == "ok")
    base = vms.select(
        pl.int_range(pl.len(), dtype=pl.Int32).alias("vm_seq"),
        "vm",
        "ipa_bits",
        "ram_mb",
        pl.col("teardown_ns").alias("vmm_ns"),
        "result",
    )
    if found.windows is None:
        return base, [], [f"{found.label}: no VMM markers: teardown not checked against the trace"]
    if found.lost:
        note = f"{found.label}: trace lost {found.lost} events: its teardown spans are not used"
        return base, [note], []
    kernel, name, unclosed = _kernel_spans(found)
    try:
        table = td.teardown_table(found.windows, found.vmm.vms, kernel)
    except TracekitError as err:  # e.g. a run stopped by its budget mid-VM
        return base, [f"{found.label}: trace not compared with the VMM: {err}"], []
    agree = int(table["agrees"].sum())
    diff_ms = float(table["diff_ns"].median() or 0) / 1e6  # type: ignore[arg-type]
    notes = [
        f"{found.label}: trace markers and the VMM's own clock agree for {agree} of "
        f"{table.height} VMs ({td.AGREEMENT.rule()}; median difference {diff_ms:.2f} ms, "
        "the cost of writing the markers)"
    ]
    if agree < table.height:
        off = table.filter(~pl.col("agrees"))["vm_seq"].to_list()
        notes.append(f"{found.label}: VMs whose trace and VMM times disagree: {off}")
    missing = []
    if name is None:
        graph = " (function_graph was recorded: its spans are not read here yet)"
        graph = graph if "funcgraph_exit" in found.trace.event_names else ""
        missing.append(f"{found.label}: the kernel's stage-2 teardown time ({td.PROBE_HOW}){graph}")
    else:
        share = (table["kernel_ns"].sum() / max(table["vmm_ns"].sum(), 1)) * 100
        notes.append(f"{found.label}: {name} is {share:.0f}% of the VMM's teardown time")
        if unclosed:
            # A call without its return has no kernel time: its VM's kernel_ms is absent.
            notes.append(f"{found.label}: {unclosed}; their VMs have no kernel time here")
    return table, notes, missing


def _size_table(table: pl.DataFrame, label: str, kernel: str) -> Table:
    """Medians per IPA size from the VMM, the markers and the kernel function."""
    per = td.by_ipa_size(table, "vmm_ns").select(
        "ipa_bits", "vms", pl.col("median_ms").alias("vmm_ms")
    )
    for column, name in (("marker_ns", "trace_ms"), ("kernel_ns", "kernel_ms")):
        if column in table.columns and table[column].is_not_null().any():
            more = td.by_ipa_size(table, column).select("ipa_bits", pl.col("median_ms").alias(name))
            per = per.join(more, on="ipa_bits", how="left", maintain_order="left")
    return Table(
        f"{label}{kernel}: teardown per IPA size (median ms)",
        per.with_columns(pl.col(pl.Float64).round(2)),
        note="vmm: the VMM's clock; trace: teardown markers; kernel: the stage-2 free function",
    )


def _side_by_side(growths: list[tuple[str, td.Growth]]) -> Table:
    """One row per kernel: growth per IPA bit, its interval and the verdict."""
    frame = pl.DataFrame(
        [(k, g.factor, g.low, g.high, g.verdict()) for k, g in growths],
        schema={
            "kernel": pl.String,
            "per_bit": pl.Float64,
            "ci_low": pl.Float64,
            "ci_high": pl.Float64,
            "scales_with": pl.String,
        },
        orient="row",
    ).with_columns(pl.col(pl.Float64).round(3))
    return Table("teardown growth per added IPA bit, by kernel", frame, note="95% bootstrap CI")


def _plot(points: pl.DataFrame) -> Plot:
    """Teardown time of every VM against its IPA size, one series per kernel."""
    return Plot(
        "stage-2 teardown time vs requested IPA size",
        "xy",
        points,
        x="ipa_bits",
        y="teardown_ms",
        series="kernel",
        x_label="IPA size (bits)",
        y_label="teardown (ms, VMM clock)",
    )
