"""Tool readers on real outputs of Debian's rt-tests, stress-ng and linux-perf."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracekit
from tracekit.errors import TracekitError
from tracekit.ingest.tools import read_tool

TOOLS = Path(__file__).parent / "fixtures" / "ingest" / "tools"


def test_cyclictest_plain() -> None:
    """Every `T:` line is a row with the same numbers."""
    _, tables, skipped = read_tool(TOOLS / "cyclictest.txt")
    threads = tables["cyclictest_threads"]
    want = [line for line in (TOOLS / "cyclictest.txt").read_text().splitlines() if "T:" in line]
    assert threads.height == len(want) == 2 and not skipped
    assert threads["max_us"].to_list() == [int(w.split("Max:")[1]) for w in want]


def test_cyclictest_json_matches_file() -> None:
    """--json: per-thread cycles/min/avg/max as cyclictest wrote them."""
    data = json.loads((TOOLS / "cyclictest.json").read_text())
    threads = tracekit.open(TOOLS / "cyclictest.json", use_cache=False).tools["cyclictest_threads"]
    assert threads["max_us"].to_list() == [data["thread"][k]["max"] for k in ("0", "1")]
    assert threads["avg_us"].to_list() == [data["thread"][k]["avg"] for k in ("0", "1")]


def test_cyclictest_histogram_with_overflows() -> None:
    """-h: cyclictest's Total counts the histogram; with the overflows it is all 300 loops."""
    _, tables, _ = read_tool(TOOLS / "cyclictest-hist.txt")
    summary = tables["cyclictest_summary"].row(0, named=True)
    in_hist = tables["cyclictest_histogram"]["count"].sum()
    assert in_hist == summary["samples"]
    assert in_hist + summary["overflows"] == 300  # -l 300 in make_tool_fixtures.sh
    assert tables["cyclictest_overflows"].height == summary["overflows"] > 0
    assert tables["cyclictest_histogram"]["latency_us"].max() < 40  # -h 40 buckets


@pytest.mark.parametrize("name", ["stress-ng-brief.txt", "stress-ng.yaml"])
def test_stress_ng(name: str) -> None:
    """--metrics-brief and --yaml: one row per stressor with bogo ops and rates."""
    _, tables, _ = read_tool(TOOLS / name)
    df = tables["stress_ng"]
    stressors = df["stressor"].to_list()
    assert "cpu" in stressors and df["bogo_ops"].min() > 0
    assert df["bogo_ops_per_second_real_time"].min() > 0
    if name.endswith(".yaml"):
        assert stressors == ["cpu", "vm"]


def test_perf_stat_interval_per_cpu() -> None:
    """perf stat -x, -A -I: time, CPU, value and event for every line."""
    _, tables, _ = read_tool(TOOLS / "perf-stat.csv")
    df = tables["perf_stat"]
    lines = [x for x in (TOOLS / "perf-stat.csv").read_text().splitlines() if x.strip()]
    assert df.height == len(lines)
    assert set(df["event"]) == {"task-clock", "context-switches", "cpu-migrations"}
    assert set(df["cpu"]) == {0, 1} and df["time_s"].is_sorted()


def test_tool_tables_are_cached(tmp_path: Path) -> None:
    """Tool tables go through the Parquet cache like trace tables."""
    path = tmp_path / "c.json"
    path.write_bytes((TOOLS / "cyclictest.json").read_bytes())
    first = tracekit.open(path).tools["cyclictest_threads"]
    again = tracekit.open(path)
    assert again.from_cache and again.tools["cyclictest_threads"].equals(first)


def test_empty_stress_ng_is_an_error(tmp_path: Path) -> None:
    """stress-ng output without metrics says how to get them."""
    path = tmp_path / "s.txt"
    path.write_text("stress-ng: info:  [1] dispatching hogs: 1 cpu\nstress-ng: metrc: [1]\n")
    with pytest.raises(TracekitError, match="metrics-brief"):
        read_tool(path)


def test_cyclictest_verbose_ns_is_recognised() -> None:
    """-v -N output opens as a tool: every sample, and the T: line in nanoseconds."""
    text = (TOOLS / "cyclictest-verbose.txt").read_text()
    tool, tables, skipped = read_tool(TOOLS / "cyclictest-verbose.txt")
    samples, threads = tables["cyclictest_samples"], tables["cyclictest_threads"]
    assert tool == "cyclictest" and not skipped
    assert samples.height == sum(1 for line in text.splitlines() if line.count(":") == 2)
    assert samples["cycle"].to_list() == list(range(samples.height))
    row = threads.row(0, named=True)  # cyclictest's own summary of the same samples
    assert (row["min_ns"], row["max_ns"]) == (samples["latency_ns"].min(), 858471)
    assert row["max_ns"] == samples["latency_ns"].max()


def test_cyclictest_verbose_without_n_is_scaled_to_ns() -> None:
    """-v without -N prints microseconds (narrower T: fields): samples come out in ns."""
    tables = tracekit.open(TOOLS / "cyclictest-verbose-us.txt", use_cache=False).tools
    samples = tables["cyclictest_samples"]
    assert samples["latency_ns"].to_list() == [30000, 31000, 23000, 15000, 26000]
    row = tables["cyclictest_threads"].row(0, named=True)
    assert (row["min_ns"], row["max_ns"]) == (15000, 31000)


def test_cyclictest_verbose_cut_short_is_still_recognised(tmp_path: Path) -> None:
    """A -v file without its T: line (cyclictest killed) is still cyclictest, assumed -N."""
    path = tmp_path / "killed.txt"
    kept = (TOOLS / "cyclictest-verbose.txt").read_text().splitlines()[:40]
    path.write_text("\n".join(kept) + "\n")
    tables = tracekit.open(path, use_cache=False).tools
    assert "cyclictest_threads" not in tables
    assert tables["cyclictest_samples"]["latency_ns"][0] == 42325
