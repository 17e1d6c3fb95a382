"""tracekit's own tracks: runs, VM lifecycles, time in guest, probe runs, lost events.

These are TrackEvent tracks on their own packet sequence, grouped under one "tracekit"
parent so a newcomer finds them together. Everything is derived from the (windowed)
trace tables and, for runs, the bundle manifest; nothing is read from files here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from tracekit.perfetto.exits import exit_reason
from tracekit.perfetto.protos import TracePacket, TrackEvent
from tracekit.perfetto.writer import (
    SEQ_INCREMENTAL_STATE_CLEARED,
    TRACKS_SEQUENCE,
    PacketWriter,
)

# Track uuids live in a range of their own so they never meet another producer's.
_UUID_BASE = 0x7472_6B00_0000_0000
_MARKER = re.compile(r"^(tracekit-vmm|tracekit-probe):\s*(.*)$")


class TrackWriter:
    """Declares tracks once and writes slices, instants and counters on them."""

    def __init__(self, writer: PacketWriter) -> None:
        self._writer = writer
        self._uuids: dict[str, int] = {}
        self._first = True

    def track(self, key: str, name: str, parent: int | None = None, counter: bool = False) -> int:
        """The uuid of the track called KEY, declaring it on first use."""
        uuid = self._uuids.get(key)
        if uuid is not None:
            return uuid
        uuid = self._uuids[key] = _UUID_BASE + len(self._uuids) + 1
        packet = self._packet()
        packet.track_descriptor.uuid = uuid
        packet.track_descriptor.name = name
        if parent is not None:
            packet.track_descriptor.parent_uuid = parent
        if counter:
            packet.track_descriptor.counter.SetInParent()
        self._writer.write(packet)
        return uuid

    def begin(self, track: int, ts: int, name: str, args: Mapping[str, Any] | None = None) -> None:
        """Open a slice on a track."""
        self._event(track, ts, TrackEvent.TYPE_SLICE_BEGIN, name, args)

    def end(self, track: int, ts: int, args: Mapping[str, Any] | None = None) -> None:
        """Close the innermost open slice of a track."""
        self._event(track, ts, TrackEvent.TYPE_SLICE_END, None, args)

    def instant(
        self, track: int, ts: int, name: str, args: Mapping[str, Any] | None = None
    ) -> None:
        """A zero-length event on a track."""
        self._event(track, ts, TrackEvent.TYPE_INSTANT, name, args)

    def counter(self, track: int, ts: int, value: float) -> None:
        """One counter sample."""
        packet = self._packet(ts)
        packet.track_event.type = TrackEvent.TYPE_COUNTER
        packet.track_event.track_uuid = track
        packet.track_event.double_counter_value = value
        self._writer.write(packet)

    def _event(
        self, track: int, ts: int, kind: int, name: str | None, args: Mapping[str, Any] | None
    ) -> None:
        """Write one TrackEvent with its arguments as debug annotations."""
        packet = self._packet(ts)
        event = packet.track_event
        event.type = kind
        event.track_uuid = track
        if name is not None:
            event.name = name
        for key, value in (args or {}).items():
            _annotate(event.debug_annotations.add(name=key), value)
        self._writer.write(packet)

    def _packet(self, ts: int | None = None) -> TracePacket:
        """A packet on the tracks sequence (the first one clears incremental state)."""
        packet = TracePacket(trusted_packet_sequence_id=TRACKS_SEQUENCE)
        if ts is not None:
            packet.timestamp = ts
        if self._first:
            packet.sequence_flags = SEQ_INCREMENTAL_STATE_CLEARED
            self._first = False
        return packet


def _annotate(annotation: Any, value: Any) -> None:
    """Store a Python value in a DebugAnnotation of the matching kind."""
    if isinstance(value, bool):
        annotation.bool_value = value
    elif isinstance(value, int):
        annotation.int_value = value
    elif isinstance(value, float):
        annotation.double_value = value
    else:
        annotation.string_value = str(value)


def write_tracks(
    writer: PacketWriter,
    tables: Mapping[str, pl.DataFrame],
    lost: pl.DataFrame,
    runs: Sequence[Mapping[str, Any]] = (),
    end_ts: int | None = None,
) -> None:
    """Write every tracekit track the data allows."""
    tracks = TrackWriter(writer)
    root = tracks.track("root", "tracekit")
    write_runs(tracks, root, runs)
    markers = list(_markers(tables.get("print")))
    write_vm_lifecycles(tracks, root, markers, end_ts)
    write_probe_runs(tracks, root, markers, end_ts)
    write_guest_time(tracks, root, tables.get("kvm_entry"), tables.get("kvm_exit"), end_ts)
    write_lost(tracks, root, lost)


def write_runs(tracks: TrackWriter, root: int, runs: Sequence[Mapping[str, Any]]) -> None:
    """Phases and runs of a bundle as slices (runs without both times are skipped).

    Runs should not overlap; if some do, the later ones go to extra lanes, since slices
    on one track must nest.
    """
    timed = [r for r in runs if r.get("start_ns") is not None and r.get("end_ns") is not None]
    lane_ends: list[int] = []
    for run in sorted(timed, key=lambda r: (r["start_ns"], r["end_ns"])):
        start, end = int(run["start_ns"]), max(int(run["start_ns"]), int(run["end_ns"]))
        lane = next((i for i, busy in enumerate(lane_ends) if busy <= start), len(lane_ends))
        if lane == len(lane_ends):
            lane_ends.append(end)
        lane_ends[lane] = end
        suffix = f" ({lane + 1})" if lane else ""
        track = tracks.track(f"runs:{lane}", f"tracekit: phases and runs{suffix}", root)
        name = " ".join(str(run.get(k, "")) for k in ("phase", "kind") if run.get(k))
        args = {k: run[k] for k in ("run_id", "phase", "kind", "status", "note") if run.get(k)}
        tracks.begin(track, start, f"{name} #{run.get('index', '?')}", args)
        tracks.end(track, end)


def _markers(prints: pl.DataFrame | None) -> Iterable[tuple[int, int, str, dict[str, str]]]:
    """(ts, pid, tool, key=value fields) of every tracekit trace marker."""
    if prints is None or "buf" not in prints.columns:
        return
    for ts, pid, buf in prints.select("ts", "common_pid", "buf").iter_rows():
        match = _MARKER.match((buf or "").strip())
        if match:
            fields = dict(p.split("=", 1) for p in match.group(2).split() if "=" in p)
            yield ts, pid, match.group(1), fields


def write_vm_lifecycles(
    tracks: TrackWriter,
    root: int,
    markers: Sequence[tuple[int, int, str, dict[str, str]]],
    end_ts: int | None,
) -> None:
    """Per VM: a lifetime slice (create..teardown-end) holding run and teardown slices."""
    group: int | None = None
    open_slices: dict[str, list[str]] = {}
    for ts, _pid, tool, fields in markers:
        if tool != "tracekit-vmm" or "vm" not in fields or "event" not in fields:
            continue
        vm, event = fields["vm"], fields["event"]
        if group is None:
            group = tracks.track("vms", "tracekit: VMs", root)
        track = tracks.track(f"vm:{vm}", f"VM {vm}", group)
        stack = open_slices.setdefault(vm, [])
        args = {k: v for k, v in fields.items() if k not in ("vm", "event")}
        _vm_event(tracks, track, stack, ts, event, args)
    for vm, stack in open_slices.items():
        for _ in stack:
            tracks.end(tracks.track(f"vm:{vm}", f"VM {vm}"), end_ts or 0, {"unfinished": True})


def _vm_event(
    tracks: TrackWriter, track: int, stack: list[str], ts: int, event: str, args: dict[str, str]
) -> None:
    """Apply one lifecycle marker to a VM's slice stack."""
    opens = {"create": "VM lifetime", "enter": "running", "teardown-start": "teardown"}
    closes = {"poweroff": "running", "teardown-end": "teardown"}
    if event in opens:
        tracks.begin(track, ts, opens[event], args)
        stack.append(opens[event])
    elif event in closes and closes[event] in stack:
        while stack and stack[-1] != closes[event]:
            tracks.end(track, ts)
            stack.pop()
        tracks.end(track, ts, args)
        stack.pop()
        if event == "teardown-end" and stack == ["VM lifetime"]:
            tracks.end(track, ts)
            stack.pop()
    else:
        tracks.instant(track, ts, event, args)


def write_probe_runs(
    tracks: TrackWriter,
    root: int,
    markers: Sequence[tuple[int, int, str, dict[str, str]]],
    end_ts: int | None,
) -> None:
    """The TLBI probe's measuring windows (start..stop markers) per probe CPU."""
    started: dict[int, tuple[int, str]] = {}
    for ts, pid, tool, fields in markers:
        if tool != "tracekit-probe":
            continue
        if fields.get("event") == "start":
            cpu = fields.get("cpu", "?")
            track = tracks.track(f"probe:{cpu}", f"tracekit: TLBI probe on CPU {cpu}", root)
            tracks.begin(track, ts, f"probe {fields.get('mode', '')}".strip(), fields)
            started[pid] = (track, cpu)
        elif fields.get("event") == "stop" and pid in started:
            track, _cpu = started.pop(pid)
            tracks.end(track, ts, fields)
    for track, _cpu in started.values():
        tracks.end(track, end_ts or 0, {"unfinished": True})


def write_guest_time(
    tracks: TrackWriter,
    root: int,
    entries: pl.DataFrame | None,
    exits: pl.DataFrame | None,
    end_ts: int | None,
) -> None:
    """Per vCPU thread, an "in guest" slice from kvm_entry to kvm_exit, named by reason."""
    if entries is None or exits is None:
        return
    group = tracks.track("guest", "tracekit: time in guest (per vCPU thread)", root)
    fields = [c for c in exits.columns if c not in ("row", "ts", "cpu", "common_pid")]
    both = pl.concat(
        [
            entries.select("row", "ts", "common_pid"),
            exits.select("row", "ts", "common_pid", pl.struct(*fields).alias("exit")),
        ],
        how="diagonal_relaxed",
    ).sort("row")
    # Slices are written when they close, so each carries its exit reason as its name.
    inside: dict[int, int] = {}
    for _row, ts, tid, exit_fields in both.iter_rows():
        track = tracks.track(f"guest:{tid}", f"vCPU thread {tid}: in guest", group)
        if exit_fields is None:
            if tid in inside:  # two entries without an exit between them
                tracks.begin(track, inside[tid], "in guest (exit not recorded)")
                tracks.end(track, ts)
            inside[tid] = ts
        elif tid in inside:
            reason = exit_reason(exit_fields)
            args = {k: v for k, v in exit_fields.items() if v is not None}
            tracks.begin(track, inside.pop(tid), f"guest: {reason}", args)
            tracks.end(track, ts)
    for tid, ts in inside.items():
        track = tracks.track(f"guest:{tid}", "")
        tracks.begin(track, ts, "in guest (trace ends)")
        tracks.end(track, max(ts, end_ts or 0))


def write_lost(tracks: TrackWriter, root: int, lost: pl.DataFrame) -> None:
    """Each timed loss report as an instant, so gaps are visible where they happened."""
    timed = lost.filter(pl.col("ts").is_not_null()).sort("ts", "cpu")
    if timed.is_empty():
        return
    track = tracks.track("lost", "tracekit: lost events", root)
    for cpu, ts, count, source, detail in timed.select(
        "cpu", "ts", "count", "source", "detail"
    ).iter_rows():
        args = {"cpu": cpu, "source": source, "detail": detail or ""}
        if count is not None:
            args["count"] = count
        tracks.instant(track, ts, f"lost events on CPU {cpu}", args)
