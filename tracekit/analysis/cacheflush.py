"""Full-VM cache flushes on cache toggle and set/way maintenance (the 2025 RFC in the brief).

KVM flushes a VM's whole stage 2 (stage2_flush_vm) in two places, each with a tracepoint:
- kvm_toggle_cache: a trapped write to SCTLR_EL1 (HCR_EL2.TVM set) that switches the
  caches on or off (`was` != `now`); the flush runs BEFORE the event is emitted;
- kvm_set_way_flush: a trapped DC ISW/CSW/CISW while TVM is clear; the event is emitted
  BEFORE the flush. On CPUs without FWB a vCPU starts with TVM set, so set/way done
  before the caches go on traps without flushing (reproducer/README.md explains why).

Each flush's duration comes from the trace alone: from the flush function's entry/return
kprobes when they were recorded (`stage2_flush_vm` / `kvm_pgtable_stage2_flush` and
`<name>_ret`), else from the event to its neighbour on the same CPU (the event just
before kvm_toggle_cache, the one just after kvm_set_way_flush): an upper bound, since
anything else that ran on that CPU in between counts too. Each result says which.

A flush is redundant when the VM got no new stage-2 mapping (no kvm_guest_fault in its
RAM) since its previous flush, or since it was created for its first one.
"""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl

from tracekit.errors import TracekitError

FLUSH_EVENTS = {
    "kvm_toggle_cache": "enable the kvm event group (kvm/kvm_toggle_cache)",
    "kvm_set_way_flush": "enable the kvm event group (kvm/kvm_set_way_flush)",
}
FAULT_HOW = "enable the kvm event group (kvm/kvm_guest_fault)"
FLUSH_FUNCTIONS = ("stage2_flush_vm", "kvm_pgtable_stage2_flush")
BY_PROBE = "entry/return kprobes on the flush function"
BY_NEIGHBOUR = "span to the neighbouring event on the same CPU (an upper bound)"


def check_events(available: Iterable[str]) -> None:
    """Fail naming the events when neither flush event nor the guest faults were recorded."""
    have = set(available)
    missing = []
    if not have & set(FLUSH_EVENTS):
        missing += [f"{name} ({how})" for name, how in FLUSH_EVENTS.items()]
    if "kvm_guest_fault" not in have:
        missing.append(f"kvm_guest_fault ({FAULT_HOW})")
    if missing:
        raise TracekitError(
            "cache-flush analysis needs events this trace does not have: " + "; ".join(missing)
        )


def toggle_changed() -> pl.Expr:
    """True for a kvm_toggle_cache that switched the caches: only those flush stage 2."""
    # mmu.c kvm_toggle_cache flushes when now != was; every trapped VM-register write
    # (MAIR, TCR, TTBR0, SCTLR) fires the event, changed or not.
    return pl.col("was") != pl.col("now")


def cache_state_changes(toggles: pl.DataFrame) -> pl.DataFrame | None:
    """The kvm_toggle_cache rows that changed the cache state; None when fields are absent."""
    if "was" in toggles.columns:
        return toggles.filter(toggle_changed())
    # An event that never fired comes without its field columns: nothing changed.
    return toggles if toggles.is_empty() else None


def flush_rows(toggles: pl.DataFrame | None, setways: pl.DataFrame | None) -> pl.DataFrame:
    """Every flush event with its kind: row, ts, cpu, common_pid, source, flushed.

    A kvm_toggle_cache whose `was` equals `now` flushed nothing (6.1 mmu.c: stage2_flush_vm
    only when the state changes; with the caches on it clears HCR_EL2.TVM again, with them
    off it does nothing) and is kept with flushed=False so per-vCPU toggle counts stay
    complete.
    """
    parts = []
    if toggles is not None:
        parts.append(
            toggles.select(
                "row",
                "ts",
                "cpu",
                "common_pid",
                pl.lit("toggle").alias("source"),
                # An event that never fired comes without its field columns.
                toggle_changed().alias("flushed")
                if "was" in toggles.columns
                else pl.lit(None, pl.Boolean).alias("flushed"),
            )
        )
    if setways is not None:
        parts.append(
            setways.select(
                "row",
                "ts",
                "cpu",
                "common_pid",
                pl.lit("set_way").alias("source"),
                pl.lit(True).alias("flushed"),
            )
        )
    if not parts:
        raise TracekitError("cache-flush analysis: no flush events given")
    return pl.concat(parts).sort("row")


def neighbour_durations(flushes: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """Add dur_ns: toggle = ts - previous event on its CPU; set/way = next event - ts."""
    order = events.select("row", "ts", "cpu").sort("cpu", "row")
    order = order.with_columns(
        pl.col("ts").shift(1).over("cpu").alias("prev_ts"),
        pl.col("ts").shift(-1).over("cpu").alias("next_ts"),
    )
    joined = flushes.join(
        order.select("row", "prev_ts", "next_ts"), on="row", how="left", maintain_order="left"
    )
    dur = (
        pl.when(pl.col("source") == "toggle")
        .then(pl.col("ts") - pl.col("prev_ts"))
        .otherwise(pl.col("next_ts") - pl.col("ts"))
    )
    return joined.with_columns(
        pl.when(pl.col("flushed")).then(dur).alias("dur_ns"), pl.lit(BY_NEIGHBOUR).alias("method")
    ).drop("prev_ts", "next_ts")


def probe_durations(flushes: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Add dur_ns from flush-function spans (pid, start_ts, end_ts, dur_ns) of the same thread.

    A toggle's flush is the span ending last before the event; a set/way flush the span
    starting first after it.
    """
    by_pid = spans.rename({"pid": "common_pid"}).with_columns(pl.col("common_pid").cast(pl.Int32))
    flushes = flushes.with_columns(pl.col("common_pid").cast(pl.Int32)).sort(
        "ts", maintain_order=True
    )
    before = flushes.join_asof(
        by_pid.select("common_pid", "end_ts", pl.col("dur_ns").alias("dur_before")).sort(
            "end_ts", maintain_order=True
        ),
        left_on="ts",
        right_on="end_ts",
        by="common_pid",
        strategy="backward",
        check_sortedness=False,
    )
    after = before.join_asof(
        by_pid.select("common_pid", "start_ts", pl.col("dur_ns").alias("dur_after")).sort(
            "start_ts", maintain_order=True
        ),
        left_on="ts",
        right_on="start_ts",
        by="common_pid",
        strategy="forward",
        check_sortedness=False,
    )
    dur = pl.when(pl.col("source") == "toggle").then("dur_before").otherwise("dur_after")
    return (
        after.with_columns(
            pl.when(pl.col("flushed")).then(dur).alias("dur_ns"), pl.lit(BY_PROBE).alias("method")
        )
        .drop("end_ts", "dur_before", "start_ts", "dur_after")
        .sort("row")
    )


def per_vcpu(flushes: pl.DataFrame) -> pl.DataFrame:
    """Attributed flushes -> vm_seq, vcpu, toggles, toggle_flushes, set_way_flushes, flush_ms."""
    return (
        flushes.filter(pl.col("vm_seq").is_not_null())
        .group_by("vm_seq", "vcpu")
        .agg(
            (pl.col("source") == "toggle").sum().cast(pl.Int64).alias("toggles"),
            ((pl.col("source") == "toggle") & pl.col("flushed"))
            .sum()
            .cast(pl.Int64)
            .alias("toggle_flushes"),
            (pl.col("source") == "set_way").sum().cast(pl.Int64).alias("set_way_flushes"),
            (pl.col("dur_ns").sum().cast(pl.Float64) / 1e6).alias("flush_ms"),
        )
        .sort("vm_seq", "vcpu")
    )


def mark_redundant(
    flushes: pl.DataFrame, faults: pl.DataFrame, ram: tuple[int, int] | None = None
) -> pl.DataFrame:
    """Add `new_mappings` (guest faults of the VM since its previous flush) and `redundant`.

    Only flushes that flushed count. `ram` = (first IPA, end IPA) keeps the faults that
    can map memory; MMIO faults (outside RAM) map nothing. Without it every fault counts,
    so fewer flushes are called redundant, never more.
    """
    kept = faults.filter(pl.col("vm_seq").is_not_null())
    if ram is not None:
        kept = kept.filter((pl.col("ipa") >= ram[0]) & (pl.col("ipa") < ram[1]))
    marks = pl.concat(
        [
            kept.select("row", "vm_seq", pl.lit(1).alias("fault")),
            flushes.filter(pl.col("flushed") & pl.col("vm_seq").is_not_null()).select(
                "row", "vm_seq", pl.lit(0).alias("fault")
            ),
        ]
    ).sort("row")
    # Number each VM's flushes; faults carry the number of the flush they follow.
    counted = marks.with_columns(
        (1 - pl.col("fault")).cum_sum().over("vm_seq").alias("epoch")
    ).with_columns(pl.col("fault").sum().over("vm_seq", "epoch").alias("faults_after"))
    # The faults before a flush are those after the previous one: shift by one epoch.
    per_epoch = counted.group_by("vm_seq", "epoch").agg(pl.col("faults_after").first())
    per_epoch = per_epoch.with_columns((pl.col("epoch") + 1).alias("next_epoch"))
    flush_epochs = counted.filter(pl.col("fault") == 0).select("row", "vm_seq", "epoch")
    found = flush_epochs.join(
        per_epoch.select(
            "vm_seq",
            pl.col("next_epoch").alias("epoch"),
            pl.col("faults_after").alias("new_mappings"),
        ),
        on=["vm_seq", "epoch"],
        how="left",
        maintain_order="left",
    ).with_columns(pl.col("new_mappings").fill_null(0).cast(pl.Int64))
    out = flushes.join(
        found.select("row", "new_mappings"), on="row", how="left", maintain_order="left"
    )
    return out.with_columns(
        pl.when(pl.col("flushed") & pl.col("vm_seq").is_not_null())
        .then(pl.col("new_mappings") == 0)
        .alias("redundant")
    )


def per_vm(flushes: pl.DataFrame, vms: pl.DataFrame) -> pl.DataFrame:
    """Per VM (vms: vm_seq, vcpus, touch_kb): flushes, redundant ones, total flush ms."""
    done = flushes.filter(pl.col("flushed") & pl.col("vm_seq").is_not_null())
    totals = done.group_by("vm_seq").agg(
        pl.len().cast(pl.Int64).alias("flushes"),
        pl.col("redundant").sum().cast(pl.Int64).alias("redundant"),
        (pl.col("dur_ns").sum().cast(pl.Float64) / 1e6).alias("flush_ms"),
    )
    return (
        vms.join(totals, on="vm_seq", how="left", maintain_order="left")
        .with_columns(
            pl.col("flushes", "redundant").fill_null(0), pl.col("flush_ms").fill_null(0.0)
        )
        .sort("vm_seq")
    )
