"""`tracekit ingest` and `tracekit events` through click, on real fixtures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from tracekit.cli import main

FIX = Path(__file__).parent / "fixtures" / "ingest"


def _copy(tmp: Path, name: str) -> str:
    """A private copy (the cache is written beside it)."""
    shutil.copy(FIX / name, tmp / name)
    return str(tmp / name)


def test_ingest_summary(tmp_path: Path) -> None:
    """The summary names the format, counts per type and CPU, and the losses."""
    res = CliRunner().invoke(main, ["ingest", _copy(tmp_path, "overrun.v7zstd.dat")])
    assert res.exit_code == 0, res.output
    assert "trace.dat v7 (zstd)" in res.output
    assert "sched_switch" in res.output and "cpu1" in res.output
    assert "cpu0 page_flag: 358 events" in res.output
    assert "cpu1 page_flag: count unknown" in res.output


def test_events_filters_and_formats(tmp_path: Path) -> None:
    """--event/--cpu filter; json and csv print every row asked for."""
    path = _copy(tmp_path, "small.v7zstd.dat")
    res = CliRunner().invoke(
        main, ["events", path, "--event", "sched_switch", "--cpu", "1", "--format", "json"]
    )
    rows = json.loads(res.output)
    assert rows and {r["cpu"] for r in rows} == {1} and "next_comm" in rows[0]
    res = CliRunner().invoke(main, ["events", path, "--format", "csv", "--limit", "5"])
    assert res.output.splitlines()[0].startswith("row,ts,cpu,pid")
    assert len(res.output.splitlines()) == 6


def test_user_mistakes_are_one_line(tmp_path: Path) -> None:
    """Missing file, unknown event, corrupt file: one 'tracekit: error:' line, exit 2."""
    bad = tmp_path / "bad.dat"
    bad.write_bytes((FIX / "small.v6.dat").read_bytes()[:30000])
    for args in (
        ["ingest", str(tmp_path / "missing.dat")],
        ["events", _copy(tmp_path, "small.v7.dat"), "--event", "nope"],
        ["ingest", str(bad)],
    ):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2
        assert res.output.startswith("tracekit: error: ") and res.output.count("\n") == 1
