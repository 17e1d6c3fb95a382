"""tracekit's own tracks: the track writer, nested spans, and one trace's tracks.

These are TrackEvent tracks on their own packet sequence, grouped under one "tracekit"
parent so a newcomer finds them together (a bundle's runs each get a group of their
own: runs.py). Everything is derived from the (windowed) trace tables; nothing is read
from files here. VM lifecycles and the scenarios' spans are in scenario.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from tracekit.analysis.exits import exit_reason
from tracekit.perfetto.protos import CounterDescriptor, TracePacket, TrackDescriptor, TrackEvent
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

    def track(
        self,
        key: str,
        name: str,
        parent: int | None = None,
        counter: bool = False,
        *,
        description: str = "",
        unit_ns: bool = False,
        rank: int | None = None,
        ordering: str = "",
    ) -> int:
        """The uuid of the track called KEY, declaring it on first use.

        `rank` orders siblings under a parent whose `ordering` is "EXPLICIT"; `unit_ns`
        makes a counter's values nanoseconds, so the UI prints them as times.
        """
        uuid = self._uuids.get(key)
        if uuid is not None:
            return uuid
        uuid = self._uuids[key] = _UUID_BASE + len(self._uuids) + 1
        packet = self._packet()
        track = packet.track_descriptor
        track.uuid = uuid
        track.name = name
        if parent is not None:
            track.parent_uuid = parent
        if description:
            track.description = description
        if counter:
            track.counter.SetInParent()
            if unit_ns:
                track.counter.unit = CounterDescriptor.UNIT_TIME_NS
        if rank is not None:
            track.sibling_order_rank = rank
        if ordering:
            track.child_ordering = TrackDescriptor.ChildTracksOrdering.Value(ordering)
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


Span = tuple[int, int | None, str, Mapping[str, Any]]
"""(start, end, name, args) of a slice; end None makes it an instant."""


def write_spans(
    tracks: TrackWriter,
    key: str,
    name: str,
    parent: int,
    spans: Iterable[Span],
    description: str = "",
    rank: int | None = None,
) -> None:
    """Spans as slices on one track; a span that would not nest goes to an extra lane.

    Slices on one track must nest (trace_processor rejects a partial overlap), so the
    first lane where a span fits inside or after the open ones takes it; extra lanes are
    tracks of their own, named "NAME (2)", "NAME (3)", ...
    """
    lanes: list[list[Span]] = []
    open_ends: list[list[int]] = []
    for start, end, label, args in sorted(spans, key=lambda s: (s[0], -(s[1] or s[0]))):
        stop = start if end is None else max(start, end)
        lane = _free_lane(open_ends, start, stop)
        if lane == len(lanes):
            lanes.append([])
            open_ends.append([])
        if end is not None:
            open_ends[lane].append(stop)
        lanes[lane].append((start, None if end is None else stop, label, args))
    for lane, items in enumerate(lanes):
        label = name if lane == 0 else f"{name} ({lane + 1})"
        track = tracks.track(f"{key}#{lane}", label, parent, description=description, rank=rank)
        _write_nested(tracks, track, items)


def _free_lane(open_ends: list[list[int]], start: int, stop: int) -> int:
    """The first lane where [start, stop] nests (its closed slices dropped), or a new one."""
    for lane, ends in enumerate(open_ends):
        while ends and ends[-1] <= start:
            ends.pop()
        if not ends or stop <= ends[-1]:
            return lane
    return len(open_ends)


def _write_nested(tracks: TrackWriter, track: int, spans: Sequence[Span]) -> None:
    """Begin/end events of properly nested spans (sorted by start, longest first)."""
    ends: list[int] = []
    for start, end, label, args in spans:
        while ends and ends[-1] <= start:
            tracks.end(track, ends.pop())
        if end is None:
            tracks.instant(track, start, label, args)
        else:
            tracks.begin(track, start, label, args)
            ends.append(end)
    while ends:
        tracks.end(track, ends.pop())


def write_trace_tracks(
    tracks: TrackWriter,
    parent: int,
    tables: Mapping[str, pl.DataFrame],
    lost: pl.DataFrame,
    end_ts: int | None,
    scope: str = "",
    events: pl.DataFrame | None = None,
    vmm_runs: Sequence[Mapping[str, str]] = (),
) -> None:
    """Every track one trace allows, under PARENT; SCOPE keeps one run's tracks apart.

    `events` (row, ts, cpu) times flushes by their neighbours when no flush kprobe was
    recorded; `vmm_runs` are the VMM's `run` records (a bundle's vmm.txt), whose guest
    variants say which VM was a TLBI loop.
    """
    from tracekit.perfetto.scenario import write_scenario_tracks

    markers = list(markers_of(tables.get("print")))
    write_scenario_tracks(tracks, parent, tables, markers, events, end_ts, scope, vmm_runs)
    write_probe_runs(tracks, parent, markers, end_ts, scope)
    write_guest_time(tracks, parent, tables.get("kvm_entry"), tables.get("kvm_exit"), end_ts, scope)
    write_lost(tracks, parent, lost, scope)


def write_tracks(
    writer: PacketWriter,
    tables: Mapping[str, pl.DataFrame],
    lost: pl.DataFrame,
    runs: Sequence[Mapping[str, Any]] = (),
    end_ts: int | None = None,
) -> None:
    """One trace's tracks (and a bundle's phases and runs) under a new "tracekit" root."""
    from tracekit.perfetto.runs import write_phases

    tracks = TrackWriter(writer)
    root = tracks.track("root", "tracekit", ordering="EXPLICIT")
    write_phases(tracks, root, runs)
    write_trace_tracks(tracks, root, tables, lost, end_ts)


Marker = tuple[int, int, str, dict[str, str]]
"""(ts, pid, tool, key=value fields) of one tracekit trace marker."""


def markers_of(prints: pl.DataFrame | None) -> Iterable[Marker]:
    """Every tracekit trace marker (tracekit-vmm, tracekit-probe) of a print table."""
    if prints is None or "buf" not in prints.columns:
        return
    for ts, pid, buf in prints.select("ts", "common_pid", "buf").iter_rows():
        match = _MARKER.match((buf or "").strip())
        if match:
            fields = dict(p.split("=", 1) for p in match.group(2).split() if "=" in p)
            yield ts, pid, match.group(1), fields


def write_probe_runs(
    tracks: TrackWriter,
    root: int,
    markers: Sequence[Marker],
    end_ts: int | None,
    scope: str = "",
) -> None:
    """The TLBI probe's measuring windows (start..stop markers) per probe CPU."""
    started: dict[int, tuple[int, str]] = {}
    for ts, pid, tool, fields in markers:
        if tool != "tracekit-probe":
            continue
        if fields.get("event") == "start":
            cpu = fields.get("cpu", "?")
            track = tracks.track(f"{scope}probe:{cpu}", f"tracekit: TLBI probe on CPU {cpu}", root)
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
    scope: str = "",
) -> None:
    """Per vCPU thread, an "in guest" slice from kvm_entry to kvm_exit, named by reason."""
    if entries is None or exits is None:
        return
    group = tracks.track(f"{scope}guest", "tracekit: time in guest (per vCPU thread)", root)
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
        track = tracks.track(f"{scope}guest:{tid}", f"vCPU thread {tid}: in guest", group)
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
        track = tracks.track(f"{scope}guest:{tid}", "")
        tracks.begin(track, ts, "in guest (trace ends)")
        tracks.end(track, max(ts, end_ts or 0))


def write_lost(tracks: TrackWriter, root: int, lost: pl.DataFrame, scope: str = "") -> None:
    """Each timed loss report as an instant, so gaps are visible where they happened."""
    timed = lost.filter(pl.col("ts").is_not_null()).sort("ts", "cpu")
    if timed.is_empty():
        return
    track = tracks.track(f"{scope}lost", "tracekit: lost events", root)
    for cpu, ts, count, source, detail in timed.select(
        "cpu", "ts", "count", "source", "detail"
    ).iter_rows():
        args = {"cpu": cpu, "source": source, "detail": detail or ""}
        if count is not None:
            args["count"] = count
        tracks.instant(track, ts, f"lost events on CPU {cpu}", args)
