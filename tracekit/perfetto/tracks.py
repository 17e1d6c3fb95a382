"""Drawing primitives of tracekit's own tracks: the track writer and nested spans.

These are TrackEvent tracks on their own packet sequence. What one trace's tracks are
(composed from analysis results) is timeline.py; the scenarios' spans are scenario.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tracekit.perfetto.protos import CounterDescriptor, TracePacket, TrackDescriptor, TrackEvent
from tracekit.perfetto.writer import (
    SEQ_INCREMENTAL_STATE_CLEARED,
    TRACKS_SEQUENCE,
    PacketWriter,
)

# Track uuids live in a range of their own so they never meet another producer's.
_UUID_BASE = 0x7472_6B00_0000_0000


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
