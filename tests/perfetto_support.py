"""Helpers of the Perfetto tests: read an export back as tracks, slices and counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit.perfetto.protos import FtraceEvent, TracePacket, TrackEvent, pb
from tracekit.perfetto.writer import read_packets


@dataclass
class Slice:
    """One slice rebuilt from its begin/end pair (or an instant: end == start)."""

    start: int
    end: int
    name: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Export:
    """An export read back: tracks by name (with their parents), slices, counters."""

    names: dict[int, str]
    parents: dict[int, int]
    descriptions: dict[int, str]
    slices: dict[str, list[Slice]]
    counters: dict[str, list[tuple[int, float]]]
    packets: list[Any]

    def path(self, name: str) -> list[str]:
        """The names from the root down to the (first) track called NAME."""
        uuid = next(u for u, n in self.names.items() if n == name)
        chain = [name]
        while self.parents.get(uuid):
            uuid = self.parents[uuid]
            chain.insert(0, self.names[uuid])
        return chain

    def children(self, name: str) -> list[str]:
        """Names of the tracks directly under the (first) track called NAME."""
        uuid = next(u for u, n in self.names.items() if n == name)
        return [self.names[u] for u, p in self.parents.items() if p == uuid]

    def description(self, name: str) -> str:
        """The description of the (first) track called NAME."""
        return self.descriptions[next(u for u, n in self.names.items() if n == name)]


def _arg(annotation: Any) -> Any:
    """A debug annotation's value."""
    kind = annotation.WhichOneof("value")
    return getattr(annotation, kind) if kind else None


def read_export(path: Path) -> Export:
    """Decode a .pftrace into tracks, slices (per track name) and counter samples."""
    packets = [TracePacket.FromString(raw) for raw in read_packets(path)]
    names: dict[int, str] = {}
    parents: dict[int, int] = {}
    descriptions: dict[int, str] = {}
    open_slices: dict[int, list[Slice]] = {}
    slices: dict[str, list[Slice]] = {}
    counters: dict[str, list[tuple[int, float]]] = {}
    for p in packets:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            names[d.uuid], parents[d.uuid] = d.name, d.parent_uuid
            descriptions[d.uuid] = d.description
        if not p.HasField("track_event"):
            continue
        event, uuid = p.track_event, p.track_event.track_uuid
        args = {a.name: _arg(a) for a in event.debug_annotations}
        if event.type == TrackEvent.TYPE_SLICE_BEGIN:
            open_slices.setdefault(uuid, []).append(Slice(p.timestamp, -1, event.name, args))
        elif event.type == TrackEvent.TYPE_SLICE_END:
            done = open_slices[uuid].pop()
            done.end = p.timestamp
            slices.setdefault(names[uuid], []).append(done)
        elif event.type == TrackEvent.TYPE_INSTANT:
            slices.setdefault(names[uuid], []).append(
                Slice(p.timestamp, p.timestamp, event.name, args)
            )
        elif event.type == TrackEvent.TYPE_COUNTER:
            counters.setdefault(names[uuid], []).append((p.timestamp, event.double_counter_value))
    return Export(names, parents, descriptions, slices, counters, packets)


SchedSwitchFtraceEvent = pb.SchedSwitchFtraceEvent
SchedWakingFtraceEvent = pb.SchedWakingFtraceEvent


def ftrace_events(packets: list[Any]) -> list[tuple[int, Any]]:
    """(cpu, FtraceEvent) of every ftrace event, compact sched ones rebuilt as the importer
    does (prev_pid, prev_prio and pid from the CPU's previous switch, a waking's pid from
    the task its CPU runs; prev_comm from that switch's next_comm), per CPU in time order."""
    per_cpu: dict[int, list[tuple[int, int, Any]]] = {}
    for p in packets:
        if not p.HasField("ftrace_events"):
            continue
        bundle, cpu = p.ftrace_events, p.ftrace_events.cpu
        entries = per_cpu.setdefault(cpu, [])
        entries.extend((e.timestamp, len(entries) + i, e) for i, e in enumerate(bundle.event))
        entries.extend(_compact(bundle.compact_sched, len(entries) + len(bundle.event)))
    out: list[tuple[int, Any]] = []
    for cpu, entries in per_cpu.items():
        last: dict[str, Any] = {}
        for _, _, event in sorted(entries, key=lambda e: (e[0], e[1])):
            if isinstance(event, tuple):
                event = _rebuilt(event, last)
            if event.WhichOneof("event") == "sched_switch":
                s = event.sched_switch
                last.update(pid=s.next_pid, prio=s.next_prio, comm=s.next_comm, ts=event.timestamp)
            out.append((cpu, event))
    return out


def _compact(compact: Any, base: int) -> list[tuple[int, int, Any]]:
    """Compact sched entries as (ts, order, (kind, values)) with absolute timestamps."""
    rows: list[tuple[int, int, Any]] = []
    table = list(compact.intern_table)
    ts = 0
    for i, delta in enumerate(compact.switch_timestamp):
        ts += delta
        comm = table[compact.switch_next_comm_index[i]]
        values = (compact.switch_prev_state[i], compact.switch_next_pid[i],
                  compact.switch_next_prio[i], comm)  # fmt: skip
        rows.append((ts, base + i, ("switch", ts, values)))
    ts = 0
    flags = list(compact.waking_common_flags)
    for i, delta in enumerate(compact.waking_timestamp):
        ts += delta
        values = (compact.waking_pid[i], compact.waking_target_cpu[i], compact.waking_prio[i],
                  table[compact.waking_comm_index[i]], flags[i] if flags else 0)  # fmt: skip
        rows.append((ts, base + len(rows), ("waking", ts, values)))
    return rows


def _rebuilt(entry: tuple[str, int, tuple[Any, ...]], last: dict[str, Any]) -> Any:
    """A compact entry as the FtraceEvent the importer infers."""
    kind, ts, values = entry
    event = FtraceEvent(timestamp=ts, pid=last["pid"])
    if kind == "switch":
        state, pid, prio, comm = values
        event.sched_switch.CopyFrom(
            SchedSwitchFtraceEvent(
                prev_comm=last["comm"],
                prev_pid=last["pid"],
                prev_prio=last["prio"],
                prev_state=state,
                next_comm=comm,
                next_pid=pid,
                next_prio=prio,
            )
        )
    else:
        pid, target, prio, comm, _ = values
        event.sched_waking.CopyFrom(
            SchedWakingFtraceEvent(comm=comm, pid=pid, prio=prio, target_cpu=target)
        )
    return event
