"""Each distinct cause of a traceback that fuzzing found (issue 16 point 3), as one input.

tests/test_ingest_fuzz.py draws a few mutations per reader, so a cause it once hit may
not come up again; here each cause the issue names is made on purpose, from the same
seeds (tests/fuzzing.py), and read as a user's command would read it: the events, every
table, the summary and `tracekit events` (with `--salvage` where the error advises it).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from fuzzing import outcome, seed_copy

import tracekit

# case -> (reader, seed, file of the seed ('' for the seed itself), bytes, replaced by):
# the first occurrence is replaced (b"" puts the new bytes at the start of the file).
CASES: dict[str, tuple[str, str, str, bytes, bytes]] = {
    "format file not UTF-8": (
        "raw capture", "ingest/rawcap", "events/sched/sched_switch/format",
        b"sched_switch", b"sched_\xff\xfewitch",
    ),
    "stats not UTF-8": ("raw capture", "ingest/rawcap", "per_cpu/cpu0/stats", b"", b"\xff\xfe"),
    "capture.json not UTF-8": ("raw capture", "ingest/rawcap", "capture.json", b"", b"\xff"),
    "text pid beyond Int32": (
        "ftrace text", "ingest/small.trace.txt", "",
        b"python3-8085 ", b"python3-99999999999999999999 ",
    ),
    "text CPU beyond Int32": (
        "ftrace text", "ingest/small.trace.txt", "", b"[001]", b"[99999999999]",
    ),
    "perf script pid beyond Int32": (
        "perf script", "ingest/perf-script.txt", "",
        b"perf 10530 ", b"perf 99999999999999999999 ",
    ),
    "perf script address beyond 64 bits": (
        "perf script", "ingest/perf-script-cpuclock-g.txt", "",
        b"ffffffff815a4bc1", b"ffffffffffffffffff815a4bc1",
    ),
    "cyclictest summary non-digit": (
        "cyclictest", "ingest/tools/cyclictest.txt", "", b"C:    300", b"C:    3x0",
    ),
    "cyclictest latency beyond Int64": (
        "cyclictest", "ingest/tools/cyclictest-verbose.txt", "",
        b"       0:       0:   42325", b"       0:       0:   99999999999999999999",
    ),
    "perf stat line of four fields": (
        "perf stat", "ingest/tools/perf-stat.csv", "", b"", b"1,2,3,4\n",
    ),
    "perf stat form feed": ("perf stat", "ingest/tools/perf-stat.csv", "", b"", b"\x0c\n"),
}  # fmt: skip


def _damaged(case: str, dest: Path) -> Path:
    """A copy of the case's seed under `dest`, damaged as the case says."""
    _, seed, rel, old, new = CASES[case]
    path = seed_copy(seed, dest)
    target = path / rel if rel else path
    data = target.read_bytes()
    assert old in data, (target, old)  # the seed still holds what the case changes
    target.write_bytes(data.replace(old, new, 1))
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_each_cause_fuzzing_found_reads_or_fails_in_one_line(tmp_path: Path, case: str) -> None:
    got = outcome(_damaged(case, tmp_path), CASES[case][0])
    assert got.kind in ("read", "error"), f"{case}: {got.detail}: {got.message}"


# The cases whose damaged line is read as no event: (events fewer than the seed's, the
# skipped note's start): never dropped without a word.
SAID = {
    "text pid beyond Int32": (1, "1 line(s) that are not events (first: line 13: "),
    "text CPU beyond Int32": (1, "1 line(s) that are not events (first: line 13: "),
    "perf script pid beyond Int32": (1, "1 line(s) that are not samples (first: line 1: "),
    "perf script address beyond 64 bits": (0, "1 line(s) that are not samples (first: line 2: "),
}


@pytest.mark.parametrize("case", list(SAID))
def test_a_line_beyond_the_integer_types_is_said_as_skipped(tmp_path: Path, case: str) -> None:
    (tmp_path / "whole").mkdir()
    whole = tracekit.open(seed_copy(CASES[case][1], tmp_path / "whole"), use_cache=False)
    trace = tracekit.open(_damaged(case, tmp_path), use_cache=False)
    fewer, note = SAID[case]
    assert trace.events.height == whole.events.height - fewer
    assert any(line.startswith(note) for line in trace.meta["skipped"]), trace.meta["skipped"]


def test_salvage_of_a_trace_cut_before_a_cpus_data_reads_the_other_cpu(tmp_path: Path) -> None:
    # small.v6.dat holds CPU 1's data from byte 57344 (read_tracedat's CpuData.file_offset):
    # cut there, the plain open refuses it and advises --salvage, which once crashed.
    path = seed_copy("ingest/small.v6.dat", tmp_path)
    path.write_bytes(path.read_bytes()[:57344])
    assert outcome(path, "trace.dat v6").kind == "read"
    trace = tracekit.open(path, use_cache=False, salvage=True)
    assert set(trace.events["cpu"].unique().to_list()) == {0}
    assert any("CPU 1" in line for line in trace.meta["skipped"])


# small.v6.dat's uname option: u16 id 5, u32 size 32, then its text.
UNAME_AT, UNAME_SIZE = 36057, 32


@pytest.mark.parametrize(
    ("option", "body"),
    [(n, b"") for n in (1, 2, 3, 4, 5, 7, 8, 9, 14)] + [(7, b"0xzz\0")],
    ids=[f"empty-{n}" for n in (1, 2, 3, 4, 5, 7, 8, 9, 14)] + ["offset-not-a-number"],
)
def test_an_empty_trace_dat_option_reads_or_fails_in_one_line(
    tmp_path: Path, option: int, body: bytes
) -> None:
    # The uname option becomes an empty (or short) one of another kind, followed by an
    # unknown option holding the rest of its bytes: every offset after it stays put. An
    # empty OFFSET option (7) was a TypeError in int().
    path = seed_copy("ingest/small.v6.dat", tmp_path)
    data = bytearray(path.read_bytes())
    assert struct.unpack_from("<HI", data, UNAME_AT) == (5, UNAME_SIZE)
    filler = UNAME_SIZE - 6 - len(body)
    data[UNAME_AT : UNAME_AT + 6 + UNAME_SIZE] = (
        struct.pack("<HI", option, len(body)) + body + struct.pack("<HI", 30, filler)
    ) + bytes(filler)
    path.write_bytes(bytes(data))
    got = outcome(path, "trace.dat v6")
    assert got.kind in ("read", "error"), f"option {option}: {got.detail}: {got.message}"
    if option == 7 and body:
        assert "the time offset option at offset 36063 is not a number: '0xzz'" in got.detail
