"""What the other CPUs did while the rt CPU's thread waited, and whether it matters.

Activity is a set of intervals per CPU: broadcast-TLBI work (the stress workers'
mprotect/munmap/madvise syscalls, each of which ends in TLBI ...IS + DSB ISH; the probe's
own timed calls when its samples fall inside the run), the guest running (kvm_entry ->
kvm_exit), hard interrupts, idle states (cpu_idle), plus IPIs raised towards the rt CPU
(points). Each wake-up window is overlapped with them by sorted-array arithmetic
(tracekit.analysis.intervals), never by a loop over events.

Whether excess latency concentrates in windows with broadcast activity is asked with a
fixed-width exposure window per wake-up ([expiry, expiry + the run's median latency]):
a longer wake-up has more chances to overlap anything, so using its own window would
make "slow wake-ups overlap more syscalls" true by construction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import polars as pl

from tracekit.analysis.compare import Comparison, compare
from tracekit.analysis.intervals import INTERVAL_SCHEMA, overlap, pair_intervals
from tracekit.analysis.requires import require_events
from tracekit.analysis.runs import QUANTILE_INTERPOLATION
from tracekit.analysis.wakeup import how_to_record, with_enabled

ANALYSIS = "wake-up correlation"
TLBI_SYSCALLS = ("mprotect", "munmap", "madvise")
BROADCAST = ("tlbi_syscall", "probe")  # activities that issue broadcast TLBIs
IDLE_EXIT = 4294967295  # cpu_idle's state on leaving idle (PWR_EVENT_EXIT, (u32)-1)
ACTIVITY_SCHEMA = INTERVAL_SCHEMA | {"activity": pl.String}
WINDOW_SCHEMA = {
    "wake_id": pl.UInt32,
    "cpu": pl.Int32,
    "activity": pl.String,
    "n": pl.Int64,
    "overlap_ns": pl.Int64,
}
NEEDED = [f"sys_{edge}_{name}" for name in TLBI_SYSCALLS for edge in ("enter", "exit")]
# Events read only for their ts/cpu/common_pid (pairs of entry and exit).
ENTRY_EXIT = [*NEEDED, "kvm_entry", "kvm_exit", "irq_handler_entry", "irq_handler_exit"]


def require_correlation_events(available: list[str]) -> None:
    """Fail with one line naming each missing syscall event (the TLBI activity)."""
    require_events(ANALYSIS, available, {name: how_to_record(name) for name in NEEDED})


def activity_intervals(
    events: Mapping[str, pl.DataFrame],
    rt_cpu: int,
    probe: pl.DataFrame | None = None,
    enabled: Iterable[str] = (),
) -> tuple[pl.DataFrame, dict[str, int]]:
    """Every other CPU's activity as (cpu, start_ns, end_ns, activity); unpaired per kind.

    `probe`: probe samples (cpu, timestamp_ns, duration_ns), same clock as the trace
    (CLOCK_BOOTTIME and the boot trace clock); only those inside the trace count.
    `enabled`: the events the recording enabled, so one that never fired is empty, not
    missing.
    """
    events = with_enabled(events, enabled, {name: {} for name in ENTRY_EXIT})
    require_correlation_events(list(events))
    parts: list[pl.DataFrame] = []
    unpaired: dict[str, int] = {}
    for name in TLBI_SYSCALLS:
        got, lost = _paired(events, f"sys_enter_{name}", f"sys_exit_{name}", ["cpu", "common_pid"])
        parts.append(got.with_columns(pl.lit("tlbi_syscall").alias("activity")))
        unpaired["tlbi_syscall"] = unpaired.get("tlbi_syscall", 0) + lost
    for activity, enter, leave, by in (
        ("guest", "kvm_entry", "kvm_exit", ["cpu", "common_pid"]),
        ("irq", "irq_handler_entry", "irq_handler_exit", ["cpu"]),
    ):
        if enter in events and leave in events:
            got, unpaired[activity] = _paired(events, enter, leave, by)
            parts.append(got.with_columns(pl.lit(activity).alias("activity")))
    if "cpu_idle" in events:
        got, unpaired["idle"] = _idle(events["cpu_idle"])
        parts.append(got.with_columns(pl.lit("idle").alias("activity")))
    if "ipi_raise" in events:
        parts.append(_ipis_to(events["ipi_raise"], rt_cpu))
    if probe is not None and probe.height:
        parts.append(_probe_calls(probe, events))
    frames = [p.select(list(ACTIVITY_SCHEMA)).cast(ACTIVITY_SCHEMA) for p in parts]  # type: ignore[arg-type]
    everything = pl.concat(frames) if frames else pl.DataFrame(schema=ACTIVITY_SCHEMA)
    others = everything.filter((pl.col("cpu") != rt_cpu) | (pl.col("activity") == "ipi_to_rt"))
    return others, unpaired


def _paired(
    events: Mapping[str, pl.DataFrame], enter: str, leave: str, by: list[str]
) -> tuple[pl.DataFrame, int]:
    """Intervals from an entry/exit event pair (cpu, start_ns, end_ns), unpaired entries."""
    intervals, lost = pair_intervals(events[enter], events[leave], by)
    return intervals.select("cpu", "start_ns", "end_ns"), lost


def _idle(idle: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Idle intervals per CPU: a cpu_idle with a state until the next exit (state -1)."""
    enters = idle.filter(pl.col("state") != IDLE_EXIT).select("ts", "cpu")
    leaves = idle.filter(pl.col("state") == IDLE_EXIT).select("ts", "cpu")
    intervals, lost = pair_intervals(enters, leaves, ["cpu"])
    return intervals.select("cpu", "start_ns", "end_ns"), lost


def _ipis_to(raises: pl.DataFrame, rt_cpu: int) -> pl.DataFrame:
    """IPIs raised towards the rt CPU, as points (start = end = ts) on the raising CPU."""
    word, bit = divmod(rt_cpu, 64)
    mask = pl.col("target_cpus").list.get(word, null_on_oob=True).cast(pl.UInt64)
    aimed = raises.filter((mask & (1 << bit)) != 0)
    return aimed.select(
        "cpu",
        pl.col("ts").alias("start_ns"),
        pl.col("ts").alias("end_ns"),
        pl.lit("ipi_to_rt").alias("activity"),
    )


def _probe_calls(probe: pl.DataFrame, events: Mapping[str, pl.DataFrame]) -> pl.DataFrame:
    """The probe's timed TLBI calls that fall inside the trace's time span."""
    first = min((int(t["ts"].min()) for t in events.values() if t.height), default=0)
    last = max((int(t["ts"].max()) for t in events.values() if t.height), default=-1)
    return probe.filter(pl.col("timestamp_ns").is_between(first, last)).select(
        pl.col("cpu").cast(pl.Int32),
        pl.col("timestamp_ns").alias("start_ns"),
        (pl.col("timestamp_ns") + pl.col("duration_ns")).alias("end_ns"),
        pl.lit("probe").alias("activity"),
    )


def window_activity(windows: pl.DataFrame, intervals: pl.DataFrame) -> pl.DataFrame:
    """Long format: per window (wake_id, start_ns, end_ns), CPU and activity: n, overlap_ns."""
    out = []
    for (cpu, activity), group in intervals.group_by("cpu", "activity", maintain_order=True):
        hit = overlap(windows, group)
        out.append(
            pl.concat([windows.select("wake_id"), hit], how="horizontal").with_columns(
                pl.lit(cpu, pl.Int32).alias("cpu"), pl.lit(activity).alias("activity")
            )
        )
    if not out:
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    found = pl.concat(out).filter(pl.col("n") > 0)
    return found.select(list(WINDOW_SCHEMA)).cast(WINDOW_SCHEMA)  # type: ignore[arg-type]


def per_wakeup(wakeups: pl.DataFrame, activity: pl.DataFrame) -> pl.DataFrame:
    """One row per wake-up: counts and ns of each activity over all other CPUs."""
    sums = activity.group_by("wake_id").agg(
        _n("tlbi_syscall").alias("tlbi_n"),
        _n("probe").alias("probe_n"),
        _ns("guest").alias("guest_ns"),
        _n("irq").alias("irq_n"),
        _n("ipi_to_rt").alias("ipi_to_rt_n"),
        pl.col("cpu").filter(pl.col("activity") == "idle").n_unique().alias("idle_cpus"),
        pl.col("cpu").filter(pl.col("activity").is_in(BROADCAST)).n_unique().alias("tlbi_cpus"),
    )
    zeros = [c for c in sums.columns if c != "wake_id"]
    joined = wakeups.select("wake_id", "total_ns").join(
        sums, on="wake_id", how="left", maintain_order="left"
    )
    return joined.with_columns(pl.col(c).fill_null(0) for c in zeros).with_columns(
        ((pl.col("tlbi_n") + pl.col("probe_n")) > 0).alias("broadcast")
    )


def _n(activity: str) -> pl.Expr:
    """Intervals of one activity overlapping the window, over all CPUs."""
    return pl.col("n").filter(pl.col("activity") == activity).sum()


def _ns(activity: str) -> pl.Expr:
    """Overlapped ns of one activity, over all CPUs."""
    return pl.col("overlap_ns").filter(pl.col("activity") == activity).sum()


def latency_windows(wakeups: pl.DataFrame) -> pl.DataFrame:
    """Each wake-up's own window: expiry -> switch-in."""
    return wakeups.select(
        "wake_id", pl.col("expiry_ns").alias("start_ns"), pl.col("switch_ts").alias("end_ns")
    )


def exposure_windows(wakeups: pl.DataFrame) -> pl.DataFrame:
    """Fixed-width windows from each expiry, as wide as the run's median latency."""
    width = int(wakeups["total_ns"].median() or 0)
    return wakeups.select(
        "wake_id",
        pl.col("expiry_ns").alias("start_ns"),
        (pl.col("expiry_ns") + width).alias("end_ns"),
    )


def exposure(wakeups: pl.DataFrame, intervals: pl.DataFrame) -> pl.DataFrame:
    """wake_id, total_ns, broadcast: was there broadcast-TLBI work in its fixed window?"""
    broadcast = intervals.filter(pl.col("activity").is_in(BROADCAST))
    hits = window_activity(exposure_windows(wakeups), broadcast)
    touched = hits.select("wake_id").unique().with_columns(pl.lit(True).alias("broadcast"))
    return (
        wakeups.select("wake_id", "total_ns")
        .join(touched, on="wake_id", how="left", maintain_order="left")
        .with_columns(pl.col("broadcast").fill_null(False))
    )


def with_without(exposed: pl.DataFrame) -> pl.DataFrame:
    """Per run (run_id column): wake-ups, median and p99 (us) with and without broadcast."""
    q = QUANTILE_INTERPOLATION
    lat = pl.col("total_ns")
    w, wo = pl.col("broadcast"), ~pl.col("broadcast")
    return (
        exposed.group_by("run_id")
        .agg(
            w.sum().cast(pl.Int64).alias("n_with"),
            wo.sum().cast(pl.Int64).alias("n_without"),
            (lat.filter(w).median() / 1000).round(1).alias("p50_with_us"),
            (lat.filter(wo).median() / 1000).round(1).alias("p50_without_us"),
            (lat.filter(w).quantile(0.99, q) / 1000).round(1).alias("p99_with_us"),
            (lat.filter(wo).quantile(0.99, q) / 1000).round(1).alias("p99_without_us"),
        )
        .sort("run_id")
    )


def concentration(per_run: pl.DataFrame, lost: dict[str, int] | None = None) -> list[Comparison]:
    """with vs without broadcast, per-run medians and p99s, the run as unit (compare()).

    compare() calls the groups before/after: here "before" is without broadcast activity
    and "after" with it, so a ratio above 1 means slower wake-ups alongside broadcasts.
    Runs with no wake-up in one of the groups cannot be paired and are left out (none
    left: no comparison).
    """
    both = per_run.filter((pl.col("n_with") > 0) & (pl.col("n_without") > 0))
    if both.height == 0:
        return []
    runs = both["run_id"].to_list()
    lost_of = [(lost or {}).get(r, 0) for r in runs]
    out = []
    for stat in ("p50", "p99"):
        found = compare(
            both[f"{stat}_without_us"].to_list(),
            both[f"{stat}_with_us"].to_list(),
            f"wake-up {stat} with/without broadcast TLBI",
            before_runs=runs,
            after_runs=runs,
            before_lost=lost_of,
            after_lost=lost_of,
            ratio_label="",  # the name says with/without
        )
        # Each run gives both groups a value: "N runs, each split", never "N+N runs".
        out.append(replace(found, runs_said=f"{found.n_after} run(s), each split with/without"))
    return out


def activity_overview(intervals: pl.DataFrame, span_ns: int) -> pl.DataFrame:
    """Per CPU and activity over the whole run: intervals and share of the run's time."""
    return (
        intervals.group_by("cpu", "activity")
        .agg(
            pl.len().cast(pl.Int64).alias("n"),
            ((pl.col("end_ns") - pl.col("start_ns")).sum() / max(span_ns, 1) * 100)
            .round(1)
            .alias("time_pct"),
        )
        .sort("cpu", "activity")
    )
