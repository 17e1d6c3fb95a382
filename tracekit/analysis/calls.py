"""Kernel calls from entry and return probes: the one pairing every analysis and export uses.

A kprobe `tracekit/F` fires at F's entry and `tracekit/F_ret` at its return. A call is
matched per thread, never per CPU (a task can migrate inside a call), as a call stack:
a return closes the latest open entry of its thread at the same depth, so recursion and
nesting pair right. An entry that never returned (the trace ended inside it, an event
lost) keeps a null end; a return with no entry is counted, never guessed at.
"""

from __future__ import annotations

import polars as pl

CALL_SCHEMA = {
    "pid": pl.Int32,
    "cpu": pl.Int32,  # where the call started
    "start_ts": pl.Int64,
    "end_ts": pl.Int64,  # null: no return recorded
    "dur_ns": pl.Int64,
    "entry_row": pl.Int64,  # the entry event's row, for its fetched arguments
}


def pair_calls(entries: pl.DataFrame, returns: pl.DataFrame | None) -> tuple[pl.DataFrame, int]:
    """One row per entry (CALL_SCHEMA, by start), and how many returns had no entry.

    Both tables have ts and common_pid, and ingest's row and cpu (without row, events are
    ordered by ts). Without a return table every end is null.
    """
    edges = [_edges(entries, +1)]
    if returns is not None:
        edges.append(_edges(returns, -1))
    both = pl.concat(edges).sort("pid", "row")
    # Depth after an entry, before a return: an entry and its return share a level.
    depth = pl.col("step").cum_sum().over("pid")
    both = both.with_columns(
        pl.when(pl.col("step") > 0).then(depth).otherwise(depth + 1).alias("level")
    )
    opened = both.filter(pl.col("step") > 0)
    closed = both.filter(pl.col("step") < 0).select(
        "pid", "level", pl.col("row").alias("ret_row"), pl.col("ts").alias("end_ts")
    )
    # Each return closes the latest entry before it at its level, in its thread.
    matched = closed.sort("ret_row").join_asof(
        opened.select("pid", "level", pl.col("row").alias("entry_row")).sort("entry_row"),
        left_on="ret_row",
        right_on="entry_row",
        by=["pid", "level"],
        strategy="backward",
        check_sortedness=False,
    )
    closing = matched.filter(pl.col("entry_row").is_not_null())
    ends = closing.unique("entry_row", keep="first", maintain_order=True)
    # A return with no entry, or a second return for an entry already closed (an entry
    # lost inside the nesting), is counted, never paired.
    orphans = matched.height - ends.height
    calls = opened.join(
        ends.select("entry_row", "end_ts"), left_on="row", right_on="entry_row", how="left"
    )
    return calls.select(
        "pid",
        "cpu",
        pl.col("ts").alias("start_ts"),
        "end_ts",
        (pl.col("end_ts") - pl.col("ts")).alias("dur_ns"),
        pl.col("row").alias("entry_row"),
    ).sort("start_ts", "entry_row").cast(CALL_SCHEMA), orphans  # type: ignore[arg-type]


def _edges(events: pl.DataFrame, step: int) -> pl.DataFrame:
    """Entries (+1) or returns (-1) as row, ts, cpu, pid, step (without `row`: by ts)."""
    order = "row" if "row" in events.columns else "ts"
    return events.select(
        pl.col(order).cast(pl.Int64).alias("row"),
        pl.col("ts").cast(pl.Int64),
        (pl.col("cpu") if "cpu" in events.columns else pl.lit(None)).cast(pl.Int32).alias("cpu"),
        pl.col("common_pid").cast(pl.Int32).alias("pid"),
        pl.lit(step, pl.Int64).alias("step"),
    )
