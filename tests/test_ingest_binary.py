"""Binary readers on real fixtures: formats, raw capture, versions, losses, damage."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import polars as pl
import pytest
from ingest_truth import parse_lines

import tracekit
from tracekit.errors import TracekitError
from tracekit.ingest.formats import Kind, parse_format, parse_header_page

FIX = Path(__file__).parent / "fixtures" / "ingest"
RAW = FIX / "rawcap"


def test_format_file_field_kinds() -> None:
    """Format lines become the right kinds: __data_loc, char[N], tail strings, pointers."""
    exec_fmt = parse_format((RAW / "events/sched/sched_process_exec/format").read_text(), "sched")
    kinds = {f.name: f.kind for f in exec_fmt.own}
    assert kinds == {"filename": Kind.DYN_STR, "pid": Kind.INT, "old_pid": Kind.INT}
    print_fmt = parse_format((RAW / "events/ftrace/print/format").read_text(), "ftrace")
    assert [(f.name, f.kind) for f in print_fmt.own] == [("ip", Kind.INT), ("buf", Kind.TAIL_STR)]
    timer = parse_format((RAW / "events/timer/hrtimer_start/format").read_text(), "timer")
    assert {f.name: f.kind for f in timer.own}["function"] == Kind.POINTER
    rcu = parse_format((RAW / "events/rcu/rcu_utilization/format").read_text(), "rcu")
    assert rcu.own[0].kind == Kind.CONST_STR
    switch = parse_format((RAW / "events/sched/sched_switch/format").read_text(), "sched")
    comm = next(f for f in switch.own if f.name == "prev_comm")
    assert (comm.kind, comm.offset, comm.size) == (Kind.CHARS, 8, 16)
    hp = parse_header_page((RAW / "header_page").read_text())
    assert (hp.commit_size, hp.data_offset, hp.page_size) == (8, 16, 4096)


def test_bad_format_file_is_rejected() -> None:
    """A format without name/ID lines is a ValueError (a TracekitError in readers)."""
    with pytest.raises(ValueError):
        parse_format("format:\n\tfield:int x;\toffset:0;\tsize:4;\tsigned:1;\n")


def test_raw_capture_matches_tracefs_text() -> None:
    """The raw capture decodes to the events tracefs itself printed (µs text timestamps)."""
    truth, _ = parse_lines((FIX / "rawcap.trace.txt").read_text())
    ev = tracekit.open(RAW, use_cache=False).events
    assert ev.height == len(truth) > 100
    assert ((ev["ts"] + 500) // 1000).to_list() == [t.ts // 1000 for t in truth]  # µs, rounded
    assert ev["cpu"].to_list() == [t.cpu for t in truth]
    assert ev["common_pid"].to_list() == [t.pid for t in truth]
    names = [e.replace("print", "tracing_mark_write") for e in ev["event"].to_list()]
    assert names == [t.event for t in truth]


def test_raw_capture_typed_fields() -> None:
    """Strings, __data_loc strings and printk `const char *` fields decode to text."""
    trace = tracekit.open(RAW, use_cache=False)
    exec_ = trace.event("sched_process_exec")
    assert set(exec_["filename"].to_list()) >= {"/bin/true", "/usr/bin/cat"}
    assert exec_.schema["pid"] == pl.Int32 and exec_.schema["common_pid"] == pl.Int32
    rcu = trace.event("rcu_utilization")["s"].to_list()
    assert "Start context switch" in rcu and not any(s.startswith("0x") for s in rcu)
    marks = trace.event("print")["buf"].to_list()
    assert marks[0].startswith("tracekit-fixture round=")
    assert trace.event("hrtimer_start").schema["function"] == pl.UInt64


def test_versions_decode_identically() -> None:
    """v6, v7 and v7+zstd of one recording give the same tables."""
    tables = [tracekit.open(FIX / n, use_cache=False) for n in
              ("small.v6.dat", "small.v7.dat", "small.v7zstd.dat")]  # fmt: skip
    first = tables[0]
    for other in tables[1:]:
        assert other.events.equals(first.events)
        assert other.event_names == first.event_names
        for name in first.event_names:
            assert other.event(name).equals(first.event(name))
    assert tables[2].meta["reader"] == "trace.dat v7 (zstd)"


def test_overrun_reports_every_source() -> None:
    """Page flags (with and without stored counts) and the CPUSTAT overruns all appear."""
    lost = tracekit.open(FIX / "overrun.v7zstd.dat", use_cache=False).lost
    flags = lost.filter(source="page_flag")
    assert flags["count"].null_count() == 1 and flags["count"].max() == 358
    assert sorted(lost.filter(source="stats_overrun")["count"].to_list()) == [144, 358]


def _damaged(tmp: Path, name: str, data: bytes) -> Path:
    """Write damaged bytes to a file in tmp."""
    out = tmp / name
    out.write_bytes(data)
    return out


def test_truncated_cpu_data_error_and_salvage(tmp_path: Path) -> None:
    """Truncation names the reader and offset; --salvage reads the whole pages before it."""
    src = (FIX / "small.v6.dat").read_bytes()
    cut = _damaged(tmp_path, "cut.dat", src[:-5000])
    with pytest.raises(TracekitError, match=r"trace.dat v6 reader: .* offset 57344"):
        tracekit.open(cut, use_cache=False)
    full = tracekit.open(FIX / "small.v6.dat", use_cache=False).events
    part = tracekit.open(cut, use_cache=False, salvage=True)
    assert 0 < part.events.height < full.height
    assert any("CPU 1" in s for s in part.meta["skipped"])
    assert "skipped (salvage)" in part.summary()


def test_corrupt_page_header_error_and_salvage(tmp_path: Path) -> None:
    """A page whose commit length exceeds the page: error with its offset, or salvage."""
    src = bytearray((FIX / "small.v6.dat").read_bytes())
    bad_page = 40960 + 2 * 4096
    src[bad_page + 8 : bad_page + 10] = b"\xff\x7f"
    bad = _damaged(tmp_path, "bad.dat", bytes(src))
    with pytest.raises(TracekitError, match=f"byte offset {bad_page}: page header commit"):
        tracekit.open(bad, use_cache=False)
    part = tracekit.open(bad, use_cache=False, salvage=True)
    assert part.events.filter(pl.col("cpu") == 0).height > 0
    assert any(str(bad_page) in s for s in part.meta["skipped"])


@pytest.mark.parametrize("name", ["small.v7.dat", "small.v6.dat", "small.v7zstd.dat"])
def test_any_truncation_is_a_clear_error(tmp_path: Path, name: str) -> None:
    """Cut at many points: always a TracekitError (one line), never another exception."""
    src = (FIX / name).read_bytes()
    for cut in range(0, len(src), max(1, len(src) // 60)):
        path = _damaged(tmp_path, "t.dat", src[:cut])
        try:
            tracekit.open(path, use_cache=False)
        except TracekitError as err:
            assert "\n" not in str(err)


@pytest.mark.parametrize("name", ["small.v7.dat", "small.v6.dat"])
def test_flipped_bytes_never_crash(tmp_path: Path, name: str) -> None:
    """Flip one byte at many positions: a TracekitError or a decoded trace, nothing else."""
    src = (FIX / name).read_bytes()
    for pos in range(0, len(src), max(1, len(src) // 80)):
        data = bytearray(src)
        data[pos] ^= 0xFF
        with contextlib.suppress(TracekitError):
            tracekit.open(_damaged(tmp_path, "f.dat", bytes(data)), use_cache=False)


def test_import_tracekit_does_not_import_polars() -> None:
    """The host side must stay free of polars: importing tracekit must not pull it in."""
    import subprocess

    code = "import sys, tracekit; sys.exit('polars' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
