"""Damage that used to lose events silently: every count the capture states (per-CPU
stats, page commits, the CPU list) is checked against what was decoded, and a difference
is a lost-table row, or a clear error when the capture cannot be read as it says."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import main
from tracekit.errors import TracekitError

RAWCAP = Path(__file__).parent / "fixtures" / "ingest" / "rawcap"
READ = {0: 28, 1: 213}  # the fixture's per-CPU `read events`, all of them in its pages


@pytest.fixture
def cap(tmp_path: Path) -> Path:
    """A private copy of the raw capture fixture."""
    return Path(shutil.copytree(RAWCAP, tmp_path / "cap"))


def _set_meta(cap: Path, key: str, value: object) -> None:
    """Change one key of the copy's capture.json."""
    meta = json.loads((cap / "capture.json").read_text())
    meta[key] = value
    (cap / "capture.json").write_text(json.dumps(meta))


def _stats_lost(path: Path) -> dict[int, int]:
    """CPU -> events the stats say were read but the capture does not hold."""
    lost = tracekit.open(path, use_cache=False).lost.filter(source="stats_read")
    return dict(lost.select("cpu", "count").rows())


def test_undamaged_capture_loses_nothing(cap: Path) -> None:
    """The check is quiet when stats and pages agree."""
    trace = tracekit.open(cap, use_cache=False)
    assert trace.lost.height == 0
    assert dict(trace.events.group_by("cpu").len().rows()) == READ


@pytest.mark.parametrize("how", ["removed", "emptied"])
def test_missing_cpu_pages_are_lost_events(cap: Path, how: str) -> None:
    """A CPU's trace_pipe_raw removed or empty while its stats say it read 213 events."""
    raw = cap / "per_cpu" / "cpu1" / "trace_pipe_raw"
    raw.unlink() if how == "removed" else raw.write_bytes(b"")
    assert _stats_lost(cap) == {1: READ[1]}
    res = CliRunner().invoke(main, ["ingest", "--no-cache", str(cap)])
    assert res.exit_code == 0 and "none reported" not in res.output
    assert "stats_read" in res.output


def test_cut_pages_are_lost_events(cap: Path) -> None:
    """Whole pages cut off a CPU's data: the events they held count as lost."""
    raw = cap / "per_cpu" / "cpu1" / "trace_pipe_raw"
    data = raw.read_bytes()
    raw.write_bytes(data[: len(data) // 2 // 4096 * 4096])
    held = tracekit.open(cap, use_cache=False).events.filter(cpu=1).height
    assert 0 < held < READ[1] and _stats_lost(cap) == {1: READ[1] - held}


def test_page_with_commit_zero_is_reported(cap: Path) -> None:
    """A page whose commit word is 0 (zeroed): an empty_page row, and its events lost."""
    raw = cap / "per_cpu" / "cpu1" / "trace_pipe_raw"
    data = bytearray(raw.read_bytes())
    data[8:16] = struct.pack("<Q", 0)  # first page's commit word
    raw.write_bytes(bytes(data))
    lost = tracekit.open(cap, use_cache=False).lost
    empty = lost.filter(source="empty_page")
    assert empty.select("cpu", "page").rows() == [(1, 0)] and empty["count"].null_count() == 1
    assert lost.filter(source="stats_read")["count"].item() > 0


@pytest.mark.parametrize("page_size", [0, -1, "4096", None, 10])
def test_bad_page_size_is_a_clear_error(cap: Path, page_size: object) -> None:
    """page_size 0, -1, a string, null or smaller than the page header: one clear line."""
    _set_meta(cap, "page_size", page_size)
    with pytest.raises(TracekitError, match=r"page_size .* is not a ring-buffer page size"):
        tracekit.open(cap, use_cache=False)


def test_cpu_missing_from_the_list_is_still_read(cap: Path) -> None:
    """capture.json listing CPU 0 only: CPU 1's pages are read anyway, and that is said."""
    _set_meta(cap, "cpus", [0, 5])
    trace = tracekit.open(cap, use_cache=False)
    assert dict(trace.events.group_by("cpu").len().rows()) == READ
    assert any("does not list CPU(s) [1]" in s for s in trace.meta["skipped"])


@pytest.mark.parametrize("cpus", [["0", "1"], "0-1", [0, -1], [0.0, 1]])
def test_cpu_list_of_the_wrong_type_is_a_clear_error(cap: Path, cpus: object) -> None:
    """cpus that are not CPU numbers: one clear line, not a traceback."""
    _set_meta(cap, "cpus", cpus)
    with pytest.raises(TracekitError, match="is not a list of CPU numbers"):
        tracekit.open(cap, use_cache=False)


def test_v7_buffer_option_with_another_id_is_lost_not_empty(tmp_path: Path) -> None:
    """small.v7.dat's BUFFER option (id 3, 81 bytes at byte 65552) given id 99: no pages
    are found, and the instance's CPUSTAT read events (357, 146) are reported lost."""
    data = bytearray((RAWCAP.parent / "small.v7.dat").read_bytes())
    assert struct.unpack_from("<HI", data, 65552) == (3, 81)
    struct.pack_into("<H", data, 65552, 99)
    path = tmp_path / "buf99.dat"
    path.write_bytes(bytes(data))
    trace = tracekit.open(path, use_cache=False)
    assert trace.events.height == 0 and _stats_lost(path) == {0: 357, 1: 146}
    assert any("99 (81 bytes)" in s for s in trace.meta["skipped"])


def test_padding_at_a_page_start_is_lost_events(cap: Path) -> None:
    """A first record turned into padding with delta 0 (the rest of the page is padding):
    the page's events are not decoded, and the stats' read events say how many."""
    raw = cap / "per_cpu" / "cpu1" / "trace_pipe_raw"
    data = bytearray(raw.read_bytes())
    data[16:20] = struct.pack("<I", 29)  # type_len 29, time delta 0
    raw.write_bytes(bytes(data))
    held = tracekit.open(cap, use_cache=False).events.filter(cpu=1).height
    assert held < READ[1] and _stats_lost(cap) == {1: READ[1] - held}
