"""Kernel calls from entry and return probes: the one pairing every analysis and export uses.

A kprobe `tracekit/F` fires at F's entry and `tracekit/F_ret` at its return. A call is
matched per thread, never per CPU (a task can migrate inside a call), as a call stack:
a return closes the latest open entry of its thread at the same depth, so recursion and
nesting pair right. pid 0 is not one thread: every CPU's idle task is pid 0, and so is
interrupt context taken in idle, so pid 0's calls get one stack per CPU (an idle task
never migrates). An entry that never returned (the trace ended inside it, an event
lost, or a return the kretprobe missed: `kretprobe_missed`) keeps a null end; a return
with no entry is counted, never guessed at.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import polars as pl

from tracekit.bundle import PROBE_GROUP

CALL_SCHEMA = {
    "pid": pl.Int32,
    "cpu": pl.Int32,  # where the call started
    "start_ts": pl.Int64,
    "end_ts": pl.Int64,  # null: no return recorded
    "dur_ns": pl.Int64,
    "entry_row": pl.Int64,  # the entry event's row, for its fetched arguments
    # Without an end: True when the run's kretprobe missed returns (kprobe_profile), so
    # this may be one; False when it missed none; null when closed or misses unknown.
    "maybe_missed_return": pl.Boolean,
}


def pair_calls(
    entries: pl.DataFrame, returns: pl.DataFrame | None, returns_missed: int | None = None
) -> tuple[pl.DataFrame, int]:
    """One row per entry (CALL_SCHEMA, by start), and how many returns had no entry.

    Both tables have ts and common_pid, and ingest's row and cpu (without row, events are
    ordered by ts). Without a return table every end is null. `returns_missed` is the
    return probe's misses in the run (RunRecord.probe_misses; None: not recorded).
    """
    edges = [_edges(entries, +1)]
    if returns is not None:
        edges.append(_edges(returns, -1))
    # One stack per thread; pid 0 (the idle tasks, interrupts in idle) one per CPU.
    both = (
        pl.concat(edges)
        .with_columns(pl.when(pl.col("pid") == 0).then(pl.col("cpu")).otherwise(-1).alias("stack"))
        .sort("pid", "stack", "row")
    )
    # Depth after an entry, before a return: an entry and its return share a level.
    depth = pl.col("step").cum_sum().over("pid", "stack")
    both = both.with_columns(
        pl.when(pl.col("step") > 0).then(depth).otherwise(depth + 1).alias("level")
    )
    opened = both.filter(pl.col("step") > 0)
    closed = both.filter(pl.col("step") < 0).select(
        "pid", "stack", "level", pl.col("row").alias("ret_row"), pl.col("ts").alias("end_ts")
    )
    # Each return closes the latest entry before it at its level, in its thread.
    matched = closed.sort("ret_row").join_asof(
        opened.select("pid", "stack", "level", pl.col("row").alias("entry_row")).sort("entry_row"),
        left_on="ret_row",
        right_on="entry_row",
        by=["pid", "stack", "level"],
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
    missed = pl.lit(None if returns_missed is None else returns_missed > 0, pl.Boolean)
    return calls.select(
        "pid",
        "cpu",
        pl.col("ts").alias("start_ts"),
        "end_ts",
        (pl.col("end_ts") - pl.col("ts")).alias("dur_ns"),
        pl.col("row").alias("entry_row"),
        pl.when(pl.col("end_ts").is_null()).then(missed).alias("maybe_missed_return"),
    ).sort("start_ts", "entry_row").cast(CALL_SCHEMA), orphans  # type: ignore[arg-type]


def unclosed_note(calls: pl.DataFrame, returns_missed: int | None) -> str | None:
    """What the calls without a return may be, given the kretprobe's misses; None: none."""
    unclosed = calls.filter(pl.col("end_ts").is_null()).height
    if not unclosed:
        return None
    said = f"{unclosed} call(s) without a return"
    if returns_missed is None:
        return (
            f"{said}: the run did not record the kretprobe's misses, so some may be missed returns"
        )
    if returns_missed == 0:
        return (
            f"{said}: the kretprobe missed none, so the trace ended inside them or events were lost"
        )
    return (
        f"{said}: the kretprobe missed {returns_missed} return(s) in this run (kprobe_profile),"
        f" so up to {min(unclosed, returns_missed)} may be missed returns"
    )


# Why one call has no return, by its maybe_missed_return (True, False, None): a short
# label and the whole sentence, for one call drawn alone (a timeline's slice).
UNCLOSED_CALL = {
    True: (
        "return not recorded: maybe missed by the kretprobe",
        "no return recorded; the kretprobe missed returns in this run (kprobe_profile), so"
        " this may be one of them",
    ),
    False: (
        "return not recorded: trace ended or events lost",
        "no return recorded; the kretprobe missed none in this run, so the trace ended"
        " inside the call or events were lost",
    ),
    None: (
        "return not recorded",
        "no return recorded; the run did not record the kretprobe's misses, so this may be"
        " a missed return",
    ),
}


def unclosed_call(maybe_missed_return: bool | None) -> tuple[str, str]:
    """A call without a return: (short label, sentence) saying what it may be."""
    return UNCLOSED_CALL[maybe_missed_return]


def missed_note(
    function: str, entries: pl.DataFrame, returns: pl.DataFrame, returns_missed: int | None
) -> str | None:
    """unclosed_note for one function's calls in a run, named; None: every call returned."""
    calls, _orphans = pair_calls(entries, returns, returns_missed)
    note = unclosed_note(calls, returns_missed)
    return None if note is None else f"{function}: {note}"


def probe_missed(probe_misses: Mapping[str, int] | None, event: str) -> int | None:
    """One tracekit kprobe's misses in a run (RunRecord.probe_misses, from kprobe_profile);
    None: the run did not record them, or the probe was not defined."""
    if probe_misses is None:
        return None
    return probe_misses.get(f"{PROBE_GROUP}/{event}")


def returns_missed(probe_misses: Mapping[str, int] | None, function: str) -> int | None:
    """The returns F's kretprobe (tracekit/F_ret) missed in a run; None: not recorded."""
    return probe_missed(probe_misses, f"{function}_ret")


def misses_over_runs(
    runs: Iterable[Mapping[str, int] | None], function: str
) -> tuple[int | None, int | None]:
    """F's entry kprobe's and kretprobe's misses summed over runs (RunRecord.probe_misses);
    each None when a run did not record it (or the probe was not defined)."""
    entries: int | None = 0
    returns: int | None = 0
    for misses in runs:
        hit, back = probe_missed(misses, function), returns_missed(misses, function)
        entries = None if entries is None or hit is None else entries + hit
        returns = None if returns is None or back is None else returns + back
    return entries, returns


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
