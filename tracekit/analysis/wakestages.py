"""Matching each cyclictest loop to the events of its path (stage by stage).

A loop starts with the measuring thread arming its sleep timer; each later stage is the
first matching event after the previous one: the timer's expiry (by timer address), the
interrupt around it (by CPU), sched_waking and sched_wakeup (by pid), the switch to the
thread on the rt CPU. A stage that happens after the thread armed its next timer is not
this loop's and stays null, so the loop is counted as incomplete instead of stretched.
All with join_asof, never a loop over events.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

MEASURER = "cyclictest"
SLEEP_TIMER = "hrtimer_wakeup"  # the hrtimer function of nanosleep's sleeper


def due_column(starts: pl.DataFrame) -> str:
    """The column holding the time a sleep asked for: `softexpires` (`expires` adds the
    task's timer slack, 0 for real-time tasks such as cyclictest's), else `expires`."""
    return "softexpires" if "softexpires" in starts.columns else "expires"


def sleeps(starts: pl.DataFrame) -> pl.DataFrame:
    """The measuring threads' sleep timers, one per loop: wake_id, pid, expires, ..."""
    return (
        starts.sort("ts", maintain_order=True)
        .select(
            pl.col("row").alias("start_row"),
            pl.col("ts").alias("start_ts"),
            pl.col("common_pid").alias("pid"),
            "hrtimer",
            pl.col(due_column(starts)).alias("expires"),
        )
        .with_row_index("wake_id")
        .with_columns(pl.col("start_ts").shift(-1).over("pid").alias("next_start_ts"))
    )


def is_sleep_timer(table: pl.DataFrame) -> pl.Expr:
    """Rows whose timer function is the sleeper's: by symbol, else by address.

    Without symbols the address is the commonest among the measuring thread's own
    timers (it arms almost only its sleep timer), used for the expiries too.
    """
    if "function_sym" in table.columns and table["function_sym"].null_count() < table.height:
        return pl.col("function_sym") == SLEEP_TIMER
    if table.height == 0:
        return pl.lit(False)
    return pl.col("function") == table["function"].mode().sort().first()


def match_stages(
    loops: pl.DataFrame, events: Mapping[str, pl.DataFrame], rt_cpu: int, is_sleep: pl.Expr
) -> pl.DataFrame:
    """Each loop with the timestamps of its stages (null where the trace lacks one)."""
    expiries = (
        events["hrtimer_expire_entry"]
        .filter(is_sleep)
        .select(pl.col("ts").alias("expire_ts"), pl.col("cpu").alias("timer_cpu"), "hrtimer", "now")
    )
    out = asof(loops, "start_ts", expiries, "expire_ts", ["hrtimer"], "forward")
    # A timer address is reused by later sleeps: an expiry belongs to the latest start
    # before it, and it must come before this thread's next sleep.
    claimed = pl.col("start_ts") == pl.col("start_ts").max().over("expire_ts", "timer_cpu")
    out = _keep_if(out, claimed & _before_next(pl.col("expire_ts")), ["expire_ts", "timer_cpu"])
    entries = events["irq_handler_entry"].select(
        pl.col("ts").alias("irq_entry_ts"),
        pl.col("cpu").alias("timer_cpu"),
        pl.col("name").alias("irq_name"),
    )
    out = asof(out, "expire_ts", entries, "irq_entry_ts", ["timer_cpu"], "backward")
    exits = events["irq_handler_exit"].select(
        pl.col("ts").alias("irq_exit_ts"), pl.col("cpu").alias("timer_cpu")
    )
    out = asof(out, "irq_entry_ts", exits, "irq_exit_ts", ["timer_cpu"], "forward")
    # The timer ran inside that interrupt only if the interrupt had not ended yet.
    inside = pl.col("irq_exit_ts").is_null() | (pl.col("irq_exit_ts") >= pl.col("expire_ts"))
    out = _keep_if(out, inside, ["irq_entry_ts", "irq_name"])
    waking = events["sched_waking"].select(
        pl.col("ts").alias("waking_ts"), "pid", pl.col("cpu").alias("waking_cpu")
    )
    out = asof(out, "expire_ts", waking, "waking_ts", ["pid"], "forward")
    by_timer = (pl.col("waking_cpu") == pl.col("timer_cpu")) & _before_next(pl.col("waking_ts"))
    out = _keep_if(out, by_timer, ["waking_ts"])
    wakeup = events["sched_wakeup"].select(
        pl.col("ts").alias("wakeup_ts"), "pid", pl.col("cpu").alias("wakeup_cpu")
    )
    out = asof(out, "waking_ts", wakeup, "wakeup_ts", ["pid"], "forward")
    out = _keep_if(out, _before_next(pl.col("wakeup_ts")), ["wakeup_ts", "wakeup_cpu"])
    switches = (
        events["sched_switch"]
        .filter(pl.col("cpu") == rt_cpu)
        .select(pl.col("ts").alias("switch_ts"), pl.col("next_pid").alias("pid"), "prev_comm")
    )
    out = asof(out, "wakeup_ts", switches, "switch_ts", ["pid"], "forward")
    out = _keep_if(out, _before_next(pl.col("switch_ts")), ["switch_ts", "prev_comm"])
    return _resume_if_never_slept(out, events, rt_cpu)


def _resume_if_never_slept(
    out: pl.DataFrame, events: Mapping[str, pl.DataFrame], rt_cpu: int
) -> pl.DataFrame:
    """`slept`; for a thread woken before it switched out, the end of the waking interrupt.

    The timer can fire between the thread arming it and calling schedule() (an already
    expired timer does): the thread is woken while still current and never switched out.
    """
    outs = (
        events["sched_switch"]
        .filter(pl.col("cpu") == rt_cpu)
        .select(pl.col("ts").alias("out_ts"), pl.col("prev_pid").alias("pid"))
    )
    out = asof(out, "start_ts", outs, "out_ts", ["pid"], "forward")
    slept = pl.col("out_ts").is_not_null() & (pl.col("out_ts") <= pl.col("wakeup_ts"))
    out = _own_irq(out, events, rt_cpu).with_columns(slept.fill_null(False).alias("slept"))
    stayed = ~pl.col("slept") & pl.col("wakeup_ts").is_not_null()
    resume = pl.coalesce(pl.col("own_exit_ts"), pl.col("wakeup_ts"))
    return out.with_columns(
        pl.when(stayed).then(resume).otherwise(pl.col("switch_ts")).alias("switch_ts"),
        pl.when(stayed).then(pl.lit(MEASURER)).otherwise(pl.col("prev_comm")).alias("prev_comm"),
    )


def _before_next(ts: pl.Expr) -> pl.Expr:
    """The stage happened before the thread armed its next sleep (else it is not this loop's)."""
    return pl.col("next_start_ts").is_null() | (ts <= pl.col("next_start_ts"))


def _keep_if(frame: pl.DataFrame, condition: pl.Expr, columns: list[str]) -> pl.DataFrame:
    """Null `columns` where `condition` is false (a stage that does not belong)."""
    keep = condition.fill_null(False)
    return frame.with_columns(
        pl.when(keep).then(pl.col(c)).otherwise(None).alias(c) for c in columns
    )


def asof(
    left: pl.DataFrame,
    left_on: str,
    right: pl.DataFrame,
    right_on: str,
    by: list[str],
    strategy: str,
) -> pl.DataFrame:
    """join_asof for the rows whose key is known; the others get nulls (stage missing)."""
    known = left.filter(pl.col(left_on).is_not_null()).sort(left_on, maintain_order=True)
    joined = known.join_asof(
        right.sort(right_on, maintain_order=True),
        left_on=left_on,
        right_on=right_on,
        by=by or None,
        strategy=strategy,  # type: ignore[arg-type]
        check_sortedness=False,  # both sides are sorted just above
    )
    rest = left.filter(pl.col(left_on).is_null())
    return pl.concat([joined, rest], how="diagonal_relaxed").sort("wake_id")


def _own_irq(frame: pl.DataFrame, events: Mapping[str, pl.DataFrame], rt_cpu: int) -> pl.DataFrame:
    """The rt-CPU interrupt around the wakeup (`own_exit_ts`) and the next one (`next_irq_*`).

    A wakeup queued from another CPU reaches the rt CPU by a reschedule IPI: the next
    interrupt there is where the thread's wait on the rt CPU begins (see _components).
    """
    entries = (
        events["irq_handler_entry"].filter(pl.col("cpu") == rt_cpu).select(pl.col("ts").alias("e"))
    )
    exits = (
        events["irq_handler_exit"].filter(pl.col("cpu") == rt_cpu).select(pl.col("ts").alias("x"))
    )
    out = asof(
        frame, "wakeup_ts", entries.rename({"e": "own_entry_ts"}), "own_entry_ts", [], "backward"
    )
    out = asof(
        out, "own_entry_ts", exits.rename({"x": "own_exit_ts"}), "own_exit_ts", [], "forward"
    )
    out = asof(out, "wakeup_ts", entries.rename({"e": "next_irq_ts"}), "next_irq_ts", [], "forward")
    out = asof(
        out,
        "next_irq_ts",
        exits.rename({"x": "next_irq_exit_ts"}),
        "next_irq_exit_ts",
        [],
        "forward",
    )
    inside = (pl.col("wakeup_cpu") == rt_cpu) & (pl.col("own_exit_ts") >= pl.col("wakeup_ts"))
    return out.with_columns(
        pl.when(inside.fill_null(False)).then(pl.col("own_exit_ts")).alias("own_exit_ts")
    ).drop("own_entry_ts")
