"""Binary decoding agrees with `trace-cmd report` event by event and field by field."""

from __future__ import annotations

from pathlib import Path

import pytest
from ingest_truth import have_trace_cmd, parse_lines, report_raw, split_fields

import tracekit
from tracekit.ingest.formats import Kind
from tracekit.ingest.tracedat import read_tracedat

FIX = Path(__file__).parent / "fixtures" / "ingest"
DATS = ["small.v6.dat", "small.v7.dat", "small.v7zstd.dat", "overrun.v7zstd.dat"]

pytestmark = pytest.mark.skipif(not have_trace_cmd(), reason="trace-cmd is not installed")


def _value_matches(kind: Kind, ours: object, text: str) -> bool:
    """Compare one decoded value with trace-cmd's raw (-R) rendering of it."""
    text = text.strip()
    if kind in (Kind.INT, Kind.BOOL, Kind.POINTER):
        if text.startswith("0x"):
            return int(ours) == int(text, 16)  # type: ignore[call-overload]
        if text.lstrip("-").isdigit():
            return int(ours) == int(text)  # type: ignore[call-overload]
        assert kind != Kind.BOOL and int(ours) > 1 << 40, (ours, text)  # type: ignore[call-overload]
        return True  # an address trace-cmd printed as a symbol: symbols are another issue's
    if kind in (Kind.CHARS, Kind.DYN_STR, Kind.TAIL_STR, Kind.CONST_STR):
        return str(ours).rstrip("\n") == text
    return True  # arrays: trace-cmd's raw rendering of them is not comparable


@pytest.mark.parametrize("name", DATS)
def test_events_match_trace_cmd(name: str) -> None:
    """Same events in the same order, with the same ts (ns), cpu, common_pid, name and fields."""
    path = FIX / name
    truth, _ = parse_lines(report_raw(path))
    trace = tracekit.open(path, use_cache=False)
    ev = trace.events
    assert ev.height == len(truth) > 50
    assert ev["ts"].to_list() == [t.ts for t in truth]
    assert ev["cpu"].to_list() == [t.cpu for t in truth]
    assert ev["common_pid"].to_list() == [t.pid for t in truth]
    assert ev["event"].to_list() == [t.event for t in truth]
    formats = {f.name: f for f in read_tracedat(path).formats.events.values()}
    checked = 0
    for name_ in trace.event_names:
        table = trace.event(name_)
        fmt = formats[name_]
        names = [s.name for s in fmt.own]
        for row in table.iter_rows(named=True):
            got = split_fields(truth[row["row"]].fields, names)
            for spec in fmt.own:
                if spec.name in got:
                    assert _value_matches(spec.kind, row[spec.name], got[spec.name]), (
                        name_, spec.name, row[spec.name], got[spec.name])  # fmt: skip
                    checked += 1
    assert checked > 1000


def test_comm_matches_trace_cmd() -> None:
    """comm comes from saved_cmdlines as trace-cmd shows it (<idle> for pid 0)."""
    path = FIX / "small.v7zstd.dat"
    truth, _ = parse_lines(report_raw(path))
    comms = tracekit.open(path, use_cache=False).events["comm"].to_list()
    known = [(c, t.comm) for c, t in zip(comms, truth, strict=True) if t.comm != "<...>"]
    assert known and all(c == t for c, t in known)


def test_overrun_losses_match_trace_cmd() -> None:
    """Each [N EVENTS DROPPED] line is a page_flag row, with its count when known."""
    path = FIX / "overrun.v7zstd.dat"
    _, dropped = parse_lines(report_raw(path))
    lost = tracekit.open(path, use_cache=False).lost
    flags = lost.filter(source="page_flag").sort("cpu")
    assert sorted(dropped, key=lambda d: d[0]) == list(
        zip(flags["cpu"].to_list(), flags["count"].to_list(), strict=True)
    )
    overrun = lost.filter(source="stats_overrun")
    assert overrun.height >= 1 and overrun["count"].min() > 0
