"""Text readers agree with the binary decode of the same recording."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from ingest_truth import have_trace_cmd

import tracekit
from tracekit.errors import TracekitError
from tracekit.ingest import Trace

FIX = Path(__file__).parent / "fixtures" / "ingest"


@pytest.fixture(scope="module")
def binary() -> Trace:
    """The binary decode of the recording the text fixtures were printed from."""
    return tracekit.open(FIX / "small.v7.dat", use_cache=False)


@pytest.mark.parametrize("name", ["small.trace.txt", "small.trace-noirq.txt", "small.report.txt"])
def test_text_matches_binary(binary: Trace, name: str) -> None:
    """Same events, µs timestamps, CPUs, pids; trace text names print tracing_mark_write."""
    text = tracekit.open(FIX / name, use_cache=False).events
    ev = binary.events
    assert text.height == ev.height
    assert text["ts"].to_list() == ((ev["ts"] + 500) // 1000 * 1000).to_list()  # rounded to µs
    assert text["cpu"].to_list() == ev["cpu"].to_list()
    assert text["common_pid"].to_list() == ev["common_pid"].to_list()
    want = ev["event"].to_list()
    if name != "small.report.txt":
        want = [w.replace("print", "tracing_mark_write") for w in want]
    assert text["event"].to_list() == want


def test_text_fields_are_typed(binary: Trace) -> None:
    """key=value fields become integer columns when every value is an integer."""
    text = tracekit.open(FIX / "small.trace.txt", use_cache=False)
    wake = text.event("sched_wakeup")
    assert wake["pid"].to_list() == binary.event("sched_wakeup")["pid"].cast(int).to_list()
    assert wake["comm"].to_list() == binary.event("sched_wakeup")["comm"].to_list()


def test_irq_info_preempt_depth(binary: Trace) -> None:
    """The irq-info column's preempt-depth digit is read; without the column it is null."""
    with_irq = tracekit.open(FIX / "small.trace.txt", use_cache=False).events
    assert with_irq["preempt_count"].null_count() == 0
    assert with_irq["preempt_count"].max() > 0
    without = tracekit.open(FIX / "small.trace-noirq.txt", use_cache=False).events
    assert without["preempt_count"].null_count() == without.height


@pytest.mark.skipif(not have_trace_cmd(), reason="trace-cmd is not installed")
def test_events_dropped_markers(tmp_path: Path) -> None:
    """trace-cmd report's [N EVENTS DROPPED] lines land in the lost table."""
    out = tmp_path / "overrun.txt"
    with open(out, "w") as f:
        subprocess.run(["trace-cmd", "report", str(FIX / "overrun.v7zstd.dat")], stdout=f,
                       check=True)  # fmt: skip
    lost = tracekit.open(out, use_cache=False).lost
    assert sorted(lost["count"].to_list(), key=lambda c: c or -1) == [None, 358]
    assert set(lost["source"]) == {"text_marker"}


def test_lost_marker_of_tracefs(tmp_path: Path) -> None:
    """tracefs's CPU:N [LOST n EVENTS] line (as the kernel prints it) is a lost row."""
    lines = (FIX / "small.trace.txt").read_text().splitlines()
    lines.insert(20, "CPU:1 [LOST 42 EVENTS]")
    path = tmp_path / "lost.txt"
    path.write_text("\n".join(lines) + "\n")
    lost = tracekit.open(path, use_cache=False).lost
    assert lost.select("cpu", "count").rows() == [(1, 42)]
    assert "line 21" in lost["detail"][0]


def test_unparsed_lines_are_reported(tmp_path: Path) -> None:
    """Lines that are not events are counted in the summary, not silently dropped."""
    path = tmp_path / "junk.txt"
    path.write_text((FIX / "small.trace.txt").read_text() + "garbage line here\n")
    trace = tracekit.open(path, use_cache=False)
    assert trace.meta["unparsed_lines"] == 1
    assert "garbage line here" in trace.summary()


def test_not_a_trace(tmp_path: Path) -> None:
    """A text file without events is one clear error."""
    path = tmp_path / "notes.txt"
    path.write_text("hello\nworld\n")
    with pytest.raises(TracekitError, match="no event lines"):
        tracekit.open(path, use_cache=False)


@pytest.mark.skipif(not have_trace_cmd(), reason="trace-cmd is not installed")
@pytest.mark.parametrize("flags", [["-t"], ["-R", "-t"], ["-N", "-t"]])
def test_report_variants_match_binary(binary: Trace, tmp_path: Path, flags: list[str]) -> None:
    """`trace-cmd report -t` (ns), raw -R and -N text give the binary's events exactly."""
    out = tmp_path / "report.txt"
    with open(out, "w") as f:
        subprocess.run(["trace-cmd", "report", *flags, str(FIX / "small.v7.dat")], stdout=f,
                       check=True)  # fmt: skip
    text = tracekit.open(out, use_cache=False).events
    assert text["ts"].to_list() == binary.events["ts"].to_list()
    assert text["event"].cast(str).to_list() == binary.events["event"].cast(str).to_list()
    assert text["comm"].cast(str).to_list() == binary.events["comm"].cast(str).to_list()


def test_key_values_by_position_agree_with_the_regex() -> None:
    """Plain `k=v` lines take the split, the others the regex; the values never differ."""
    import polars as pl

    from tracekit.ingest.text import _key_by_regex, _key_values

    fields = pl.Series(
        [
            "irq=11 name=arch_timer",  # plain: the first line decides the fast path
            "irq=12 name=virtio0",
            "irq=13 name=a\tb",  # a tab ends a value for the regex: this line takes it
            "name=swapped irq=14",  # another order
            "irq=15 name=x extra",  # more tokens
            "irq=16",  # fewer
            None,
        ]
    )
    keys = ["irq", "name"]
    fast = _key_values(fields, keys)
    slow = [_key_by_regex(fields, key) for key in keys]
    for got, want in zip(fast, slow, strict=True):
        assert got.to_list() == want.to_list()
    assert fast[1].to_list()[:4] == ["arch_timer", "virtio0", "a", "swapped"]
    # A first line of another shape sends the whole group to the regex.
    odd = pl.Series(["vec=1 [action=RCU]", "vec=7 [action=SCHED]"])
    assert _key_values(odd, ["vec"])[0].to_list() == ["1", "7"]
