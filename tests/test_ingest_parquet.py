"""`tracekit ingest X --parquet DIR`: the tables as Parquet that polars, pyarrow and DuckDB
read back the same, listed in tables.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.ingest import open_path

FIX = Path(__file__).parent / "fixtures" / "ingest"


def test_every_table_reads_back_in_polars_pyarrow_and_duckdb(tmp_path: Path) -> None:
    trace_file = tmp_path / "small.v7zstd.dat"
    shutil.copy(FIX / "small.v7zstd.dat", trace_file)
    out = tmp_path / "tables"
    res = CliRunner().invoke(main, ["ingest", str(trace_file), "--parquet", str(out)])
    assert res.exit_code == 0, res.output
    assert f"parquet: {out}" in res.output
    trace = open_path(trace_file)
    index = json.loads((out / "tables.json").read_text())
    assert index["source"] == "small.v7zstd.dat" and index["meta"]["cpus"] == [0, 1]
    assert set(index["tables"]) == {"events", "lost"} | {f"event:{n}" for n in trace.event_names}
    for name, entry in index["tables"].items():
        path = out / entry["file"]
        want = trace.events if name == "events" else trace.lost if name == "lost" else None
        if want is None:
            want = trace.event(name.split(":", 1)[1])
        assert entry["rows"] == want.height and list(entry["columns"]) == want.columns
        assert pl.read_parquet(path).equals(want)  # types and values, as ingested
        arrow = pq.read_table(path)
        assert arrow.num_rows == want.height and arrow.column_names == want.columns
    # SQL over the export: sched_switch per CPU, the same as polars counts in memory.
    switch = out / index["tables"]["event:sched_switch"]["file"]
    sql = f"select cpu, count(*) from read_parquet('{switch}') group by cpu order by cpu"
    counted = duckdb.sql(sql).fetchall()
    expected = trace.event("sched_switch").group_by("cpu").len().sort("cpu").rows()
    assert counted == expected and sum(n for _, n in counted) > 0


def test_a_bundle_exports_its_runs_and_tool_tables(tmp_path: Path) -> None:
    from vm_bundles import make_vm_bundle

    bundle = make_vm_bundle(tmp_path / "b", {"guest": "teardown-6.1-a76"}, "6.1.0-50-arm64")
    out = open_path(bundle).write_parquet(tmp_path / "tables")
    assert json.loads((out / "tables.json").read_text())["tables"]["events"]["rows"] > 0
    runs = duckdb.sql(f"select distinct run_id from read_parquet('{out / 'events.parquet'}')")
    assert runs.fetchall() == [("guest",)]
    # Quiet runs' tool results (cyclictest, stress-ng) are tables too.
    from report_bundles import make_bundle

    quiet = open_path(make_bundle(tmp_path / "q", runs=2, factor=1.0))
    out = quiet.write_parquet(tmp_path / "quiet")
    tools = json.loads((out / "tables.json").read_text())["tables"]
    for name, frame in quiet.tools.items():
        assert pl.read_parquet(out / tools[f"tool:{name}"]["file"]).equals(frame)
    assert "tool:cyclictest_samples" in tools


def test_a_directory_with_other_files_is_refused(tmp_path: Path) -> None:
    trace_file = tmp_path / "small.v7zstd.dat"
    shutil.copy(FIX / "small.v7zstd.dat", trace_file)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    res = CliRunner().invoke(main, ["ingest", str(trace_file), "--parquet", str(busy)])
    assert res.exit_code != 0 and "holds other files; name a new or empty one" in res.output
    assert (busy / "notes.txt").read_text() == "mine\n"
    # A previous export is replaced whole.
    again = tmp_path / "again"
    for _ in range(2):
        assert (
            CliRunner().invoke(main, ["ingest", str(trace_file), "--parquet", str(again)]).exit_code
            == 0
        )
    assert len(list(again.glob("*.parquet"))) == len(
        json.loads((again / "tables.json").read_text())["tables"]
    )
