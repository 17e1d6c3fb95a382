"""A whole bundle through tracekit.open and `tracekit ingest`: every run's trace, tagged.

The bundles are built here from real recordings: the rawcap fixture (a raw capture made
by collect's capture code on this machine's tracefs) and the small trace.dat fixture,
plus real cyclictest -v and stress-ng --yaml outputs (tests/fixtures/ingest/README.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
from click.testing import CliRunner

import tracekit
from tracekit.bundle import EMULATED_LINE, Manifest, RunRecord
from tracekit.cli import main
from tracekit.ingest.summary import INCOMPLETE_LINE

FIX = Path(__file__).parent / "fixtures" / "ingest"


def _bundle(
    tmp_path: Path, emulated: bool = False, traces: bool = True, complete: bool = True
) -> Path:
    """Three runs: a traced run with a raw capture, a quiet one, a traced one with trace.dat."""
    root = tmp_path / "bundle"
    runs = [
        RunRecord("before-traced-0", "before", "traced", 0, status="ok"),
        RunRecord("before-quiet-0", "before", "quiet", 0, status="ok"),
        RunRecord("after-traced-0", "after", "traced", 0, status="ok" if complete else "running"),
    ]
    for run in runs:
        (root / "runs" / run.run_id).mkdir(parents=True)
    if traces:
        shutil.copytree(FIX / "rawcap", root / "runs" / "before-traced-0" / "trace")
        shutil.copyfile(FIX / "small.v7zstd.dat", root / "runs" / "after-traced-0" / "trace.dat")
    quiet = root / "runs" / "before-quiet-0"
    shutil.copyfile(FIX / "tools" / "cyclictest-verbose.txt", quiet / "cyclictest.txt")
    shutil.copyfile(FIX / "tools" / "stress-ng.yaml", quiet / "stress-ng.yaml")
    manifest = Manifest(host={"emulated": emulated}, runs=runs, complete=complete)
    (root / "manifest.json").write_text(json.dumps(manifest.to_json()))
    return root


def test_a_bundle_opens_as_its_runs_traces_stacked(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    before = tracekit.open(FIX / "rawcap", use_cache=False)
    after = tracekit.open(FIX / "small.v7zstd.dat", use_cache=False)
    trace = tracekit.open(root)
    events = trace.events
    assert events.height == before.events.height + after.events.height
    assert events["row"].to_list() == list(range(events.height))  # still a unique key
    per_run = events.group_by(pl.col("run_id").cast(pl.String), pl.col("phase").cast(pl.String))
    counts = {(r, p): n for r, p, n in per_run.len().iter_rows()}
    assert counts == {
        ("before-traced-0", "before"): before.events.height,
        ("after-traced-0", "after"): after.events.height,
    }
    # A typed table's rows point at the same events in the stacked table.
    switch = trace.event("sched_switch")
    joined = switch.join(events, on="row", suffix="_ev")
    assert joined.height == switch.height
    assert (joined["ts"] == joined["ts_ev"]).all() and (
        joined["run_id"] == joined["run_id_ev"]
    ).all()
    assert switch.filter(pl.col("run_id") == "after-traced-0").height == (
        after.event("sched_switch").height
    )
    assert "run_id" in trace.lost.columns
    assert trace.meta["phases"] == ["before", "after"]
    assert set(trace.tools) == {"cyclictest_samples", "stress_ng"}
    assert trace.tools["cyclictest_samples"]["run_id"].unique().to_list() == ["before-quiet-0"]


def test_a_bundle_is_cached_in_the_bundle(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    assert not tracekit.open(root).from_cache
    again = tracekit.open(root)
    assert again.from_cache and again.meta["cache"] == "beside each run's trace, in the bundle"
    assert list((root / "runs" / "after-traced-0").glob(".trace.dat.tracekit/*.parquet"))


def test_ingest_summarises_a_bundle_with_its_runs(tmp_path: Path) -> None:
    root = _bundle(tmp_path, emulated=True)
    result = CliRunner().invoke(main, ["ingest", str(root)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == EMULATED_LINE
    assert lines[1].startswith("bundle: ") and "2 run trace(s)" in lines[2]
    assert "runs (2, phases before, after):" in lines
    run_lines = [line.split() for line in lines if line.startswith("  ") and "events" in line]
    assert [r[:3] for r in run_lines] == [
        ["before-traced-0", "before", "traced"],
        ["after-traced-0", "after", "traced"],
    ]
    assert any(line.startswith("cyclictest_samples: ") for line in lines)


def test_a_bundle_without_traces_still_opens(tmp_path: Path) -> None:
    trace = tracekit.open(_bundle(tmp_path, traces=False))
    assert trace.events.is_empty() and {"run_id", "phase"} <= set(trace.events.columns)
    assert "runs with a trace: none (the bundle's tool results are below)" in trace.summary()
    assert "stress_ng" in trace.tools


def test_an_interrupted_bundle_says_so_first(tmp_path: Path) -> None:
    """manifest.complete false: INCOMPLETE heads the summary; an unfinished run says so."""
    summary = tracekit.open(_bundle(tmp_path, complete=False)).summary().splitlines()
    assert summary[0] == INCOMPLETE_LINE
    (after,) = [line for line in summary if line.startswith("  after-traced-0 ")]
    assert after.endswith("no losses  (run running)")
    (before,) = [line for line in summary if line.startswith("  before-traced-0 ")]
    assert before.endswith("no losses")


def test_events_of_one_phase_or_run(tmp_path: Path) -> None:
    """--phase/--run pick rows; an unknown one, or either on a bare trace, is one line."""
    root = str(_bundle(tmp_path))
    res = CliRunner().invoke(main, ["events", root, "--phase", "after", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert len(rows) == tracekit.open(FIX / "small.v7zstd.dat").events.height
    assert {r["run_id"] for r in rows} == {"after-traced-0"}
    res = CliRunner().invoke(
        main, ["events", root, "--run", "before-traced-0", "-e", "sched_switch", "--format", "csv"]
    )
    assert res.exit_code == 0 and len(res.output.splitlines()) == 1 + 38  # header + rows
    res = CliRunner().invoke(main, ["events", root, "--phase", "guest"])
    assert res.exit_code == 2 and "this bundle's traced phases are before, after" in res.output
    res = CliRunner().invoke(main, ["events", str(FIX / "small.v7zstd.dat"), "--run", "x"])
    assert res.exit_code == 2 and "--run needs a bundle" in res.output
