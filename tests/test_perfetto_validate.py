"""The validator: our exports pass; a crafted trace breaking each rule fails that rule."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import tracekit
from tracekit.perfetto.export import export_trace
from tracekit.perfetto.protos import TracePacket, TrackEvent
from tracekit.perfetto.validate import RULES, validate_file
from tracekit.perfetto.writer import PacketWriter

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


def _write(path: Path, packets: list[TracePacket]) -> Path:
    """Write packets as a .pftrace."""
    with PacketWriter(path) as writer:
        for packet in packets:
            writer.write(packet)
    return path


def _bundle(cpu: int | None = 0, events: list[dict] | None = None, **packet: object) -> TracePacket:
    """An ftrace bundle packet; each event dict becomes an FtraceEvent."""
    p = TracePacket(trusted_packet_sequence_id=1, **packet)  # type: ignore[arg-type]
    p.ftrace_events.SetInParent()
    if cpu is not None:
        p.ftrace_events.cpu = cpu
    for spec in events or [{"timestamp": 10, "pid": 1, "print": {"buf": "B|1|hello\n"}}]:
        p.ftrace_events.event.add(**spec)
    return p


def _track(uuid: int, parent: int = 0, name: str = "t") -> TracePacket:
    """A track descriptor packet."""
    p = TracePacket(trusted_packet_sequence_id=2)
    p.track_descriptor.uuid = uuid
    p.track_descriptor.name = name
    if parent:
        p.track_descriptor.parent_uuid = parent
    return p


def _slice(uuid: int, ts: int, kind: int, name: str = "s") -> TracePacket:
    """A track event packet."""
    p = TracePacket(trusted_packet_sequence_id=2, timestamp=ts)
    p.track_event.track_uuid = uuid
    p.track_event.type = kind
    if kind != TrackEvent.TYPE_SLICE_END:
        p.track_event.name = name
    return p


def _counter(uuid: int, ts: int, value: float) -> TracePacket:
    """A counter value on a track."""
    p = TracePacket(trusted_packet_sequence_id=2, timestamp=ts)
    p.track_event.track_uuid = uuid
    p.track_event.type = TrackEvent.TYPE_COUNTER
    p.track_event.double_counter_value = value
    return p


def _counter_track(uuid: int) -> TracePacket:
    """A counter track's descriptor."""
    p = _track(uuid)
    p.track_descriptor.counter.SetInParent()
    return p


def _symbols(flags: int, iid: int = 1, name: str = "do_work") -> TracePacket:
    """A bundle with one funcgraph_entry whose func is an interned kernel symbol."""
    p = _bundle(events=[{"timestamp": 5, "pid": 1, "funcgraph_entry": {"depth": 0, "func": 1}}])
    p.sequence_flags = flags
    item = p.interned_data.kernel_symbols.add()
    item.iid = iid
    item.str = name.encode()
    return p


BEGIN, END = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END
PROC = TracePacket(trusted_packet_sequence_id=1)
PROC.process_tree.processes.add(pid=5)


# rule -> packets breaking exactly that rule
def _compact(**columns: list[int]) -> TracePacket:
    """A bundle whose compact sched has the given columns and one interned comm."""
    p = _bundle()
    p.ftrace_events.compact_sched.intern_table.append("task")
    for name, values in columns.items():
        getattr(p.ftrace_events.compact_sched, name).extend(values)
    return p


BROKEN: dict[str, Callable[[], list[TracePacket]]] = {
    "bundle_cpu": lambda: [_bundle(cpu=None)],
    "event_pid": lambda: [_bundle(events=[{"timestamp": 1, "print": {"buf": "E"}}])],
    "bundle_order": lambda: [
        _bundle(
            events=[
                {"timestamp": 9, "pid": 1, "print": {"buf": "E|1"}},
                {"timestamp": 3, "pid": 1, "print": {"buf": "E|1"}},
            ]
        )
    ],
    "process_cmdline": lambda: [PROC],
    "slice_nesting": lambda: [_track(7), _slice(7, 1, BEGIN), _slice(7, 2, END), _slice(7, 3, END)],
    "track_uuids": lambda: [_track(7), _slice(8, 1, TrackEvent.TYPE_INSTANT)],
    "counter_tracks": lambda: [
        _track(7),
        _counter(7, 1, 2.0),
        _counter_track(8),
        _slice(8, 2, TrackEvent.TYPE_INSTANT),
    ],
    "interned_data": lambda: [_symbols(flags=2)],  # needs state never cleared
    "compact_sched": lambda: [
        _compact(
            switch_timestamp=[5, 6],
            switch_prev_state=[1],
            switch_next_pid=[2, 3],
            switch_next_prio=[120, 120],
            switch_next_comm_index=[0, 0],
        )
    ],
    # the importer counts an error for every dedicated print that is not atrace text
    "atrace_print": lambda: [
        _bundle(events=[{"timestamp": 1, "pid": 1, "print": {"buf": "tracekit round=0\n"}}])
    ],
}


def test_every_rule_has_a_broken_case() -> None:
    """Each rule the validator knows is exercised below (event_counts separately)."""
    assert set(RULES) == set(BROKEN) | {"event_counts"}


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_broken_trace_fails_its_rule(tmp_path: Path, rule: str) -> None:
    """A trace breaking one rule is reported under that rule and no other."""
    report = validate_file(_write(tmp_path / "bad.pftrace", BROKEN[rule]()))
    assert report.broken_rules() == {rule}


def test_well_formed_crafted_trace_passes(tmp_path: Path) -> None:
    """The same kinds of packets, written correctly, pass every rule."""
    packets = [
        _symbols(flags=3),
        _bundle(events=[{"timestamp": 20, "pid": 1, "print": {"buf": "B|12|work\n"}}]),
        _track(7),
        _track(9, parent=7),
        _slice(9, 1, BEGIN),
        _slice(9, 1, BEGIN, "inner"),
        _slice(9, 2, END),
        _slice(9, 3, END),
        _counter_track(11),
        _counter(11, 4, 1.5),
    ]
    report = validate_file(_write(tmp_path / "good.pftrace", packets))
    assert report.ok, report.problems


def test_redefined_iid_and_undefined_symbol_fail(tmp_path: Path) -> None:
    """An iid given two values, or a funcgraph func that is no interned iid, is reported."""
    first = _symbols(flags=3)
    second = _symbols(flags=2, name="other_name")
    unknown = _bundle(events=[{"timestamp": 9, "pid": 1, "funcgraph_exit": {"func": 77}}])
    report = validate_file(_write(tmp_path / "bad.pftrace", [first, second, unknown]))
    messages = [p.message for p in report.problems if p.rule == "interned_data"]
    assert any("redefined" in m for m in messages)
    assert any("iid 77 undefined" in m for m in messages)


def test_counts_must_equal_the_source(tmp_path: Path) -> None:
    """One event fewer than the source breaks event_counts, naming the type."""
    path = _write(tmp_path / "t.pftrace", [_bundle()])
    assert validate_file(path, {"print": 1}).ok
    report = validate_file(path, {"print": 2, "sched_switch": 1})
    assert report.broken_rules() == {"event_counts"}
    assert {p.message.split(":")[0] for p in report.problems} == {"print", "sched_switch"}


@pytest.mark.parametrize(
    "fixture", ["small.v6.dat", "small.v7zstd.dat", "rawcap", "overrun.v7zstd.dat"]
)
def test_our_exports_pass(tmp_path: Path, fixture: str) -> None:
    """Exports of the real fixtures pass every rule, counts included."""
    out = tmp_path / "out.pftrace"
    result = export_trace(tracekit.open(FIXTURES / fixture, use_cache=False), out)
    report = validate_file(out, result.source_counts)
    assert report.ok, report.problems
    assert sum(report.counts.values()) == sum(result.source_counts.values()) > 0
