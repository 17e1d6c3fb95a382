"""`perf script` tracepoint text on real output of Debian's linux-perf 6.1 (see the README
in tests/fixtures/ingest): both timestamp renderings of one perf.data, cut to 300 samples."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

import tracekit

FIX = Path(__file__).parent / "fixtures" / "ingest"
US, NS = FIX / "perf-script.txt", FIX / "perf-script-ns.txt"
# One sample as perf prints it, read here with plain `re` as an independent check.
LINE = re.compile(r"^\s*(.*?)\s+(\d+)\s+\[(\d+)\]\s+(\d+)\.(\d+):\s+(\w+):(\w+):\s(.*)$")


def _truth(path: Path) -> list[tuple[str, ...]]:
    """Every sample line split into comm, tid, cpu, sec, frac, system, event, fields."""
    return [m.groups() for m in map(LINE.match, path.read_text().splitlines()) if m]


def test_detected_and_every_line_is_a_sample() -> None:
    """The file is recognised from its content; 300 lines give 300 events, none skipped."""
    trace = tracekit.open(US, use_cache=False)
    truth = _truth(US)
    assert trace.meta["reader"] == "perf script" and trace.meta["unparsed_lines"] == 0
    assert trace.events.height == len(truth) == 300
    ev = trace.events
    assert ev["comm"].cast(str).to_list() == [t[0] for t in truth]
    assert ev["common_pid"].to_list() == [int(t[1]) for t in truth]
    assert ev["cpu"].to_list() == [int(t[2]) for t in truth]
    assert ev["system"].cast(str).to_list() == [t[5] for t in truth]
    assert ev["event"].cast(str).to_list() == [t[6] for t in truth]
    assert ev["ts"].to_list() == [int(t[3]) * 10**9 + int(t[4]) * 1000 for t in truth]


def test_microsecond_and_nanosecond_renderings_agree() -> None:
    """`perf script` and `perf script --ns` of one perf.data: the same rows, ts truncated."""
    us, ns = tracekit.open(US, use_cache=False), tracekit.open(NS, use_cache=False)
    cols = ["cpu", "common_pid", "comm", "event", "system"]
    assert us.events.select(cols).equals(ns.events.select(cols))
    assert (us.events["ts"] == ns.events["ts"] // 1000 * 1000).all()
    assert (ns.events["ts"] % 1000 != 0).any()  # --ns really carries nanoseconds


def test_fields_become_typed_columns() -> None:
    """key=value fields: integers as Int64, names as String, the whole text kept."""
    trace = tracekit.open(US, use_cache=False)
    switch = trace.event("sched_switch")
    assert switch.schema["prev_pid"] == pl.Int64 and switch.schema["next_comm"] == pl.String
    lines = [t for t in _truth(US) if t[6] == "sched_switch"]
    assert switch["next_pid"].to_list() == [
        int(re.search(r"next_pid=(\d+)", t[7]).group(1))
        for t in lines  # type: ignore[union-attr]
    ]
    execs = trace.event("sched_process_exec")
    assert set(execs["filename"]) == {"/usr/bin/sh", "/usr/bin/sleep"}
    assert (execs["pid"] == execs["common_pid"]).all()


def test_other_lines_are_counted_not_dropped(tmp_path: Path) -> None:
    """A line that is not a sample is reported, and a comm with spaces stays whole."""
    lines = US.read_text().splitlines()
    lines[5] = re.sub(r"^\s*\S+", " Web Content", lines[5])
    path = tmp_path / "edited.txt"
    path.write_text("\n".join([*lines, "this is not a sample"]) + "\n")
    trace = tracekit.open(path, use_cache=False)
    assert trace.events.height == 300 and trace.meta["unparsed_lines"] == 1
    assert "line 301" in trace.meta["skipped"][0]
    assert trace.events["comm"].cast(str)[5] == "Web Content"
    assert "1 line(s) that are not samples" in trace.summary()


CLOCK_G, CLOCK_NS = FIX / "perf-script-cpuclock-g.txt", FIX / "perf-script-cpuclock-ns.txt"
HEADER = re.compile(r"^\s*(\S+)\s+(\d+)\s+(\d+)\.(\d+):\s+(\d+)\s+cpu-clock:\s*(.*)$")


def _chains(path: Path) -> list[tuple[int, int, list[str]]]:
    """(tid, period, frame symbols) of each sample, split here with plain `re`."""
    out: list[tuple[int, int, list[str]]] = []
    for line in path.read_text().splitlines():
        m = HEADER.match(line)
        if m:
            leaf = m[6].split()[1:2] if m[6] else []
            out.append((int(m[2]), int(m[5]), leaf))
        elif line.strip() and out:
            out[-1][2].append(line.split(None, 1)[1].rsplit(" (", 1)[0])
    return out


def test_sampling_event_with_callchains() -> None:
    """cpu-clock -g: one row per sample, its period, leaf frame and whole callchain."""
    trace = tracekit.open(CLOCK_G, use_cache=False)
    truth = _chains(CLOCK_G)
    assert trace.meta["unparsed_lines"] == 0 and trace.event_names == ["cpu-clock"]
    table = trace.event("cpu-clock")
    assert table.height == trace.events.height == len(truth) == 60
    assert table["common_pid"].to_list() == [t[0] for t in truth]
    assert table["period"].to_list() == [t[1] for t in truth]
    assert table["callchain_sym"].to_list() == [t[2] for t in truth]
    assert table["sym"].to_list() == [t[2][0] for t in truth]
    assert table["callchain_ip"].list.len().to_list() == [len(t[2]) for t in truth]
    assert table["ip"][0] == int(CLOCK_G.read_text().split("\n")[1].split()[0], 16)


def test_sampling_event_without_callchain_in_ns() -> None:
    """-G --ns: the leaf frame on the header line, ns times, no callchain columns."""
    trace = tracekit.open(CLOCK_NS, use_cache=False)
    table = trace.event("cpu-clock")
    assert trace.meta["unparsed_lines"] == 0 and table.height == 40
    assert "callchain_sym" not in table.columns and table["sym"].null_count() == 0
    assert table["ts"][0] == 625_251_271_048
    assert table["sym"].to_list()[:40] == trace_syms(CLOCK_G)[:40]


def trace_syms(path: Path) -> list[str]:
    """The leaf frame of each sample of the -g fixture (same recording)."""
    return [t[2][0] for t in _chains(path)]


def test_unsupported_perf_output_says_what_is_read(tmp_path: Path) -> None:
    """A perf-script-looking file with no readable sample names both supported forms."""
    from click.testing import CliRunner

    from tracekit.cli import main

    path = tmp_path / "odd.txt"
    # `perf script -F comm,ip`: no time, so neither sample form
    path.write_text("dd ffffffff815a4bc1\n" * 3)
    res = CliRunner().invoke(main, ["ingest", "--no-cache", str(path)])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "sampling events in its default fields" in res.output
