"""Checks a Perfetto trace against the import rules trace_processor enforces.

A quick check that needs no trace processor, run after every export. The reference is
Perfetto's importer itself (tests/test_perfetto_importer.py loads exports into it); where
the two disagreed, the rule was made the importer's: every ftrace bundle has its CPU,
every ftrace event a timestamp and a pid and no per-event common_flags (imported as an
extra nameless event), events of a bundle are in time order, compact sched columns are
whole, every process in a process tree has a cmdline, slices begin and end properly per
track, track uuids are declared once and exist when used, counter values go to counter
tracks and slices never do, interned data follows the sequence flags and defines every
kernel-symbol iid used, every dedicated print is atrace text (the importer counts an
error for any other), and (given the source's counts) no event was lost on the way. The
file is read one packet at a time; a TAR's traces each on their own (sequences and
tracks are a trace's own to the importer), their events counted together.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracekit.perfetto.events import SYMBOL_FIELDS, is_atrace
from tracekit.perfetto.protos import TracePacket, TrackEvent
from tracekit.perfetto.writer import (
    SEQ_INCREMENTAL_STATE_CLEARED,
    SEQ_NEEDS_INCREMENTAL_STATE,
    read_members,
)

RULES = (
    "bundle_cpu",
    "event_pid",
    "bundle_order",
    "process_cmdline",
    "slice_nesting",
    "track_uuids",
    "counter_tracks",
    "interned_data",
    "atrace_print",
    "compact_sched",
    "event_counts",
)
_MAX_PROBLEMS_PER_RULE = 20


@dataclass
class Problem:
    """One broken rule: which rule, where (packet index), what is wrong."""

    rule: str
    packet: int
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: packet {self.packet}: {self.message}"


@dataclass
class Report:
    """The validator's findings and what it counted."""

    problems: list[Problem] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    packets: int = 0
    suppressed: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        """True when no rule is broken."""
        return not self.problems

    def broken_rules(self) -> set[str]:
        """The names of the rules that failed."""
        return {p.rule for p in self.problems}

    def add(self, rule: str, packet: int, message: str) -> None:
        """Record a problem (at most a few per rule; the rest are only counted)."""
        if sum(p.rule == rule for p in self.problems) >= _MAX_PROBLEMS_PER_RULE:
            self.suppressed[rule] += 1
        else:
            self.problems.append(Problem(rule, packet, message))


@dataclass
class _Sequence:
    """Incremental state of one packet sequence, as trace_processor keeps it."""

    cleared: bool = False
    interned: dict[tuple[str, int], bytes] = field(default_factory=dict)


class Validator:
    """Feeds packets through every rule; `finish` runs the end-of-trace checks."""

    def __init__(self, expected_counts: Mapping[str, int] | None = None) -> None:
        self.report = Report()
        self._expected = expected_counts
        self._start_trace()

    def _start_trace(self) -> None:
        """A trace's own state: its sequences and tracks."""
        self._sequences: dict[int, _Sequence] = {}
        self._tracks: dict[int, bytes] = {}
        self._counters: set[int] = set()
        self._kinds: dict[int, dict[bool, int]] = {}  # track -> {is counter value: 1st packet}
        self._used_tracks: dict[int, int] = {}
        self._parents: dict[int, int] = {}
        self._open: dict[int, list[int]] = {}
        self._last_ts: dict[int, int] = {}

    def next_trace(self) -> None:
        """End one trace of an archive and start the next (its counts carry on)."""
        self.finish(counts=False)
        self._start_trace()

    def packet(self, index: int, packet: Any) -> None:
        """Check one packet."""
        self.report.packets += 1
        self._check_sequence(index, packet)
        if packet.HasField("ftrace_events"):
            self._check_bundle(index, packet)
        if packet.HasField("process_tree"):
            for process in packet.process_tree.processes:
                if not any(process.cmdline):
                    self.report.add(
                        "process_cmdline", index, f"process {process.pid} has no cmdline"
                    )
        if packet.HasField("track_descriptor"):
            self._check_descriptor(index, packet.track_descriptor)
        if packet.HasField("track_event"):
            self._check_track_event(index, packet)

    def _check_sequence(self, index: int, packet: Any) -> None:
        """Interned data: cleared state first, flags set when used, iids defined once."""
        has_interned = packet.HasField("interned_data")
        flags = packet.sequence_flags
        if not packet.trusted_packet_sequence_id:
            if has_interned or flags:
                self.report.add(
                    "interned_data", index, "interned data or sequence flags without a sequence id"
                )
            return
        seq = self._sequences.setdefault(packet.trusted_packet_sequence_id, _Sequence())
        if flags & SEQ_INCREMENTAL_STATE_CLEARED:
            seq.cleared = True
            seq.interned.clear()
        if (has_interned or flags & SEQ_NEEDS_INCREMENTAL_STATE) and not seq.cleared:
            self.report.add(
                "interned_data",
                index,
                f"sequence {packet.trusted_packet_sequence_id} uses incremental state before "
                "a packet with SEQ_INCREMENTAL_STATE_CLEARED",
            )
        if has_interned and not flags & SEQ_NEEDS_INCREMENTAL_STATE:
            self.report.add(
                "interned_data", index, "interned data without SEQ_NEEDS_INCREMENTAL_STATE"
            )
        for kind, item in _interned_items(packet):
            key = (kind, item.iid)
            value = item.SerializeToString()
            if key in seq.interned and seq.interned[key] != value:
                self.report.add("interned_data", index, f"{kind} iid {item.iid} redefined")
            seq.interned[key] = value

    def _check_bundle(self, index: int, packet: Any) -> None:
        """Bundle has its CPU; events have ts and pid, in time order; count them."""
        bundle = packet.ftrace_events
        if not bundle.HasField("cpu"):
            self.report.add("bundle_cpu", index, "ftrace bundle without its cpu")
        seq = self._sequences.get(packet.trusted_packet_sequence_id)
        symbolized = seq is not None and any(k == "kernel_symbols" for k, _ in seq.interned)
        previous = -1
        counts = self.report.counts
        # Per event (a million in a large trace): its kind read once, then only the checks
        # its kind needs.
        for n, event in enumerate(bundle.event):
            kind = event.WhichOneof("event")
            name = _event_name(event, kind)
            counts[name] += 1
            if not event.HasField("pid") or not event.HasField("timestamp"):
                self.report.add("event_pid", index, f"event {n} ({name}) lacks pid or timestamp")
            if event.timestamp < previous:
                self.report.add("bundle_order", index, f"event {n} ({name}) goes back in time")
            previous = event.timestamp
            if kind == "print" and not is_atrace(event.print.buf):
                # the importer parses every dedicated print as atrace: an error otherwise
                self.report.add("atrace_print", index, f"print not atrace {event.print.buf!r}")
            if kind in SYMBOL_FIELDS:
                iid = getattr(getattr(event, name), SYMBOL_FIELDS[name])
                if not symbolized or ("kernel_symbols", iid) not in seq.interned:  # type: ignore[union-attr]
                    self.report.add("interned_data", index, f"{name} symbol iid {iid} undefined")
            if event.HasField("common_flags"):
                self.report.add("event_pid", index, f"event {n} ({name}) has common_flags, "
                                "which the importer makes an extra nameless event")  # fmt: skip
        if bundle.HasField("compact_sched"):
            self._check_compact(index, bundle.compact_sched)

    def _check_compact(self, index: int, compact: Any) -> None:
        """Compact sched: its columns of one length per kind, comm indices in the table."""
        kinds = (
            ("sched_switch", "switch_", ("timestamp", "prev_state", "next_pid", "next_prio",
                                         "next_comm_index")),
            ("sched_waking", "waking_", ("timestamp", "pid", "target_cpu", "prio", "comm_index")),
        )  # fmt: skip
        for name, prefix, fields in kinds:
            sizes = {len(getattr(compact, prefix + f)) for f in fields}
            if len(sizes) != 1:
                self.report.add("compact_sched", index, f"{name} columns differ in length {sizes}")
            comms = getattr(compact, prefix + fields[-1])
            if any(i >= len(compact.intern_table) for i in comms):
                self.report.add("compact_sched", index, f"{name} comm index past the table")
            self.report.counts[name] += len(getattr(compact, prefix + "timestamp"))

    def _check_descriptor(self, index: int, track: Any) -> None:
        """A uuid is non-zero and, if declared again, declared the same way."""
        if not track.uuid:
            self.report.add("track_uuids", index, "track descriptor with uuid 0")
            return
        body = track.SerializeToString()
        if track.uuid in self._tracks and self._tracks[track.uuid] != body:
            self.report.add(
                "track_uuids", index, f"track uuid {track.uuid} declared twice, differently"
            )
        self._tracks[track.uuid] = body
        if track.HasField("counter"):
            self._counters.add(track.uuid)
        if track.parent_uuid:
            self._parents[track.uuid] = track.parent_uuid
            self._used_tracks.setdefault(track.parent_uuid, index)

    def _check_track_event(self, index: int, packet: Any) -> None:
        """Slices begin and end in order per track; tracks are declared."""
        event = packet.track_event
        uuid = event.track_uuid
        self._used_tracks.setdefault(uuid, index)
        kinds = self._kinds.setdefault(uuid, {})
        kinds.setdefault(event.type == TrackEvent.TYPE_COUNTER, index)
        ts = packet.timestamp
        if ts < self._last_ts.get(uuid, 0):
            self.report.add("slice_nesting", index, f"track {uuid} goes back in time")
        self._last_ts[uuid] = ts
        stack = self._open.setdefault(uuid, [])
        if event.type == TrackEvent.TYPE_SLICE_BEGIN:
            stack.append(index)
        elif event.type == TrackEvent.TYPE_SLICE_END:
            if not stack:
                self.report.add("slice_nesting", index, f"slice end without begin on track {uuid}")
            else:
                stack.pop()

    def finish(self, counts: bool = True) -> Report:
        """End-of-trace checks: open slices, undeclared tracks, event counts (COUNTS)."""
        for uuid, stack in self._open.items():
            for begin in stack:
                self.report.add("slice_nesting", begin, f"slice on track {uuid} never ends")
        for uuid, first_use in self._used_tracks.items():
            if uuid and uuid not in self._tracks:
                self.report.add("track_uuids", first_use, f"track {uuid} used but never declared")
        self._check_counter_tracks()
        if counts and self._expected is not None:
            self._check_counts()
        return self.report

    def _check_counter_tracks(self) -> None:
        """Counter values only on counter tracks; slices and instants never on them."""
        for uuid, kinds in self._kinds.items():
            if uuid not in self._tracks:
                continue  # reported under track_uuids
            for counting, index in kinds.items():
                if counting != (uuid in self._counters):
                    what = "a counter value" if counting else "a slice or instant"
                    where = "a track that is no counter" if counting else "a counter track"
                    self.report.add("counter_tracks", index, f"{what} on {where} ({uuid})")

    def _check_counts(self) -> None:
        """Events per type equal the source's."""
        assert self._expected is not None
        for name in sorted(set(self._expected) | set(self.report.counts)):
            want, got = self._expected.get(name, 0), self.report.counts.get(name, 0)
            if want != got:
                self.report.add("event_counts", -1, f"{name}: {got} in the file, {want} in source")


def _event_name(event: Any, kind: str | None) -> str:
    """The event type of an FtraceEvent of KIND (its WhichOneof("event")): its dedicated
    message or its generic name."""
    if kind == "generic":
        return event.generic.event_name
    if kind == "kprobe_event":
        return event.kprobe_event.name
    return kind or "<no event>"


def _interned_items(packet: Any) -> list[tuple[str, Any]]:
    """Every (kind, item-with-iid) in a packet's interned data."""
    if not packet.HasField("interned_data"):
        return []
    items = []
    for descriptor, values in packet.interned_data.ListFields():
        items.extend((descriptor.name, item) for item in values)
    return items


def validate_file(
    path: str | os.PathLike[str], expected_counts: Mapping[str, int] | None = None
) -> Report:
    """Validate a .pftrace file; EXPECTED_COUNTS are the source's events per type."""
    validator = Validator(expected_counts)
    index = 0
    for n, (_, packets) in enumerate(read_members(path)):
        if n:
            validator.next_trace()
        for raw in packets:
            validator.packet(index, TracePacket.FromString(raw))
            index += 1
    return validator.finish()
