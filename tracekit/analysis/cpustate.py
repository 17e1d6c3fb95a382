"""One CPU's state over time from its trace, and the time it spent in each state.

The idea is rtla's per-CPU state machine: at every moment a CPU is in a hard interrupt,
in a softirq, or running a task (idle, the measured thread, or another task). Here the
states come from forward-filled boundary events (irq_handler_entry/exit, softirq_entry/
exit, sched_switch), so a lost event corrects itself at the next boundary instead of
shifting every later state, and the time spent in each state up to any instant is a
prefix sum read with join_asof.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

STATES = ("irq", "softirq", "idle", "target", "other", "unknown")


def cpu_states(events: Mapping[str, pl.DataFrame], cpu: int, targets: list[int]) -> pl.DataFrame:
    """The CPU's boundaries: ts, state from there on, and `cum_<state>` ns spent before."""
    parts = [
        _marks(events, "irq_handler_entry", cpu, irq=True),
        _marks(events, "irq_handler_exit", cpu, irq=False),
        _marks(events, "softirq_entry", cpu, softirq=True),
        _marks(events, "softirq_exit", cpu, softirq=False),
    ]
    switches = events["sched_switch"].filter(pl.col("cpu") == cpu)
    parts.append(
        switches.select(
            "row",
            "ts",
            pl.lit(None, pl.Boolean).alias("irq"),
            pl.lit(None, pl.Boolean).alias("softirq"),
            pl.col("next_pid").cast(pl.Int32).alias("pid"),
        )
    )
    marks = pl.concat([p for p in parts if p is not None]).sort("row")
    state = (
        pl.when(pl.col("irq"))
        .then(pl.lit("irq"))
        .when(pl.col("softirq"))
        .then(pl.lit("softirq"))
        .when(pl.col("pid").is_null())
        .then(pl.lit("unknown"))
        .when(pl.col("pid") == 0)
        .then(pl.lit("idle"))
        .when(pl.col("pid").is_in(targets))
        .then(pl.lit("target"))
        .otherwise(pl.lit("other"))
    )
    timeline = marks.with_columns(
        pl.col("irq").forward_fill().fill_null(False),
        pl.col("softirq").forward_fill().fill_null(False),
        pl.col("pid").forward_fill(),
    ).with_columns(
        state.alias("state"),
        (pl.col("ts").shift(-1) - pl.col("ts")).fill_null(0).alias("segment_ns"),
    )
    return timeline.with_columns(
        [
            pl.when(pl.col("state") == s)
            .then(pl.col("segment_ns"))
            .otherwise(0)
            .cum_sum()
            .shift(1)
            .fill_null(0)
            .alias(f"cum_{s}")
            for s in STATES
        ]
    ).select("ts", "state", "pid", *[f"cum_{s}" for s in STATES])


def _marks(
    events: Mapping[str, pl.DataFrame],
    name: str,
    cpu: int,
    irq: bool | None = None,
    softirq: bool | None = None,
) -> pl.DataFrame | None:
    """One kind of boundary on the CPU, as (row, ts, irq, softirq, pid); None if absent."""
    table = events.get(name)
    if table is None:
        return None
    return table.filter(pl.col("cpu") == cpu).select(
        "row",
        "ts",
        pl.lit(irq, pl.Boolean).alias("irq"),
        pl.lit(softirq, pl.Boolean).alias("softirq"),
        pl.lit(None, pl.Int32).alias("pid"),
    )


def time_in_states(timeline: pl.DataFrame, at: pl.DataFrame, ts: str, prefix: str) -> pl.DataFrame:
    """`at` with `<prefix>_<state>`: ns the CPU spent in each state before `at[ts]`.

    `at` must carry a unique `wake_id`; rows before the CPU's first boundary get 0.
    """
    points = at.select("wake_id", pl.col(ts).alias("_t")).sort("_t", maintain_order=True)
    found = points.join_asof(
        timeline.rename({"ts": "_b"}), left_on="_t", right_on="_b", strategy="backward"
    )
    since = (pl.col("_t") - pl.col("_b")).fill_null(0)
    values = [
        (
            pl.col(f"cum_{s}").fill_null(0) + pl.when(pl.col("state") == s).then(since).otherwise(0)
        ).alias(f"{prefix}_{s}")
        for s in STATES
    ]
    return at.join(
        found.select("wake_id", *values), on="wake_id", how="left", maintain_order="left"
    )
