"""Real trace.dat files nobody here wrote, and every trace.dat the tests hold, against
`trace-cmd report`.

The corpus (../shared/corpus beside the clone, see its README.md) holds LISA's public
trace.dat files of 4.x kernels, whose format files declare flexible arrays without
brackets (`field:char buf; size:0`), which libtraceevent reads as the rest of the record.
The 32-bit case (4-byte longs) is a raw capture generated here.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from ingest_truth import have_trace_cmd, parse_lines, report_raw, split_fields
from test_ingest_arm64_tracedat import _matches

import tracekit
from tracekit.ingest.formats import Kind, parse_format
from tracekit.ingest.tracedat import read_tracedat

FIX = Path(__file__).parent / "fixtures" / "ingest"
CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
CORPUS_DATS = sorted(CORPUS.glob("*.trace.dat")) if CORPUS.is_dir() else []
HELD_DATS = sorted((FIX.parent).rglob("*.dat"))  # every trace.dat the tests hold
SAMPLE_EVERY = 7  # field values compared on every 7th event of each type

needs_trace_cmd = pytest.mark.skipif(not have_trace_cmd(), reason="trace-cmd is not installed")
needs_corpus = pytest.mark.skipif(
    not CORPUS_DATS, reason=f"public trace corpus not found at {CORPUS} (see its README.md)"
)


@needs_trace_cmd
@pytest.mark.parametrize("path", HELD_DATS + CORPUS_DATS, ids=lambda p: p.name)
def test_event_counts_match_trace_cmd(path: Path) -> None:
    """Per event name, as many events as `trace-cmd report` prints."""
    truth, _ = parse_lines(report_raw(path))
    ev = tracekit.open(path, use_cache=False).events
    ours = Counter(ev["event"].cast(pl.String).to_list())
    assert ours == Counter(t.event for t in truth)
    assert sum(ours.values()) > 50


def _value_agrees(spec_kind: Kind, ours: object, text: str, printk: dict[int, str]) -> bool:
    """_matches, plus a `const char *` trace-cmd -R prints as the address printk_formats
    resolves to our string."""
    text = text.strip()
    if spec_kind == Kind.CONST_STR and text.startswith("0x"):
        return printk.get(int(text, 16)) == ours
    return _matches(spec_kind, ours, text)


@needs_trace_cmd
@needs_corpus
@pytest.mark.parametrize("path", CORPUS_DATS, ids=lambda p: p.name)
def test_corpus_fields_match_trace_cmd(path: Path) -> None:
    """Same events in the same order; a sample's field values as trace-cmd -R prints them."""
    trace = tracekit.open(path, use_cache=False)
    truth, _ = parse_lines(report_raw(path))
    ev = trace.events
    assert ev["ts"].to_list() == [t.ts for t in truth]
    assert ev["cpu"].to_list() == [t.cpu for t in truth]
    assert ev["common_pid"].to_list() == [t.pid for t in truth]
    dat = read_tracedat(path)
    formats = {f.name: f for f in dat.formats.events.values()}
    checked: Counter[str] = Counter()
    for name in trace.event_names:
        fmt = formats[name]
        names = [s.name for s in fmt.own]
        for row in trace.event(name).gather_every(SAMPLE_EVERY).iter_rows(named=True):
            got = split_fields(truth[row["row"]].fields, names)
            for spec in fmt.own:
                col = f"field_{spec.name}" if f"field_{spec.name}" in row else spec.name
                if spec.name in got:
                    assert _value_agrees(spec.kind, row[col], got[spec.name], dat.printk), (
                        name, spec.name, row[col], got[spec.name])  # fmt: skip
                    checked[name] += 1
    assert "print" in checked and sum(checked.values()) > 500


@needs_corpus
def test_corpus_flexible_arrays_hold_the_rest_of_the_record() -> None:
    """bprint's bracketless `u32 buf` is its binary arguments; print's `char buf` its text."""
    path = next(p for p in CORPUS_DATS if "rtapp" in p.name)
    trace = tracekit.open(path, use_cache=False)
    bprint = trace.event("bprint")
    assert bprint.schema["buf"] == pl.List(pl.UInt32)
    assert bprint["buf"].list.len().min() > 0  # printf arguments, one u32 word or more
    prints = trace.event("print")["buf"].to_list()
    assert all(p and "\0" not in p for p in prints)


# 32-bit ARM: `local_t commit` and `unsigned long` are 4 bytes, data starts at 12.
HEADER_PAGE_32 = """\
\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;
\tfield: local_t commit;\toffset:8;\tsize:4;\tsigned:1;
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;
\tfield: char data;\toffset:12;\tsize:4084;\tsigned:1;
"""
COMMON = """\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;
"""
PRINT_32 = f"""name: print
ID: 5
format:
{COMMON}
\tfield:unsigned long ip;\toffset:8;\tsize:4;\tsigned:0;
\tfield:char buf;\toffset:12;\tsize:0;\tsigned:0;

print fmt: "%ps: %s", (void *)REC->ip, REC->buf
"""
STACK_32 = f"""name: kernel_stack
ID: 4
format:
{COMMON}
\tfield:int size;\toffset:8;\tsize:4;\tsigned:1;
\tfield:unsigned long caller;\toffset:12;\tsize:0;\tsigned:0;

print fmt: "\\t=> (%08lx)\\n", REC->caller[0]
"""


def _record(delta: int, payload: bytes) -> bytes:
    """One ring-buffer data record (type_len = payload words)."""
    payload += b"\0" * (-len(payload) % 4)
    return struct.pack("<I", (delta << 5) | len(payload) // 4) + payload


def _capture_32(tmp: Path) -> Path:
    """A raw capture as a 32-bit ARM kernel writes it: a print and a kernel_stack event."""
    cap = tmp / "cap32"
    for sub, text in (("print", PRINT_32), ("kernel_stack", STACK_32)):
        (cap / "events" / "ftrace" / sub).mkdir(parents=True)
        (cap / "events" / "ftrace" / sub / "format").write_text(text)
    (cap / "header_page").write_text(HEADER_PAGE_32)
    shutil.copy(FIX / "rawcap" / "header_event", cap / "header_event")
    common = struct.pack("<HBBi", 5, 0, 1, 42)
    body = _record(0, common + struct.pack("<I", 0xC0101234) + b"hello 32-bit\n\0")
    stack = struct.pack("<HBBi", 4, 0, 1, 42) + struct.pack("<i", 12)
    body += _record(10, stack + struct.pack("<3I", 0xC0001000, 0xC0002000, 0xC0003000))
    page = (struct.pack("<QI", 1_000_000, len(body)) + body).ljust(4096, b"\0")
    (cap / "per_cpu" / "cpu0").mkdir(parents=True)
    (cap / "per_cpu" / "cpu0" / "trace_pipe_raw").write_bytes(page)
    meta = {"format": "tracekit-raw-capture", "version": 1, "page_size": 4096, "cpus": [0],
            "trace_clock": "local", "events": ["ftrace/print"], "complete": True}  # fmt: skip
    (cap / "capture.json").write_text(json.dumps(meta))
    return cap


def test_thirty_two_bit_flexible_arrays(tmp_path: Path) -> None:
    """4-byte longs: `unsigned long caller; size:0` is a list of u32 words to the end."""
    trace = tracekit.open(_capture_32(tmp_path), use_cache=False)
    pr = trace.event("print").row(0, named=True)
    assert pr["ip"] == 0xC0101234 and pr["buf"].rstrip("\n") == "hello 32-bit"
    stack = trace.event("kernel_stack")
    assert stack.schema["caller"] == pl.List(pl.UInt32)
    assert stack["caller"].to_list() == [[0xC0001000, 0xC0002000, 0xC0003000]]


def test_bracketless_field_kinds_follow_the_long_size() -> None:
    """The same format text gives 8-byte elements with 8-byte longs, 4 with 4."""
    for long_size in (4, 8):
        fmt = parse_format(STACK_32, "ftrace", long_size)
        caller = next(s for s in fmt.own if s.name == "caller")
        assert (caller.kind, caller.elem_size) == (Kind.TAIL_ARRAY, long_size)
    buf = next(s for s in parse_format(PRINT_32, "ftrace", 4).own if s.name == "buf")
    assert buf.kind == Kind.TAIL_STR
