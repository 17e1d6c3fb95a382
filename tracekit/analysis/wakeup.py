"""cyclictest's wake-ups on the rt CPU, each decomposed along the path the trace shows.

One wake-up is one loop of the measuring thread: it arms its sleep timer (hrtimer_start,
whose `expires` is the instant cyclictest measures from), the timer fires in a hard
interrupt on some CPU (irq_handler_entry, then hrtimer_expire_entry of hrtimer_wakeup),
the handler wakes the thread (sched_waking; sched_wakeup once it is queued on the rt
CPU) and the rt CPU switches to it (sched_switch). On a nohz_full CPU the kernel often
arms the timer on a housekeeping CPU, so the path then crosses to the rt CPU by IPI:
`timer_cpu` and `path` say which.

The latency (switch-in minus expiry) is split into parts that add up to it exactly, in
the spirit of rtla's timerlat auto-analysis but for every loop, so they can be shown as
distributions. `cause` names the largest part. Every stage is matched with join_asof
(by timer address, pid or CPU), never a loop over events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analysis.cpustate import cpu_states, time_in_states
from tracekit.analysis.requires import require_events
from tracekit.analysis.wakestages import (
    MEASURER,
    due_column,
    is_sleep_timer,
    match_stages,
    sleeps,
)
from tracekit.errors import TracekitError

ANALYSIS = "wake-up decomposition"
RT_PRIO_LIMIT = 100  # kernel prio below this: an RT task (cyclictest's measuring thread)
# Trace clocks that read CLOCK_MONOTONIC's time base (boot adds only suspended time).
MONOTONIC_CLOCKS = ("boot", "mono", "mono_raw")

EVENT_SYSTEMS = {
    "hrtimer_start": "timer",
    "hrtimer_expire_entry": "timer",
    "irq_handler_entry": "irq",
    "irq_handler_exit": "irq",
    "sched_waking": "sched",
    "sched_wakeup": "sched",
    "sched_switch": "sched",
    "softirq_entry": "irq",
    "softirq_exit": "irq",
}
NEEDED = [name for name in EVENT_SYSTEMS if not name.startswith("softirq")]
OPTIONAL = ["softirq_entry", "softirq_exit"]

# Component column -> what it measures; they add up to total_ns.
COMPONENTS = {
    "late_arm_ns": "the thread armed its timer after the expiry (its previous loop overran)",
    # One number: what the interrupt waited for (irqs off, the interrupt controller, the
    # hardware, QEMU) is not told apart, so the text names no cause.
    "irq_delay_ns": "timer expiry -> timer interrupt entry (what it waited for: not known)",
    "handler_ns": "interrupt entry (or expiry, if later) -> waking, plus the rest of that"
    " interrupt on the rt CPU",
    "ipi_ns": "waking on the timer CPU -> queued on the rt CPU (remote timer: the IPI)",
    "irq_ns": "other hard interrupts on the rt CPU before the switch",
    "softirq_ns": "softirqs on the rt CPU before the switch",
    "blocking_ns": "another task kept the rt CPU before the switch (would not yield)",
    "sched_ns": "the rest: leaving idle, the scheduler, the context switch",
}
CAUSES = {column: column.removesuffix("_ns") for column in COMPONENTS}
STAGES = {
    "expire_ts": "timer expiry (hrtimer_expire_entry)",
    "irq_entry_ts": "timer interrupt (irq_handler_entry around the expiry)",
    "waking_ts": "sched_waking of the thread",
    "wakeup_ts": "sched_wakeup of the thread",
    "switch_ts": "sched_switch to the thread on the rt CPU",
}
# A thread the timer woke before it had left the CPU (it never slept) resumes when the
# interrupt that woke it ends: that instant stands in for the switch-in.


@dataclass(frozen=True)
class Wakeups:
    """A run's decomposed wake-ups and the loops the trace does not show whole."""

    frame: pl.DataFrame  # one row per complete wake-up (see decompose())
    incomplete: pl.DataFrame  # stage, loops: first stage the trace lacks, per stage
    threads: list[int]  # pids of the measuring threads
    clock_offset_ns: int  # trace clock minus CLOCK_MONOTONIC, added to `expires`

    @property
    def loops(self) -> int:
        """Loops the trace saw start (complete or not)."""
        return self.frame.height + int(self.incomplete["loops"].sum())


def how_to_record(event: str) -> str:
    """One phrase: how to get this event into a trace."""
    system = EVENT_SYSTEMS.get(event) or ("syscalls" if event.startswith("sys_") else "kvm")
    return (
        f"record it with `tracekit collect --events {system}/{event}`"
        f" or `trace-cmd record -e {system}:{event}`"
    )


# The columns this analysis reads, for an event the recording enabled but that never fired.
EMPTY_SCHEMAS = {
    "hrtimer_start": {"hrtimer": pl.UInt64, "function": pl.UInt64, "expires": pl.Int64}
    | {"function_sym": pl.Categorical},
    "hrtimer_expire_entry": {"hrtimer": pl.UInt64, "now": pl.Int64, "function": pl.UInt64}
    | {"function_sym": pl.Categorical},
    "irq_handler_entry": {"irq": pl.Int32, "name": pl.String},
    "irq_handler_exit": {"irq": pl.Int32, "ret": pl.Int32},
    "sched_waking": {"comm": pl.String, "pid": pl.Int32, "prio": pl.Int32},
    "sched_wakeup": {"comm": pl.String, "pid": pl.Int32, "prio": pl.Int32},
    "sched_switch": {
        "prev_comm": pl.String,
        "prev_pid": pl.Int32,
        "next_comm": pl.String,
        "next_pid": pl.Int32,
        "next_prio": pl.Int32,
    },
}
COMMON_SCHEMA = {"row": pl.Int64, "ts": pl.Int64, "cpu": pl.Int32, "common_pid": pl.Int32}


def with_enabled(
    events: Mapping[str, pl.DataFrame],
    enabled: Iterable[str],
    schemas: Mapping[str, Mapping[str, pl.DataType]],
) -> dict[str, pl.DataFrame]:
    """`events` plus an empty table for each event the recording enabled but never saw.

    An ingested trace has tables only for events that fired; "enabled, zero events" (no
    munmap in a short run) must not read as "not recorded" (which fails the analysis).
    `enabled` holds bare event names or system/name.
    """
    out = dict(events)
    for name in (e.rsplit("/", 1)[-1] for e in enabled):
        if name not in out and name in schemas:
            out[name] = pl.DataFrame(schema=COMMON_SCHEMA | dict(schemas[name]))
    return out


def require_wakeup_events(available: list[str]) -> None:
    """Fail with one line naming each missing event of the decomposition."""
    require_events(ANALYSIS, available, {name: how_to_record(name) for name in NEEDED})


def measuring_threads(switches: pl.DataFrame, rt_cpu: int) -> list[int]:
    """Pids of the RT cyclictest threads switched in on the rt CPU (not its main thread)."""
    seen = (
        switches.filter((pl.col("cpu") == rt_cpu) & (pl.col("next_comm") == MEASURER))
        .group_by("next_pid")
        .agg(pl.col("next_prio").min())
    )
    rt = seen.filter(pl.col("next_prio") < RT_PRIO_LIMIT)
    pids = sorted((rt if rt.height else seen)["next_pid"].to_list())
    if not pids:
        raise TracekitError(
            f"{ANALYSIS}: no {MEASURER} thread ran on the rt CPU {rt_cpu} in this trace;"
            f" check the rt CPU (the bundle's options.rt_cpu) and that cyclictest ran with"
            f" --affinity={rt_cpu} while tracing"
        )
    return pids


def sleep_due_times(events: Mapping[str, pl.DataFrame], rt_cpu: int) -> list[np.ndarray]:
    """Per measuring thread (pid order), the time each of its sleeps asked for.

    The threads and their sleep timers are the decomposition's own (measuring_threads,
    is_sleep_timer); empty when the trace lacks sched_switch or hrtimer_start.
    """
    switches, starts = events.get("sched_switch"), events.get("hrtimer_start")
    if switches is None or starts is None or "expires" not in starts.columns:
        return []
    try:
        threads = measuring_threads(switches, rt_cpu)
    except TracekitError:
        return []
    mine = starts.filter((pl.col("cpu") == rt_cpu) & pl.col("common_pid").is_in(threads))
    mine = mine.filter(is_sleep_timer(mine)).sort("ts")
    due = due_column(mine)
    return [mine.filter(pl.col("common_pid") == pid)[due].to_numpy() for pid in threads]


def decompose(
    events: Mapping[str, pl.DataFrame],
    rt_cpu: int,
    clock: str = "boot",
    enabled: Iterable[str] = (),
) -> Wakeups:
    """Every wake-up of cyclictest on `rt_cpu`: stages, components (ns) and cause.

    `events` maps event names to trace.event() tables. Columns of the result: wake_id,
    pid, start_row, expiry_ns (trace clock), timer_cpu, path (local/remote), slept,
    irq_name, the stages' irq_entry_ts, waking_ts, queued_ts (on the rt CPU) and
    switch_ts, prev_comm (task switched out for it), total_ns, the COMPONENTS, cause.
    `enabled`: the events the recording enabled (trace.meta["events_enabled"]).
    """
    events = with_enabled(events, enabled, EMPTY_SCHEMAS)
    require_wakeup_events(list(events))
    threads = measuring_threads(events["sched_switch"], rt_cpu)
    starts = events["hrtimer_start"]
    mine = starts.filter((pl.col("cpu") == rt_cpu) & pl.col("common_pid").is_in(threads))
    is_sleep = is_sleep_timer(mine)
    staged = match_stages(sleeps(mine.filter(is_sleep)), events, rt_cpu, is_sleep)
    offset = clock_offset(staged, clock)
    complete = staged.filter(pl.all_horizontal(pl.col(c).is_not_null() for c in STAGES))
    frame = _components(complete, events, rt_cpu, threads, offset)
    return Wakeups(frame, _incomplete(staged), threads, offset)


def clock_offset(staged: pl.DataFrame, clock: str) -> int:
    """Trace clock minus the timers' clock: 0 for boot/mono, else estimated from `now`.

    hrtimer_expire_entry's `now` is read just before the event is written, so the
    smallest (event ts - now) is the closest bound on the offset between the two clocks.
    """
    if clock in MONOTONIC_CLOCKS:
        return 0
    gaps = staged.select((pl.col("expire_ts") - pl.col("now")).min()).item()
    return int(gaps) if gaps is not None else 0


def _components(
    staged: pl.DataFrame,
    events: Mapping[str, pl.DataFrame],
    rt_cpu: int,
    threads: list[int],
    offset: int,
) -> pl.DataFrame:
    """Split each complete wake-up's latency into COMPONENTS that sum to total_ns."""
    timeline = cpu_states(events, rt_cpu, threads)
    frame = staged.with_columns((pl.col("expires") + offset).alias("expiry_ns"))
    frame = _queued(frame, rt_cpu)
    frame = time_in_states(timeline, frame, "queued_ts", "r")
    frame = time_in_states(timeline, frame, "switch_ts", "s")
    d = {s: pl.col(f"s_{s}") - pl.col(f"r_{s}") for s in ("irq", "softirq", "other")}
    local = pl.col("timer_cpu") == rt_cpu
    tail = pl.col("tail_ns")
    waiting = pl.col("switch_ts") - pl.col("queued_ts")
    # A timer armed after its expiry, or one that expired inside an interrupt already
    # running, starts its path later than the expiry: nothing before that is "irq delay".
    armed = pl.max_horizontal("expiry_ns", "start_ts")
    handled_from = pl.max_horizontal("irq_entry_ts", armed)
    frame = frame.with_columns(
        pl.when(local).then(pl.lit("local")).otherwise(pl.lit("remote")).alias("path"),
        (pl.col("switch_ts") - pl.col("expiry_ns")).alias("total_ns"),
        (armed - pl.col("expiry_ns")).alias("late_arm_ns"),
        (pl.col("irq_entry_ts") - armed).clip(lower_bound=0).alias("irq_delay_ns"),
        (pl.col("waking_ts") - handled_from + pl.when(local).then(tail).otherwise(0)).alias(
            "handler_ns"
        ),
        (pl.col("queued_ts") - pl.col("waking_ts") + pl.when(local).then(0).otherwise(tail)).alias(
            "ipi_ns"
        ),
        (d["irq"] - tail).alias("irq_ns"),
        d["softirq"].alias("softirq_ns"),
        d["other"].alias("blocking_ns"),
        (waiting - d["irq"] - d["softirq"] - d["other"]).alias("sched_ns"),
    )
    names = list(COMPONENTS)
    cause = (
        pl.concat_list(names)
        .list.arg_max()
        .replace_strict(dict(enumerate(CAUSES.values())), return_dtype=pl.String)
    )
    return frame.with_columns(cause.alias("cause")).select(
        "wake_id",
        "pid",
        "start_row",
        "expiry_ns",
        "timer_cpu",
        "path",
        "slept",
        "irq_name",
        "irq_entry_ts",
        "waking_ts",
        "queued_ts",
        "switch_ts",
        "prev_comm",
        "total_ns",
        *names,
        "cause",
    )


def _queued(frame: pl.DataFrame, rt_cpu: int) -> pl.DataFrame:
    """`queued_ts`: when the rt CPU learnt of the wakeup; `tail_ns`: that interrupt's rest.

    Queued by the rt CPU itself (the timer interrupt, or the IPI that carried the wake-up
    across): the wakeup event. Queued from another CPU: the next rt-CPU interrupt before
    the switch (the reschedule IPI), if there is one. The interrupt's time after that
    instant belongs to the path that queued it (handler or IPI), not to "other irqs".
    """
    by_ipi = (
        (pl.col("wakeup_cpu") != rt_cpu)
        & pl.col("own_exit_ts").is_null()
        & (pl.col("next_irq_ts") <= pl.col("switch_ts"))
    ).fill_null(False)
    queued = pl.when(by_ipi).then(pl.col("next_irq_ts")).otherwise(pl.col("wakeup_ts"))
    end = pl.when(by_ipi).then(pl.col("next_irq_exit_ts")).otherwise(pl.col("own_exit_ts"))
    frame = frame.with_columns(queued.alias("queued_ts"), end.alias("_end"))
    tail = pl.min_horizontal("_end", "switch_ts") - pl.col("queued_ts")
    has_irq = pl.col("_end").is_not_null()
    return frame.with_columns(
        pl.when(has_irq).then(tail.clip(lower_bound=0)).otherwise(0).alias("tail_ns")
    ).drop("_end")


def _incomplete(staged: pl.DataFrame) -> pl.DataFrame:
    """Per stage: loops whose first missing stage it is (trace ended, lost events, ...)."""
    first_missing = pl.coalesce(
        *[pl.when(pl.col(c).is_null()).then(pl.lit(STAGES[c])) for c in STAGES]
    )
    return (
        staged.select(first_missing.alias("stage"))
        .filter(pl.col("stage").is_not_null())
        .group_by("stage")
        .agg(pl.len().cast(pl.Int64).alias("loops"))
        .sort(["loops", "stage"], descending=[True, False])
    )
