"""The scenarios' tracks: VM lifecycles with teardown spans, stage-2 flushes, TLBI loops.

- Per VM (from the VMM's trace markers, reproducer/README.md "Trace markers"): its
  lifetime, each vCPU's run and its teardown, with the requested IPA size and, when the
  collector's kprobe on kvm_arm_vmid_update was recorded, its VMID; under it, the
  kernel's teardown path as the entry/return kprobe spans of the VMM's main thread
  between teardown-start and teardown-end (entry-only probes as instants).
- Per vCPU thread: each full stage-2 flush that kvm_toggle_cache or kvm_set_way_flush
  stands for, timed as tracekit.analysis.cacheflush times them (the flush function's
  entry/return kprobes when recorded, else the span to the neighbouring event: an upper
  bound, said in the slice's `method`).
- Per CPU: a tlbi-loop guest's run (enter..poweroff, or ..teardown when stopped by a
  signal), when the variant is known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.analysis.calls import pair_calls, returns_missed, unclosed_call
from tracekit.analysis.vm import marker_table, vmids_per_vm
from tracekit.perfetto.events import is_derived
from tracekit.perfetto.tracks import Span, TrackWriter, write_spans

if TYPE_CHECKING:
    from tracekit.perfetto.timeline import Marker

VMID_EVENT = "kvm_arm_vmid_update"
TLBI_LOOP = "tlbi-loop"
MAX_VM_TRACKS = 16
_COMMON = ("row", "ts", "cpu", "common_pid")


@dataclass
class VmLife:
    """One VM of one VMM invocation, as its markers tell it."""

    vm: str
    invocation: int
    pid: int
    created: int
    facts: dict[str, Any] = field(default_factory=dict)
    enters: list[tuple[int, int, dict[str, str]]] = field(default_factory=list)
    poweroffs: dict[str, int] = field(default_factory=dict)
    teardown: list[int] = field(default_factory=list)
    others: list[tuple[int, str, dict[str, str]]] = field(default_factory=list)
    seen_create: bool = True

    @property
    def end(self) -> int | None:
        """teardown-end, if the trace has it."""
        return self.teardown[1] if len(self.teardown) > 1 else None


@dataclass
class Call:
    """One kprobed kernel call: entry (and return when a return probe was recorded)."""

    pid: int
    function: str
    start: int
    end: int | None
    args: dict[str, Any]
    returns_probed: bool
    # Without an end: the analysis's (label, sentence) of what the missing return may be.
    unclosed: tuple[str, str] | None = None


def table(tables: Mapping[str, pl.DataFrame], name: str) -> pl.DataFrame | None:
    """An event's table by name, also when ingest qualified it ("kvm:name") for a clash."""
    if name in tables:
        return tables[name]
    found = [t for n, t in tables.items() if n.split(":", 1)[-1] == name and n.startswith("kvm:")]
    return found[0] if found else None


def vm_lives(markers: Sequence[Marker]) -> list[VmLife]:
    """Every VM the VMM markers show, in creation order (vm=0 create starts an invocation)."""
    lives: list[VmLife] = []
    current: dict[str, VmLife] = {}
    invocation = -1
    for ts, pid, tool, fields in markers:
        if tool != "tracekit-vmm" or "vm" not in fields or "event" not in fields:
            continue
        vm, event = fields["vm"], fields["event"]
        args = {k: v for k, v in fields.items() if k not in ("vm", "event")}
        if event == "create" or vm not in current:
            if invocation < 0 or (event == "create" and vm == "0"):
                invocation += 1
            life = VmLife(vm, invocation, pid, ts, seen_create=event == "create")
            current[vm] = life
            lives.append(life)
            if event == "create":
                life.facts.update(args)
                continue
        life = current[vm]
        if event == "enter":
            life.enters.append((ts, pid, args))
        elif event == "poweroff":
            life.poweroffs.setdefault(args.get("vcpu", "?"), ts)
        elif event in ("teardown-start", "teardown-end"):
            life.teardown.append(ts)
        else:
            life.others.append((ts, event, args))
    return lives


def kprobe_calls(
    tables: Mapping[str, pl.DataFrame], probe_misses: Mapping[str, int] | None = None
) -> list[Call]:
    """Entry kprobes (with `__probe_ip`) with their `<name>_ret` returns, as analysis pairs
    them; `probe_misses` (the run's RunRecord.probe_misses) says which missing returns may
    be the kretprobe's misses."""
    # A text trace's kprobes have only the symbol columns (`__probe_ip_sym`).
    entries = {n.split(":")[-1]: t for n, t in tables.items() if _has(t, "__probe_ip")}
    returns = {
        n.split(":")[-1].removesuffix("_ret"): t
        for n, t in tables.items()
        if _has(t, "__probe_func") and n.endswith("_ret")
    }
    calls: list[Call] = []
    for function, entry in entries.items():
        own = [
            c
            for c in entry.columns
            if c not in (*_COMMON, "__probe_ip", "__probe_ip_sym")
            and not is_derived(c, entry.schema)
        ]
        missed = returns_missed(probe_misses, function)
        paired, _orphans = pair_calls(entry, returns.get(function), missed)
        rows = paired.join(
            entry.select(pl.col("row").cast(pl.Int64).alias("entry_row"), *own),
            on="entry_row",
            how="left",
        )
        for row in rows.iter_rows(named=True):
            args = _args(row, own)
            probed = function in returns
            unclosed = None
            if probed and row["end_ts"] is None:
                unclosed = unclosed_call(row["maybe_missed_return"])
            calls.append(
                Call(row["pid"], function, row["start_ts"], row["end_ts"], args, probed, unclosed)
            )
    return sorted(calls, key=lambda c: c.start)


def _has(events: pl.DataFrame, field: str) -> bool:
    """Whether a table has a probe field, as an address or (text traces) its symbol."""
    return field in events.columns or f"{field}_sym" in events.columns


def _args(row: Mapping[str, Any], own: Sequence[str]) -> dict[str, Any]:
    """A probe's fetched arguments (non-null)."""
    return {k: row[k] for k in own if row[k] is not None}


def vmids(
    lives: Sequence[VmLife], tables: Mapping[str, pl.DataFrame], bits: int | None = None
) -> dict[int, dict[str, int]]:
    """Per VM (index in `lives`): its VMID and generation, as tracekit.analysis.vm finds them.

    The kprobe reads kvm_vmid's 64-bit id, generation above the VMID bits (`bits` as a
    rollover run recorded it, else inferred as the report does).
    """
    updates, prints = tables.get(VMID_EVENT), marker_table(tables)
    if updates is None or prints is None or "vmid_id" not in updates.columns:
        return {}
    per_vm = vmids_per_vm(prints, updates, bits)
    by_create = {int(r["create_ts"]): r for r in per_vm.iter_rows(named=True)}
    found: dict[int, dict[str, int]] = {}
    for n, life in enumerate(lives):
        row = by_create.get(life.created) if life.seen_create else None
        if row is not None and row.get("vmid") is not None:
            found[n] = {"vmid": row["vmid"], "vmid_generation": row["vmid_generation"]}
    return found


def write_scenario_tracks(
    tracks: TrackWriter,
    parent: int,
    tables: Mapping[str, pl.DataFrame],
    markers: Sequence[Marker],
    events: pl.DataFrame | None,
    end_ts: int | None,
    scope: str = "",
    vmm_runs: Sequence[Mapping[str, str]] = (),
    vmid_bits: int | None = None,
    probe_misses: Mapping[str, int] | None = None,
) -> None:
    """VM lifecycles with teardown spans, flush spans per vCPU, TLBI loops per CPU;
    `probe_misses`: the run's kprobe misses (RunRecord.probe_misses), None: not recorded."""
    lives = vm_lives(markers)
    calls = kprobe_calls(tables, probe_misses)
    if lives:
        write_vm_lifecycles(tracks, parent, lives, tables, calls, end_ts, scope, vmid_bits)
        write_tlbi_loops(tracks, parent, lives, vmm_runs, end_ts, scope)
    write_flushes(tracks, parent, tables, lives, calls, events, scope)


def write_vm_lifecycles(
    tracks: TrackWriter,
    parent: int,
    lives: Sequence[VmLife],
    tables: Mapping[str, pl.DataFrame],
    calls: Sequence[Call],
    end_ts: int | None,
    scope: str = "",
    vmid_bits: int | None = None,
) -> None:
    """Per VM: lifetime holding vCPU runs and the teardown; the kernel's teardown path below.

    A VM index reused (several VMM invocations) shares its track; past MAX_VM_TRACKS
    indexes (e.g. a VMID-rollover run's throwaway VMs) every VM goes on one track, its
    slices named with the VM, so the UI is not flooded with tracks.
    """
    group = tracks.track(f"{scope}vms", "tracekit: VMs", parent)
    found = vmids(lives, tables, vmid_bits)
    shared = len({life.vm for life in lives}) > MAX_VM_TRACKS
    by_track: dict[str, list[Span]] = {}  # track name -> its spans, over every VM
    for n, life in enumerate(lives):
        name = f"all {len(lives)} VMs" if shared else f"VM {life.vm}"
        prefix = f"VM {life.vm}: " if shared else ""
        facts = {**life.facts, **found.get(n, {})}
        by_track.setdefault(name, []).extend(_vm_spans(life, facts, end_ts or 0, prefix))
        kernel = by_track.setdefault(f"{name}: teardown in the kernel (kprobes)", [])
        kernel.extend(_teardown_calls(life, calls, end_ts or 0, prefix))
    for name, spans in by_track.items():
        if spans:
            write_spans(tracks, f"{scope}vm:{name}", name, group, spans)


def _vm_spans(life: VmLife, facts: dict[str, Any], last: int, prefix: str) -> list[Span]:
    """One VM's lifetime, vCPU runs, teardown and other markers as spans."""
    lifetime = {**facts, "vmm_pid": life.pid}
    if not life.seen_create:
        lifetime["created"] = "before the trace started"
    if life.end is None:
        lifetime["unfinished"] = True
    end = life.end or max(last, life.created)
    spans: list[Span] = [(life.created, end, f"{prefix}VM lifetime", lifetime)]
    for ts, pid, args in life.enters:
        vcpu = args.get("vcpu", "?")
        stop = life.poweroffs.get(vcpu) or (life.teardown[:1] or [max(last, ts)])[0]
        spans.append((ts, stop, f"{prefix}vCPU {vcpu} running", {**args, "thread": pid}))
    if life.teardown:
        start, stop = life.teardown[0], life.end or max(last, life.teardown[0])
        args = {k: v for k, v in facts.items() if k != "vcpus"}
        if life.end is not None:
            args["teardown_ns"] = stop - start
        ipa = f" (IPA {facts['ipa_bits']} bits)" if "ipa_bits" in facts else ""
        spans.append((start, stop, f"{prefix}teardown{ipa}", args))
    spans += [(ts, None, f"{prefix}{event}", args) for ts, event, args in life.others]
    return spans


def _teardown_calls(life: VmLife, calls: Sequence[Call], last: int, prefix: str) -> list[Span]:
    """The kprobed calls of the VMM's main thread during one VM's teardown."""
    if not life.teardown:
        return []
    start, stop = life.teardown[0], life.end or max(last, life.teardown[0])
    spans: list[Span] = []
    for call in calls:
        if call.pid != life.pid or not start <= call.start <= stop:
            continue
        if not call.returns_probed:
            spans.append((call.start, None, f"{prefix}{call.function}", call.args))
        elif call.end is None:
            short, said = call.unclosed or unclosed_call(None)
            label = f"{prefix}{call.function} ({short})"
            spans.append((call.start, stop, label, {**call.args, "missing_return": said}))
        else:
            spans.append((call.start, call.end, f"{prefix}{call.function}", call.args))
    return spans


def write_tlbi_loops(
    tracks: TrackWriter,
    parent: int,
    lives: Sequence[VmLife],
    vmm_runs: Sequence[Mapping[str, str]],
    end_ts: int | None,
    scope: str = "",
) -> None:
    """A tlbi-loop guest's time between its enter and poweroff markers, on its CPU."""
    for life in lives:
        if (
            life.invocation >= len(vmm_runs)
            or vmm_runs[life.invocation].get("variant") != TLBI_LOOP
        ):
            continue
        run = vmm_runs[life.invocation]
        for ts, pid, args in life.enters:
            cpu = args.get("cpu", "?")
            ended = life.teardown[:1] or [max(end_ts or 0, ts)]  # stopped: until teardown
            stop = life.poweroffs.get(args.get("vcpu", "?")) or ended[0]
            info = {"vm": life.vm, "thread": pid, **args, "tlbi_count": run.get("tlbi_count", "?")}
            name = f"CPU {cpu}: guest TLBI loop"
            write_spans(tracks, f"{scope}tlbi:{cpu}", name, parent, [(ts, stop, "TLBI loop", info)])


def write_flushes(
    tracks: TrackWriter,
    parent: int,
    tables: Mapping[str, pl.DataFrame],
    lives: Sequence[VmLife],
    calls: Sequence[Call],
    events: pl.DataFrame | None,
    scope: str = "",
) -> None:
    """Per vCPU thread: the full stage-2 flushes of cache toggles and set/way operations."""
    from tracekit.analysis import cacheflush

    toggles, setways = table(tables, "kvm_toggle_cache"), table(tables, "kvm_set_way_flush")
    if toggles is None and setways is None:
        return
    flushes = cacheflush.flush_rows(toggles, setways)
    probed = [c for c in calls if c.function in cacheflush.FLUSH_FUNCTIONS and c.end is not None]
    if probed:
        spans = pl.DataFrame(
            [(c.pid, c.start, c.end, c.end - c.start) for c in probed],  # type: ignore[operator]
            schema={"pid": pl.Int32, "start_ts": pl.Int64, "end_ts": pl.Int64, "dur_ns": pl.Int64},
            orient="row",
        )
        timed = cacheflush.probe_durations(flushes, spans)
    elif events is not None:
        timed = cacheflush.neighbour_durations(flushes, events.select("row", "ts", "cpu"))
    else:
        timed = flushes.with_columns(
            pl.lit(None, pl.Int64).alias("dur_ns"), pl.lit("").alias("method")
        )
    names = {
        pid: (life.vm, args.get("vcpu", "?")) for life in lives for _ts, pid, args in life.enters
    }
    group = tracks.track(f"{scope}flush", "tracekit: stage-2 flushes (per vCPU thread)", parent)
    for (pid,), rows in timed.sort("ts").group_by(["common_pid"], maintain_order=True):
        vm, vcpu = names.get(pid, ("?", "?"))
        name = f"VM {vm} vCPU {vcpu} (thread {pid}): stage-2 flushes"
        spans = [_flush_span(row) for row in rows.iter_rows(named=True)]
        write_spans(tracks, f"{scope}flush:{pid}", name, group, spans)


def _flush_span(row: Mapping[str, Any]) -> Span:
    """One flush event as a slice (toggle: flush before it; set/way: after) or an instant."""
    args = {"cpu": row["cpu"], "event_source": row["source"], "method": row.get("method") or ""}
    what = "cache toggle" if row["source"] == "toggle" else "set/way"
    if not row["flushed"]:
        return (row["ts"], None, f"{what} (no flush: caches unchanged)", args)
    dur = row.get("dur_ns")
    if dur is None:
        return (row["ts"], None, f"stage-2 flush ({what}, duration unknown)", args)
    args["dur_ns"] = dur
    if row["source"] == "toggle":
        return (row["ts"] - dur, row["ts"], f"stage-2 flush ({what})", args)
    return (row["ts"], row["ts"] + dur, f"stage-2 flush ({what})", args)
