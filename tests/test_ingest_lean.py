"""Typed tables stored without the events table's columns, shown whole by Trace.event."""

from __future__ import annotations

from pathlib import Path

import polars as pl

import tracekit
from tracekit.ingest.tables import COMMON_COLUMNS, Tables

FIX = Path(__file__).parent / "fixtures" / "ingest"


def test_a_binary_trace_stores_lean_tables_and_shows_them_whole(tmp_path: Path) -> None:
    trace = tracekit.open(FIX / "small.v7.dat", use_cache=False)
    keyed = trace.events.select("row", *COMMON_COLUMNS)
    for name in trace.event_names:
        stored = trace._tables.by_event[name]
        assert not set(COMMON_COLUMNS) & set(stored.columns), name
        whole = trace.event(name)
        assert whole.columns[:4] == ["row", *COMMON_COLUMNS]
        assert whole.columns[4:] == stored.columns[1:]
        # the values are those of the event's own row in the events table
        rows = stored.select(pl.col("row").cast(pl.Int64))  # stored as UInt32
        want = rows.join(keyed, on="row", how="left", maintain_order="left")
        assert whole.select("row", *COMMON_COLUMNS).equals(want), name
    # the Parquet export is the documented (whole) schema, the cache the lean one
    out = trace.write_parquet(tmp_path / "export")
    switch = pl.read_parquet(out / "event-sched_switch.parquet")
    assert switch.equals(trace.event("sched_switch"))


def test_rows_that_are_not_positions_are_joined_by_key() -> None:
    events = pl.DataFrame(
        {"row": [10, 11, 12], "ts": [5, 6, 7], "cpu": [0, 1, 0], "common_pid": [1, 2, 3]},
        schema={"row": pl.Int64, "ts": pl.Int64, "cpu": pl.Int32, "common_pid": pl.Int32},
    )
    lean = pl.DataFrame({"row": [12, 10], "x": [1, 2]})
    tables = Tables(events, {"e": lean}, pl.DataFrame(), {})
    whole = tables.event("e")
    assert whole.rows() == [(12, 7, 0, 3, 1), (10, 5, 0, 1, 2)]
    assert whole.columns == ["row", "ts", "cpu", "common_pid", "x"]
