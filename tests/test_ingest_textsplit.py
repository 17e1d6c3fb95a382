"""The cheap byte cuts of textsplit.py and the full EVENT_RE agree, line for line.

Lines the cuts cannot read (odd comm names, unusual timestamps) must still become the
same events through the regex, in line order, and nothing may be lost between the paths.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.ingest.textsplit import (
    SPLIT_SCHEMA,
    decode_prefixes,
    parse_slow,
    scan_lines,
    split_events,
)

FIX = Path(__file__).parent / "fixtures" / "ingest"
TEXTS = ["small.trace.txt", "small.trace-noirq.txt", "small.report.txt", "rawcap.trace.txt"]


def _both_paths(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(events by the byte cuts, events by EVENT_RE) of every line of a file."""
    fit, _ = split_events(scan_lines(path))
    fast, bad = decode_prefixes(fit)
    assert bad.len() == 0
    slow, _ = parse_slow(scan_lines(path).collect())
    return fast.cast(SPLIT_SCHEMA), slow.cast(SPLIT_SCHEMA)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", TEXTS)
def test_cuts_equal_regex(name: str) -> None:
    """Every column of every event line is the same by both paths."""
    fast, slow = _both_paths(FIX / name)
    assert fast.height > 200
    assert fast.equals(slow)


def test_utf8_comm_takes_the_fast_path(tmp_path: Path) -> None:
    """A UTF-8 comm: byte offsets stay right, the comm is kept whole."""
    text = (FIX / "small.trace.txt").read_text().replace("python3-8085", "pythön3-8085")
    path = tmp_path / "utf8.txt"
    path.write_text(text)
    fast, slow = _both_paths(path)
    assert fast.equals(slow)
    assert "pythön3" in fast["comm"].cast(str).to_list()


def test_instance_ending_in_a_digit_takes_the_exact_search(tmp_path: Path) -> None:
    """Every line behind `tk1: `: the fast search stops at the instance's colon, the
    exact one finds the timestamp, and the events equal the regex's, line for line."""
    lines = (FIX / "small.report.txt").read_text().splitlines()
    path = tmp_path / "inst1.txt"
    path.write_text("".join(f"tk1: {line}\n" if "[00" in line else f"{line}\n" for line in lines))
    fast, slow = _both_paths(path)
    assert fast.height == sum("[00" in line for line in lines) > 200
    assert fast.equals(slow)


def _edit(tmp_path: Path, lines: dict[int, str]) -> tuple[Path, int]:
    """small.report.txt with some lines replaced; (its path, its event count)."""
    text = (FIX / "small.report.txt").read_text().splitlines()
    for at, line in lines.items():
        text[at] = line
    path = tmp_path / "edited.txt"
    path.write_text("\n".join(text) + "\n")
    return path, sum(1 for t in text if "[00" in t)


def test_lines_the_cuts_misread_go_through_the_regex(tmp_path: Path) -> None:
    """A comm that looks like a timestamp, a ms timestamp and an instance ending in a
    digit are events all the same, in their line order."""
    odd = {
        5: "        a.123456: b-77    [001]  2690.353500: sched_waking:         comm=x pid=1",
        6: "          python3-8085  [001]  2690.353: sched_waking:         comm=y pid=2",
        7: "inst1:           cat-90    [000]  2690.353600: sched_waking:         comm=z pid=3",
    }
    path, count = _edit(tmp_path, odd)
    trace = tracekit.open(path, use_cache=False)
    ev = trace.events
    assert ev.height == count and trace.meta["unparsed_lines"] == 0
    rows = ev.slice(4, 3).select(pl.col("comm").cast(str), "common_pid", "ts").rows()
    assert rows == [("a.123456: b", 77, 2690353500000), ("python3", 8085, 2690353000000),
                    ("cat", 90, 2690353600000)]  # fmt: skip
    assert ev["row"].to_list() == list(range(ev.height))
    assert trace.event("sched_waking").filter(pl.col("common_pid") == 77)["comm"].to_list() == ["x"]


def test_not_events_are_counted_once(tmp_path: Path) -> None:
    """A line that looks almost like an event is reported, the markers are lost rows."""
    path, count = _edit(
        tmp_path,
        {
            5: "          python3-8085  [001]  2690.353500: bad:event: x",
            6: "tk: CPU:1 [12 EVENTS DROPPED]",
        },
    )
    trace = tracekit.open(path, use_cache=False)
    assert trace.events.height == count - 1
    assert trace.meta["unparsed_lines"] == 1 and "bad:event" in trace.meta["skipped"][0]
    assert trace.lost.select("cpu", "count").rows() == [(1, 12)]
