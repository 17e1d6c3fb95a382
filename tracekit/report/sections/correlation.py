"""What the other CPUs did during the rt CPU's wake-ups, and whether it made them slower.

Thin: tracekit/analysis/correlation.py does the interval work and the with/without
comparison (the run as unit); this section adds the guest run's activity, the worst
wake-ups with what the other CPUs did, and a timeline of the worst one per phase.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis.compare import PRESENT, Comparison
from tracekit.analysis.correlation import (
    BROADCAST,
    activity_intervals,
    activity_overview,
    concentration,
    exposure,
    latency_windows,
    per_wakeup,
    window_activity,
    with_without,
)
from tracekit.bundle import RunKind
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData, traced_runs
from tracekit.ingest.probe import probe_samples
from tracekit.report.model import Plot, Section, Table, run_key, used_runs
from tracekit.report.sections.wakeup import (
    RunWakeups,
    decomposed_runs,
    rt_cpu_of,
    run_events,
)

WORST = 8
GUEST_KINDS = (RunKind.GUEST, RunKind.AFTER_GUEST)
TIMELINE_MARGIN = 0.25  # of the window, shown before the expiry and after the switch-in


def section(bundles: list[BundleData]) -> Section | None:
    """Per-wake-up activity of the other CPUs; with vs without broadcast TLBI work."""
    runs, problems = decomposed_runs(bundles)
    findings: list[str] = []
    tables: list[Table] = []
    plots: list[Plot] = []
    exposed, worst, overviews = [], [], []
    for r in runs:
        if r.lost:
            findings.append(
                f"{r.run.run_id} left out: it lost {r.lost} events, so other CPUs' activity"
                " inside its windows is incomplete"
            )
            continue
        try:
            probe = probe_samples(r.data)
            intervals, unpaired = activity_intervals(
                r.trace.events, r.rt_cpu, probe, r.trace.enabled
            )
        except TracekitError as err:
            problems.append(f"{r.run.run_id}: {err}")
            continue
        frame = r.wakeups.frame
        activity = window_activity(latency_windows(frame), intervals)
        worst.append(_worst_rows(r, per_wakeup(frame, activity)))
        exposed.append(
            exposure(frame, intervals).with_columns(pl.lit(r.run.run_id).alias("run_id"))
        )
        plots.append(_timeline(r, intervals))
        overviews.append(_overview(r.run.run_id, r.run.phase, intervals, r.trace.span_ns))
        findings += _unpaired(r.run.run_id, unpaired)
    guest_overviews, guest_lost = _guest_overviews(bundles, problems)
    overviews += guest_overviews
    if overviews:
        tables.append(_overviews(overviews, guest_lost))
    comparisons: list[Comparison] = []
    if exposed:
        per_run = with_without(pl.concat(exposed))
        comparisons = concentration(per_run)
        findings = [_statement(per_run, comparisons), *findings]
        tables.insert(0, _with_without_table(per_run))
        tables.insert(1, _worst_table(pl.concat(worst)))
    if not tables and not problems:
        return None
    return Section(
        key="correlation",
        title="What the other CPUs did during each wake-up (traced runs)",
        findings=findings,
        comparisons=comparisons,
        tables=tables,
        plots=plots,
        unknowns=problems + _unknowns(),
        **used_runs({run_key(r.data, r.run): r.lost for r in runs if r.lost == 0} | guest_lost),
    )


def _statement(per_run: pl.DataFrame, comparisons: list[Comparison]) -> str:
    """The result in one sentence: does excess latency concentrate with broadcasts?"""
    share = per_run["n_with"].sum() / max(1, per_run["n_with"].sum() + per_run["n_without"].sum())
    if not comparisons:
        return (
            "whether excess latency concentrates with broadcast activity is not known: no"
            f" run had wake-ups both with and without it ({100 * share:.0f}% had it)"
        )
    p99 = next(c for c in comparisons if "p99" in c.metric)
    if p99.verdict == PRESENT and p99.ratio > 1:
        verdict = "excess latency concentrates in windows with broadcast-TLBI activity"
    elif p99.verdict == PRESENT:
        verdict = "wake-ups are faster in windows with broadcast-TLBI activity"
    elif p99.verdict == "absent":
        verdict = "excess latency does not concentrate in windows with broadcast activity"
    else:
        verdict = "whether excess latency concentrates with broadcast activity is not shown"
    return (
        f"{verdict}: per-run p99 with/without {p99.ratio:.2f}x {p99.interval()}"
        f" over {p99.n_after} run(s), verdict {p99.verdict}"
        f" ({100 * share:.0f}% of wake-ups had broadcast work on another CPU within a"
        " fixed window of the run's median latency after their expiry)"
    )


def _with_without_table(per_run: pl.DataFrame) -> Table:
    """Per run: wake-ups and p99 with and without broadcast activity."""
    return Table(
        "wake-ups with / without broadcast-TLBI work on other CPUs, per run",
        per_run.select("run_id", "n_with", "n_without", "p99_with_us", "p99_without_us"),
        note="window: expiry + the run's median latency; broadcast = mprotect/munmap/madvise"
        " or probe calls on another CPU",
    )


def _worst_rows(r: RunWakeups, per: pl.DataFrame) -> pl.DataFrame:
    """The run's slowest wake-ups with what the other CPUs did inside them."""
    return (
        per.sort(["total_ns", "wake_id"], descending=[True, False])
        .head(WORST)
        .select(
            pl.lit(r.run.run_id).alias("run_id"),
            pl.col("wake_id").alias("loop"),
            (pl.col("total_ns") / 1000).round(1).alias("total_us"),
            pl.col("tlbi_n"),
            (pl.col("guest_ns") / 1000).round(1).alias("guest_us"),
            pl.col("irq_n"),
        )
    )


def _worst_table(rows: pl.DataFrame) -> Table:
    """Slowest wake-ups over all runs."""
    return Table(
        "the slowest wake-ups and the other CPUs inside them",
        rows.sort(["total_us", "run_id", "loop"], descending=[True, False, False]).head(WORST),
        note="tlbi_n: mprotect/munmap/madvise calls overlapping the wake-up on other CPUs;"
        " guest_us: guest time inside it; irq_n: hard interrupts on other CPUs",
    )


def _overview(run_id: str, phase: str, intervals: pl.DataFrame, span_ns: int) -> pl.DataFrame:
    """The run's activity per other CPU, its rows named by run and phase."""
    return activity_overview(intervals, span_ns).select(
        pl.lit(run_id).alias("run_id"), pl.lit(phase).alias("phase"), pl.all()
    )


def _overviews(frames: list[pl.DataFrame], guest_lost: dict[str, int]) -> Table:
    """Every run's activity per other CPU in one table: its note is said once."""
    lost = sum(guest_lost.values())
    return Table(
        "activity of the other CPUs over each run",
        pl.concat(frames, how="diagonal_relaxed"),
        note="time_pct: share of the traced time; activities overlap (an interrupt taken"
        " while idle counts in both; two tasks' syscalls on one CPU add up); the rt CPU's"
        " one row, ipi_to_rt, counts the IPIs it raised to itself"
        + (f"; {lost} events lost in the guest runs" if lost else ""),
    )


def _guest_overviews(
    bundles: list[BundleData], problems: list[str]
) -> tuple[list[pl.DataFrame], dict[str, int]]:
    """The guest runs' activity per CPU (what running the guest did), and events lost."""
    out: list[pl.DataFrame] = []
    lost: dict[str, int] = {}
    for data in bundles:
        for run in traced_runs(data, kinds=GUEST_KINDS):
            try:
                trace = run_events(data, run)
                intervals, _ = activity_intervals(
                    trace.events, rt_cpu_of(data), enabled=trace.enabled
                )
            except TracekitError as err:
                problems.append(f"{run.run_id}: {err}")
                continue
            out.append(_overview(run.run_id, run.phase, intervals, trace.span_ns))
            lost[run_key(data, run)] = sum(trace.lost_per_cpu.values())
    return out, lost


def _timeline(r: RunWakeups, intervals: pl.DataFrame) -> Plot:
    """The run's slowest wake-up and every other CPU's activity around it."""
    w = r.wakeups.frame.sort(["total_ns", "wake_id"], descending=[True, False]).row(0, named=True)
    margin = int(w["total_ns"] * TIMELINE_MARGIN)
    lo, hi = w["expiry_ns"] - margin, w["switch_ts"] + margin
    near = intervals.filter((pl.col("end_ns") >= lo) & (pl.col("start_ns") <= hi))
    lanes = near.select(
        pl.col("start_ns").clip(lower_bound=lo).alias("start_ns"),
        pl.col("end_ns").clip(upper_bound=hi).alias("end"),
        pl.format("cpu{} {}", "cpu", "activity").alias("lane"),
        pl.col("activity").alias("label"),
        pl.when(pl.col("activity").is_in(BROADCAST))
        .then(pl.lit("broadcast"))
        .otherwise(pl.lit("other"))
        .alias("kind"),
    )
    own = pl.DataFrame(
        {
            "start_ns": [w["expiry_ns"]],
            "end": [w["switch_ts"]],
            "lane": [f"cpu{r.rt_cpu} wake-up"],
            "label": [f"loop {w['wake_id']}: {w['total_ns'] / 1000:.1f} us, {w['cause']}"],
            "kind": ["wake-up"],
        }
    )
    frame = pl.concat(
        [own, lanes.sort("lane", "start_ns", maintain_order=True)], how="vertical_relaxed"
    )
    return Plot(
        f"{r.run.run_id}: slowest wake-up and the other CPUs",
        "timeline",
        frame,
        x="start_ns",
        y="lane",
        series="kind",
    )


def _unpaired(run_id: str, unpaired: dict[str, int]) -> list[str]:
    """Say how many entry events had no exit (they are not counted as activity)."""
    bad = {k: v for k, v in unpaired.items() if v}
    if not bad:
        return []
    parts = ", ".join(f"{k} {v}" for k, v in sorted(bad.items()))
    return [f"{run_id}: entries without their exit, not counted as activity: {parts}"]


def _unknowns() -> list[str]:
    """What this correlation cannot tell."""
    return [
        "which TLBI inside a syscall ran when: a syscall interval is an upper bound of the"
        " broadcast work, not the invalidation itself",
        "with one traced run per phase the with/without comparison cannot reach a verdict;"
        " more traced runs (--traced-runs) give it runs to compare",
    ]
