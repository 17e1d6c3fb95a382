"""VM lifecycles from a trace: create -> vCPU runs -> teardown, per VM the VMM ran.

The reproducer VMM writes lifecycle markers into the trace (reproducer/README.md, "Trace
markers"): `tracekit-vmm: vm=N event=create|enter|poweroff|stop|teardown-start|teardown-end`
(`stop`: the VMM was asked to stop by SIGTERM/SIGINT before the guest powered off).
They delimit each VM in time and name its threads (the main thread writes `create` and
the teardown markers, each vCPU thread its `enter`), so every KVM event can be given to
the VM and vCPU whose thread emitted it. VM indices restart at 0 in each VMM invocation;
`vm_seq` numbers the VMs of one trace in creation order and is the key used here.

VMIDs come from the collector's kprobe on kvm_arm_vmid_update (`vmid_id`, read at entry,
so before the update: a new VM shows 0 first and its VMID from its next call on) and,
where the kernel can fetch arguments at return (6.10+), its return probe
kvm_arm_vmid_update_ret (the VMID just given). 6.1 calls it before every guest entry, so
entries show a VM's VMID after its first; 6.12 calls it once per vCPU load (upstream
fa808ed4e199, in 6.12.y), so a VM's only call often reads 0 at entry: there the return
is what shows it. Both are read together (`vmid_readings`).
The 64-bit value holds the VMID in its low `vmid_bits` bits and the allocator's
generation above them; a new generation appearing is a VMID rollover.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import polars as pl

from tracekit.analysis.cacheflush import cache_state_changes
from tracekit.analysis.calls import probe_missed
from tracekit.analysis.exits import exit_reason
from tracekit.analysis.requires import require_events

MARKER_PREFIX = "tracekit-vmm:"
# Markers tracekit's own programs write: `TOOL: key=value ...`.
_TOOL_MARKER = r"^(tracekit-vmm|tracekit-probe):\s*(.*)$"
MARKER_HOW = (
    "the VMM's trace markers: run reproducer/build/vmm with --trace-marker "
    "<instance>/trace_marker (tracekit collect does) and record ftrace `print`"
)
KVM_HOW = "enable the kvm event group in the instance (tracekit collect's traced runs do)"
VMID_HOW = (
    "the collector's kprobe tracekit/kvm_arm_vmid_update with vmid_id=+0($arg1):u64 "
    "(tracekit collect defines it when the kernel has the symbol)"
)
NEEDS = {"print": MARKER_HOW}
# Binary traces name trace_marker writes `print` (field `buf`); tracefs text shows them as
# `tracing_mark_write` (the text reader keeps the line in `fields`).
MARKER_EVENTS = ("print", "tracing_mark_write")
# Per-VM event counts: column name -> event.
COUNTED = {
    "exits": "kvm_exit",
    "userspace_exits": "kvm_userspace_exit",
    "guest_faults": "kvm_guest_fault",
    "cache_toggles": "kvm_toggle_cache",  # only those that changed the cache state
    "set_way_flushes": "kvm_set_way_flush",
    "hvcs": "kvm_hvc_arm64",
    "mmio": "kvm_mmio",
}
# Systems and name prefixes of events the hypervisor itself (EL2) emits, where a kernel
# has hypervisor tracing (pKVM's hyp events); Debian's kernels have none.
HYP_SYSTEMS = ("hyp", "hypervisor")
HYP_PREFIXES = ("hyp_", "__hyp_")
_FIELD = {"vm": r"\bvm=(\d+)", "vcpu": r"\bvcpu=(\d+)", "cpu": r"\bcpu=(-?\d+)"}
_FIELD |= {"ipa_bits": r"\bipa_bits=(\d+)", "vcpus": r"\bvcpus=(\d+)"}


def available_events(event_names: Iterable[str], meta: dict[str, object]) -> set[str]:
    """Events a trace recorded or had enabled (an enabled event may fire zero times)."""
    enabled = meta.get("events_enabled") or []
    return set(event_names) | {str(e).rsplit("/", 1)[-1] for e in enabled}  # type: ignore[union-attr]


def marker_table(tables: Mapping[str, pl.DataFrame]) -> pl.DataFrame | None:
    """The trace_marker writes of a trace's tables: `print` (binary) or its text name."""
    return next((tables[n] for n in MARKER_EVENTS if n in tables), None)


def _marker_text(prints: pl.DataFrame) -> pl.Expr:
    """A marker's text: `buf` in binary traces, the line's `fields` in text ones."""
    column = "buf" if "buf" in prints.columns else "fields"
    return pl.col(column).cast(pl.String).str.strip_chars()


def tracekit_markers(prints: pl.DataFrame) -> pl.DataFrame:
    """Every tracekit marker (VMM and probe): ts, pid, tool, text (its key=value part)."""
    text = _marker_text(prints)
    found = prints.with_columns(text.str.extract(_TOOL_MARKER, 1).alias("tool"))
    return (
        found.filter(pl.col("tool").is_not_null())
        .sort("ts", "row")
        .select(
            "ts",
            pl.col("common_pid").cast(pl.Int32).alias("pid"),
            "tool",
            text.str.extract(_TOOL_MARKER, 2).alias("text"),
        )
    )


def vmm_markers(prints: pl.DataFrame) -> pl.DataFrame:
    """The VMM's lifecycle markers: ts, pid, vm, event, vcpu, cpu, ipa_bits, vcpus.

    `prints` is the `print` table of a binary trace or `tracing_mark_write` of a text one.
    """
    text = _marker_text(prints)
    found = prints.filter(text.str.starts_with(MARKER_PREFIX)).sort("ts", maintain_order=True)
    fields = [text.str.extract(p, 1).cast(pl.Int32).alias(name) for name, p in _FIELD.items()]
    return found.select(
        "ts",
        pl.col("common_pid").cast(pl.Int32).alias("pid"),
        text.str.extract(r"\bevent=(\S+)", 1).alias("event"),
        *fields,
    )


def _with_vm_seq(markers: pl.DataFrame) -> pl.DataFrame:
    """Give each marker the `vm_seq` of the latest `create` of its VM index before it."""
    creates = (
        markers.filter(pl.col("event") == "create")
        .select("ts", "vm", pl.col("pid").alias("vmm_pid"))
        .with_row_index("vm_seq")
        .with_columns(pl.col("vm_seq").cast(pl.Int32))
    )
    return markers.sort("ts", maintain_order=True).join_asof(
        creates, on="ts", by="vm", strategy="backward", check_sortedness=False
    )


def vm_windows(markers: pl.DataFrame) -> pl.DataFrame:
    """One row per VM: when each lifecycle step happened and the teardown span by markers.

    Columns: vm_seq, vm, vmm_pid, ipa_bits, vcpus, create_ts, enter_ts (first vCPU),
    poweroff_ts, stop_ts (a stop request, when the guest never powered off),
    teardown_start_ts, teardown_end_ts, teardown_marker_ns (null when a marker is missing,
    e.g. the trace ended first).
    """
    tagged = _with_vm_seq(markers).filter(pl.col("vm_seq").is_not_null())

    def first(event: str) -> pl.Expr:
        """ts of the first marker of this kind for the VM."""
        return pl.col("ts").filter(pl.col("event") == event).min().alias(f"{event}_ts")

    windows = (
        tagged.group_by("vm_seq")
        .agg(
            pl.col("vm").first(),
            pl.col("vmm_pid").first(),
            pl.col("ipa_bits").filter(pl.col("event") == "create").first(),
            pl.col("vcpus").filter(pl.col("event") == "create").first(),
            first("create"),
            first("enter"),
            first("poweroff"),
            first("stop"),
            first("teardown-start"),
            first("teardown-end"),
        )
        .rename({"teardown-start_ts": "teardown_start_ts", "teardown-end_ts": "teardown_end_ts"})
        .sort("vm_seq")
    )
    return windows.with_columns(
        (pl.col("teardown_end_ts") - pl.col("teardown_start_ts")).alias("teardown_marker_ns")
    )


def vcpu_threads(markers: pl.DataFrame) -> pl.DataFrame:
    """The vCPU threads of each VM, from their `enter` markers: vm_seq, vcpu, pid, cpu, ts."""
    enters = _with_vm_seq(markers).filter(pl.col("event") == "enter")
    return enters.select("vm_seq", "vcpu", "pid", "cpu", pl.col("ts").alias("enter_ts"))


def attribute(events: pl.DataFrame, windows: pl.DataFrame, threads: pl.DataFrame) -> pl.DataFrame:
    """Add vm_seq and vcpu to per-event rows (ts, common_pid) by the thread that emitted them.

    The VMM's main thread belongs to a VM from its `create` to its `teardown-end`; a vCPU
    thread from its `enter` on. Events of other threads, or outside those spans, get
    nulls: they are not the VMs' (or the markers did not cover them).
    """
    end = pl.col("teardown_end_ts").fill_null(pl.lit(2**62, pl.Int64))
    main = windows.select(
        pl.col("vmm_pid").alias("pid"),
        "vm_seq",
        pl.lit(None, pl.Int32).alias("vcpu"),
        pl.col("create_ts").alias("start_ts"),
        end.alias("end_ts"),
    )
    vcpus = threads.join(
        windows.select("vm_seq", "teardown_end_ts"), on="vm_seq", maintain_order="left"
    ).select(
        "pid",
        "vm_seq",
        pl.col("vcpu").cast(pl.Int32),
        pl.col("enter_ts").alias("start_ts"),
        end.alias("end_ts"),
    )
    spans = pl.concat([main, vcpus]).sort("start_ts", maintain_order=True)
    joined = (
        events.with_columns(pl.col("common_pid").cast(pl.Int32).alias("_pid"))
        .sort("ts", maintain_order=True)
        .join_asof(
            spans,
            left_on="ts",
            right_on="start_ts",
            by_left="_pid",
            by_right="pid",
            check_sortedness=False,
        )
    )
    inside = pl.col("ts") <= pl.col("end_ts")
    return joined.with_columns(
        pl.when(inside).then(pl.col("vm_seq")).alias("vm_seq"),
        pl.when(inside).then(pl.col("vcpu")).alias("vcpu"),
    ).drop("_pid", "start_ts", "end_ts")


def exit_reasons(exits: pl.DataFrame) -> pl.DataFrame:
    """kvm_exit rows with a `reason` column (`TRAP HVC64`, `IRQ`, ...)."""
    keys = [c for c in ("ret", "esr_ec", "exit_reason") if c in exits.columns]
    kinds = exits.select(keys).unique()
    names = [exit_reason(row) for row in kinds.iter_rows(named=True)]
    table = kinds.with_columns(pl.Series("reason", names, dtype=pl.String))
    return exits.join(table, on=keys, how="left", nulls_equal=True, maintain_order="left")


def exits_by_reason(exits: pl.DataFrame) -> pl.DataFrame:
    """Attributed kvm_exit rows -> vm_seq, vcpu, reason, count (largest first per VM)."""
    named = exit_reasons(exits).filter(pl.col("vm_seq").is_not_null())
    return (
        named.group_by("vm_seq", "vcpu", "reason")
        .agg(pl.len().cast(pl.Int64).alias("count"))
        .sort(["vm_seq", "vcpu", "count", "reason"], descending=[False, False, True, False])
    )


def lifecycle(
    windows: pl.DataFrame, counted: dict[str, pl.DataFrame], vmids: pl.DataFrame | None
) -> pl.DataFrame:
    """Per VM: its steps' durations, event counts and VMID.

    `counted` maps a COUNTED column name to that event's attributed rows (absent events
    are left out and their column is null, never 0). `vmids` is `vm_vmids()` or None.
    cache_toggles counts the kvm_toggle_cache events that changed the cache state, as
    the cache-flush analysis does: a trapped MAIR/TCR/TTBR0 write fires the event too.
    """
    table = windows.select(
        "vm_seq",
        "vm",
        "ipa_bits",
        "vcpus",
        (pl.col("enter_ts") - pl.col("create_ts")).alias("setup_ns"),
        (pl.coalesce("poweroff_ts", "stop_ts") - pl.col("enter_ts")).alias("run_ns"),
        (pl.col("stop_ts").is_not_null() & pl.col("poweroff_ts").is_null()).alias("stopped"),
        "teardown_marker_ns",
    )
    for column in COUNTED:
        rows = counted.get(column)
        if rows is not None and column == "cache_toggles":
            rows = cache_state_changes(rows)
        if rows is None:
            table = table.with_columns(pl.lit(None, pl.Int64).alias(column))
            continue
        counts = rows.filter(pl.col("vm_seq").is_not_null()).group_by("vm_seq").len(column)
        table = table.join(counts, on="vm_seq", how="left").with_columns(
            pl.col(column).fill_null(0).cast(pl.Int64)
        )
    if vmids is not None:
        table = table.join(vmids, on="vm_seq", how="left")
    return table.sort("vm_seq")


VMID_EVENT = "kvm_arm_vmid_update"
VMID_RETURN_EVENT = "kvm_arm_vmid_update_ret"


def vmid_readings(
    entries: pl.DataFrame | None, returns: pl.DataFrame | None
) -> pl.DataFrame | None:
    """The VMID probe's rows at entry and at return, by time (ts, common_pid, vmid_id)."""
    frames = [
        rows.select("ts", "common_pid", "vmid_id")
        for rows in (entries, returns)
        if rows is not None and "vmid_id" in rows.columns
    ]
    if not frames:
        return None
    return pl.concat(frames, how="vertical_relaxed").sort("ts", maintain_order=True)


def vm_vmids(updates: pl.DataFrame, vmid_bits: int) -> pl.DataFrame:
    """Attributed kvm_arm_vmid_update rows -> vm_seq, vmid, vmid_generation, vmid_changes.

    The VMID shown is the last non-zero one seen for the VM; `vmid_changes` counts how many
    times it changed while the VM lived (a rollover in its lifetime gives it a new one).
    """
    span = 1 << vmid_bits
    seen = updates.filter(pl.col("vm_seq").is_not_null() & (pl.col("vmid_id") != 0)).sort(
        "ts", maintain_order=True
    )
    return seen.group_by("vm_seq").agg(
        (pl.col("vmid_id").last() % span).cast(pl.Int64).alias("vmid"),
        (pl.col("vmid_id").last() // span).cast(pl.Int64).alias("vmid_generation"),
        (pl.col("vmid_id").n_unique() - 1).cast(pl.Int64).alias("vmid_changes"),
    )


def vmid_width(updates: pl.DataFrame, recorded: int | None) -> int | None:
    """The VMID width: as a rollover run recorded it, else inferred from the trace."""
    return recorded if recorded is not None else infer_vmid_bits(updates)


def vmids_per_vm(
    prints: pl.DataFrame, updates: pl.DataFrame, recorded_bits: int | None
) -> pl.DataFrame:
    """Per VM of a trace (by its markers): vm_seq, create_ts, vmid, vmid_generation, changes.

    The kvm_arm_vmid_update rows are given to VMs as every other event is (`attribute`).
    """
    markers = vmm_markers(prints)
    bits = vmid_width(updates, recorded_bits)
    windows, threads = vm_windows(markers), vcpu_threads(markers)
    if bits is None or windows.is_empty() or "vmid_id" not in updates.columns:
        return pl.DataFrame(schema={"vm_seq": pl.Int32, "create_ts": pl.Int64})
    found = vm_vmids(attribute(updates, windows, threads), bits)
    return windows.select("vm_seq", "create_ts").join(
        found, on="vm_seq", how="inner", maintain_order="left"
    )


def infer_vmid_bits(updates: pl.DataFrame) -> int | None:
    """VMID width from the smallest non-zero id, valid when generation 1 is in the trace.

    The allocator's first generation is 1 << vmid_bits, so on a freshly booted host the
    smallest id seen has its top bit at vmid_bits. None when no id was seen.
    """
    ids = updates.filter(pl.col("vmid_id") != 0)["vmid_id"]
    if ids.is_empty():
        return None
    return int(ids.min()).bit_length() - 1  # type: ignore[arg-type]


def vmid_rollovers(updates: pl.DataFrame, vmid_bits: int) -> pl.DataFrame:
    """Each first sighting of a newer VMID generation after the first: ts, from/to gen."""
    gens = (
        updates.filter(pl.col("vmid_id") != 0)
        .sort("ts", maintain_order=True)
        .select("ts", (pl.col("vmid_id") // (1 << vmid_bits)).cast(pl.Int64).alias("generation"))
    )
    newest = pl.col("generation").cum_max()
    steps = gens.with_columns(newest.shift(1).alias("from_generation"))
    return steps.filter(pl.col("generation") > pl.col("from_generation")).select(
        "ts", pl.col("from_generation").cast(pl.Int64), pl.col("generation").alias("to_generation")
    )


def hypervisor_events(events: pl.DataFrame) -> list[str]:
    """Names of events the hypervisor (EL2) emitted itself; empty when not recorded."""
    names = events.select(pl.col("event").cast(pl.String), pl.col("system").cast(pl.String))
    hyp = names.filter(
        pl.col("system").is_in(HYP_SYSTEMS)
        | pl.any_horizontal(pl.col("event").str.starts_with(p) for p in HYP_PREFIXES)
    )
    return sorted(hyp["event"].unique().to_list())


def marker_event(event_names: Iterable[str]) -> str:
    """The name this trace gives trace_marker writes; fails naming `print` when absent."""
    names = set(event_names)
    for name in MARKER_EVENTS:
        if name in names:
            return name
    require_events("VM lifecycle", names, NEEDS)
    return MARKER_EVENTS[0]  # not reached: require_events raised


def check_markers(markers: pl.DataFrame) -> None:
    """Fail clearly when the trace's prints hold no VMM `create` marker."""
    if markers.filter(pl.col("event") == "create").is_empty():
        require_events("VM lifecycle", [], {"tracekit-vmm markers": MARKER_HOW})


# PSCI function ids a guest passes in x0 with HVC (Arm DEN0022): the ones worth naming.
PSCI_CALLS = {
    0x84000000: "PSCI_VERSION",
    0x84000002: "CPU_OFF",
    0x84000008: "SYSTEM_OFF",
    0x84000009: "SYSTEM_RESET",
    0xC4000001: "CPU_SUSPEND",
    0xC4000003: "CPU_ON",
    0x84000006: "MIGRATE_INFO_TYPE",
    0x8400000A: "PSCI_FEATURES",
}


def hvc_calls(hvcs: pl.DataFrame) -> pl.DataFrame:
    """Attributed kvm_hvc_arm64 rows -> vm_seq, call (PSCI name or x0 in hex), count."""
    names = pl.DataFrame(
        {"r0": list(PSCI_CALLS), "call": list(PSCI_CALLS.values())},
        schema={"r0": pl.UInt64, "call": pl.String},
    )
    if "r0" not in hvcs.columns:  # enabled but never fired: no field columns to read
        return pl.DataFrame(schema={"vm_seq": pl.Int64, "call": pl.String, "count": pl.UInt32})
    named = hvcs.filter(pl.col("vm_seq").is_not_null()).with_columns(pl.col("r0").cast(pl.UInt64))
    named = named.join(names, on="r0", how="left", maintain_order="left").with_columns(
        pl.col("call").fill_null(pl.format("x0={}", pl.col("r0")))
    )
    return named.group_by("vm_seq", "call").len("count").sort("vm_seq", "call")


def vmid_misses(probe_misses: dict[str, int] | None) -> str | None:
    """What the VMID probes missed in a run, for every VMID and rollover result drawn from
    it (a missed hit is a reading not taken); None: none missed, or not recorded."""
    counts = {e: probe_missed(probe_misses, e) for e in (VMID_EVENT, VMID_RETURN_EVENT)}
    said = [f"{e} {n}" for e, n in counts.items() if n]
    if not said:
        return None
    return f"the VMID kprobes missed hits ({', '.join(said)}; kprobe_profile): readings not taken"


STAGE2_MAP_EVENT = "kvm_pgtable_stage2_map"
STAGE2_MAP_HOW = (
    "the collector's kprobe tracekit/kvm_pgtable_stage2_map with size=$arg3 (the host "
    "kernel's stage-2 map calls, in nVHE and VHE; tracekit collect defines it)"
)


def stage2_mappings(maps: pl.DataFrame) -> pl.DataFrame:
    """Attributed kvm_pgtable_stage2_map entries -> vm_seq, size, maps, mapped (bytes).

    Each call installs at most one page or block of `size` bytes (6.1 mmu.c: user_mem_abort
    passes the fault's mapping size, so 4 KiB pages or 2 MiB/1 GiB blocks; device mappings
    and change_pte map PAGE_SIZE): the stage-2 page sizes the kernel asked for. A call that
    lost a race to another vCPU or found the entry unchanged (-EAGAIN) installs nothing,
    and permission-fault and change_pte calls re-map: `maps` counts calls, not new entries.
    """
    if maps.is_empty() or "size" not in maps.columns:
        return pl.DataFrame(
            schema={"vm_seq": pl.Int32, "size": pl.Int64, "maps": pl.Int64, "mapped": pl.Int64}
        )
    return (
        maps.filter(pl.col("vm_seq").is_not_null())
        .group_by("vm_seq", pl.col("size").cast(pl.Int64))
        .agg(pl.len().cast(pl.Int64).alias("maps"))
        .with_columns((pl.col("size") * pl.col("maps")).alias("mapped"))
        .sort("vm_seq", "size")
    )


def size_name(size: int) -> str:
    """A mapping size as the kernel's sizes are said: 4 KiB, 2 MiB, 1 GiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"
