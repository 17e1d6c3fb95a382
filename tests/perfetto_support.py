"""Helpers of the Perfetto tests: read an export back as tracks, slices and counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit.perfetto.protos import TracePacket, TrackEvent
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
