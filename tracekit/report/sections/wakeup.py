"""Where the rt CPU's wake-up latency goes: every cyclictest loop of the traced runs.

Thin: tracekit/analysis/wakeup.py decomposes; this picks the traced runs, leaves out of
the distributions the runs whose rt CPU lost events (saying so), and checks the trace's
latencies against cyclictest's own numbers for the same run.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracekit.analysis.beforeafter import saturated
from tracekit.analysis.wakecheck import against_cyclictest, paired_offset
from tracekit.analysis.wakeup import COMPONENTS, Wakeups, decompose
from tracekit.bundle import RunKind, RunRecord
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData, open_run_trace, traced_runs
from tracekit.report.header import bundle_label, is_emulated
from tracekit.report.model import Plot, Section, Table, run_key, used_runs
from tracekit.report.sections.beforeafter import interval_of

WORST = 8  # wake-ups shown in the worst-wake-ups table


@dataclass(frozen=True)
class RunEvents:
    """What the wake-up sections need from one traced run's trace."""

    events: dict[str, pl.DataFrame]
    clock: str
    lost_per_cpu: dict[int, int]  # per CPU, as RunData defines it (ingest/lost.py)
    span_ns: int
    enabled: tuple[str, ...]  # events the recording enabled (some may never have fired)


@dataclass(frozen=True)
class RunWakeups:
    """One traced run, decomposed."""

    data: BundleData
    run: RunRecord
    wakeups: Wakeups
    trace: RunEvents
    rt_cpu: int

    @property
    def rt_lost(self) -> int:
        """Events the rt CPU's buffer lost: they could hide a stage of any wake-up."""
        return self.trace.lost_per_cpu.get(self.rt_cpu, 0)

    @property
    def lost(self) -> int:
        """Events lost on all CPUs (one source per CPU)."""
        return sum(self.trace.lost_per_cpu.values())


def run_events(data: BundleData, run: RunRecord) -> RunEvents:
    """A traced run's event tables, made once per report (both sections use them)."""
    found = data.run(run)

    def make() -> RunEvents:
        """The tables, clock, losses, span and enabled events of the run's trace."""
        trace = open_run_trace(data, run)
        events = {name: trace.event(name) for name in trace.event_names}
        ts = trace.events["ts"]
        span = int(ts.max() - ts.min()) if ts.len() else 0  # type: ignore[operator]
        clock = str(trace.meta.get("clock", ""))
        enabled = tuple(trace.meta.get("events_enabled") or ())
        return RunEvents(events, clock, found.lost_per_cpu, span, enabled)

    return found.memo("wakeup-events", make)


def rt_cpu_of(data: BundleData) -> int:
    """The bundle's rt CPU, from its collect options."""
    cpu = data.manifest.options.get("rt_cpu")
    if cpu is None:
        raise TracekitError(
            f"{data.path}: the manifest names no rt CPU (options.rt_cpu); re-collect with"
            " `tracekit collect --rt-cpu N`"
        )
    return int(cpu)


def decomposed_runs(bundles: list[BundleData]) -> tuple[list[RunWakeups], list[str]]:
    """Every traced run with cyclictest, decomposed; and why any could not be."""
    done, problems = [], []
    for data in bundles:
        for run in traced_runs(data, kinds=(RunKind.TRACED,)):
            try:
                rt_cpu = rt_cpu_of(data)
                trace = run_events(data, run)
                wakeups = decompose(trace.events, rt_cpu, trace.clock, trace.enabled)
            except TracekitError as err:
                problems.append(f"{_label(data, bundles)}{run.run_id}: {err}")
                continue
            done.append(RunWakeups(data, run, wakeups, trace, rt_cpu))
    return done, problems


def _label(data: BundleData, bundles: list[BundleData]) -> str:
    """'bundle: ' when several bundles are reported, else nothing."""
    return f"{bundle_label(data)}: " if len(bundles) > 1 else ""


def section(bundles: list[BundleData]) -> Section | None:
    """Wake-up latency parts per phase, causes, the worst wake-ups, the cyclictest check."""
    runs, problems = decomposed_runs(bundles)
    if not runs and not problems:
        return None
    findings = _emulated(bundles) + _saturated(bundles)
    used = [r for r in runs if r.rt_lost == 0]
    for r in runs:
        if r.rt_lost:
            findings.append(
                f"{_label(r.data, bundles)}{r.run.run_id} left out: its rt CPU lost"
                f" {r.rt_lost} events, which can hide a stage of any wake-up"
            )
    frame = _all_wakeups(used, bundles)
    tables: list[Table] = []
    plots: list[Plot] = []
    if frame.height:
        stress = {int(c) for b in bundles for c in b.manifest.options.get("stress_cpus") or []}
        findings += [*_phase_findings(frame), _path_finding(frame, stress)]
        tables += [_parts_table(frame), _cause_table(frame), _worst_table(frame)]
        plots += [_cdf_plot(frame), _parts_plot(frame)]
    for r in used:
        table, line = _check(r, bundles)
        tables.append(table)
        findings.append(line)
        tables += _incomplete_table(r, bundles)
    return Section(
        key="wakeup",
        title="Wake-up latency on the rt CPU, decomposed (traced runs)",
        findings=findings,
        tables=tables,
        plots=plots,
        unknowns=problems + _unknowns(),
        **used_runs({run_key(r.data, r.run): r.lost for r in used}),
    )


def _emulated(bundles: list[BundleData]) -> list[str]:
    """The emulation warning, when it applies: TCG timings are not hardware timings."""
    if any(is_emulated(b) for b in bundles):
        return [
            "EMULATED host (QEMU TCG): these latencies show where time goes in emulation,"
            " not what hardware does; compare parts, not absolute numbers"
        ]
    return []


def _saturated(bundles: list[BundleData]) -> list[str]:
    """A saturated rt CPU in the traced runs: its wake-ups queue behind each other."""
    traced = [
        bundle_label(b) if len(bundles) > 1 else "the traced runs"
        for b in bundles
        if saturated(b.latencies.filter(pl.col("kind") == RunKind.TRACED.value), interval_of(b))
    ]
    if not traced:
        return []
    return [
        f"SATURATED rt CPU in {', '.join(traced)} (median wake-up above cyclictest's"
        " interval): each wake-up waits behind the ones before it, so these parts (irq_delay"
        " above all) decompose that backlog, not the wake-up path"
    ]


def _all_wakeups(runs: list[RunWakeups], bundles: list[BundleData]) -> pl.DataFrame:
    """Every decomposed wake-up with its run and phase."""
    frames = [
        r.wakeups.frame.with_columns(
            pl.lit(_label(r.data, bundles) + r.run.run_id).alias("run_id"),
            pl.lit(r.run.phase).alias("phase"),
        )
        for r in runs
    ]
    return pl.concat(frames) if frames else pl.DataFrame()


def _phase_findings(frame: pl.DataFrame) -> list[str]:
    """Per phase: wake-ups, median and p99, and the most common cause."""
    lines = []
    for (phase,), rows in frame.group_by("phase", maintain_order=True):
        top = ranked(rows["cause"]).row(0)
        lines.append(
            f"{phase}: {rows.height} wake-ups in {rows['run_id'].n_unique()} run(s), median"
            f" {_us(rows['total_ns'].median())} us, p99"
            f" {_us(rows['total_ns'].quantile(0.99, 'higher'))} us; largest part most often"
            f" {top[0]} ({100 * top[1] / rows.height:.0f}%: {COMPONENTS[top[0] + '_ns']})"
        )
    return lines


def ranked(values: pl.Series) -> pl.DataFrame:
    """value, count: most frequent first, ties by value (value_counts leaves ties unordered)."""
    return values.value_counts().sort(["count", values.name], descending=[True, False])


def _path_finding(frame: pl.DataFrame, stress: set[int]) -> str:
    """How many timers fired on another CPU and crossed over by IPI, and what it costs."""
    remote = frame.filter(pl.col("path") == "remote")
    local = frame.filter(pl.col("path") == "local")
    line = (
        f"{100 * remote.height / frame.height:.0f}% of wake-ups had their timer expire on"
        " another CPU (with timer migration the kernel may arm a nohz_full CPU's unpinned"
        " timers on a housekeeping CPU) and"
        f" reached the rt CPU by IPI: median {_us(remote['total_ns'].median())} us, against"
        f" {_us(local['total_ns'].median())} us for timers that fired on the rt CPU"
    )
    if remote.height:
        where = ranked(remote["timer_cpu"])
        cpus = ", ".join(
            f"CPU {cpu}{' (a stress CPU)' if cpu in stress else ''}: {n} of them"
            for cpu, n in where.iter_rows()
        )
        line += f"; their timers fired on {cpus}"
    return line


def _parts_table(frame: pl.DataFrame) -> Table:
    """Median and p99 of each part, per phase (before/after side by side)."""
    cols = []
    for (phase,), rows in frame.group_by("phase", maintain_order=True):
        cols.append(
            pl.DataFrame(
                {
                    "part": [c.removesuffix("_ns") for c in COMPONENTS] + ["total"],
                    f"{phase}_p50_us": [_us(rows[c].median()) for c in [*COMPONENTS, "total_ns"]],
                    f"{phase}_p99_us": [
                        _us(rows[c].quantile(0.99, "higher")) for c in [*COMPONENTS, "total_ns"]
                    ],
                }
            )
        )
    table = cols[0]
    for more in cols[1:]:
        table = table.join(more, on="part", how="left", maintain_order="left")
    return Table(
        "wake-up latency parts per phase (us)",
        table,
        note="parts add up to each wake-up's total; percentiles of parts do not add up",
    )


def _cause_table(frame: pl.DataFrame) -> Table:
    """Share of wake-ups whose largest part is each cause, per phase."""
    shares = (
        # In order of first appearance, as in the parts table: pivot's columns follow it.
        frame.group_by("phase", "cause", maintain_order=True)
        .agg(pl.len().alias("n"))
        .with_columns((100 * pl.col("n") / pl.col("n").sum().over("phase")).round(1).alias("pct"))
        .pivot(on="phase", index="cause", values="pct")
        .fill_null(0.0)
        .sort("cause")
    )
    return Table(
        "cause (largest part) of each wake-up, % per phase",
        shares.rename({c: f"{c}_pct" for c in shares.columns if c != "cause"}),
    )


def _worst_table(frame: pl.DataFrame) -> Table:
    """The slowest wake-ups with their largest part."""
    worst = frame.sort(["total_ns", "run_id", "wake_id"], descending=[True, False, False]).head(
        WORST
    )
    part = pl.coalesce(
        [pl.when(pl.col("cause") == c.removesuffix("_ns")).then(pl.col(c)) for c in COMPONENTS]
    )
    return Table(
        f"the {worst.height} slowest wake-ups",
        worst.select(
            "run_id",
            pl.col("wake_id").alias("loop"),
            (pl.col("total_ns") / 1000).round(1).alias("total_us"),
            "cause",
            (part / 1000).round(1).alias("cause_us"),
            "path",
        ),
        note="loop: the thread's loop number in the trace; path remote: timer on another CPU",
    )


def _cdf_plot(frame: pl.DataFrame) -> Plot:
    """Latency CDF per phase, log x."""
    return Plot(
        "wake-up latency per phase (trace: expiry -> switch-in)",
        "cdf",
        frame.select("phase", (pl.col("total_ns") / 1000).alias("latency_us")),
        x="latency_us",
        series="phase",
        log_x=True,
        x_label="latency (us)",
    )


def _parts_plot(frame: pl.DataFrame) -> Plot:
    """Mean of each part per phase (means add up to the mean total; medians do not)."""
    long = frame.group_by("phase", maintain_order=True).agg(
        [(pl.col(c).mean() / 1000).alias(c.removesuffix("_ns")) for c in COMPONENTS]
    )
    long = long.unpivot(index="phase", variable_name="part", value_name="mean_us")
    return Plot(
        "mean wake-up latency by part, per phase",
        "bars",
        long,
        x="part",
        y="mean_us",
        series="phase",
        y_label="mean (us)",
    )


def _check(r: RunWakeups, bundles: list[BundleData]) -> tuple[Table, str]:
    """Trace vs cyclictest for one run: a table and a sentence on the offset."""
    samples = r.data.latencies.filter(pl.col("run_id") == r.run.run_id)
    name = _label(r.data, bundles) + r.run.run_id
    table = Table(
        f"{name}: trace vs cyclictest's own samples",
        # The counts are in the sentence below: the table holds times only, in us.
        against_cyclictest(r.wakeups.frame, samples).filter(pl.col("statistic") != "samples"),
    )
    cycles = r.data.cycles.filter(pl.col("run_id") == r.run.run_id)["cycles"]
    counted = int(cycles.item()) if cycles.len() == 1 else None
    line = (
        f"{name}: the trace saw {r.wakeups.loops} loops ({r.wakeups.frame.height} whole);"
        f" cyclictest printed {samples.height} samples"
        + (f", {counted} counted" if counted is not None else "")
        + ". "
    )
    # The n-th sample is the n-th loop only when the trace saw every loop from the first.
    if counted is not None and r.wakeups.loops == counted and not r.wakeups.incomplete.height:
        pairs = paired_offset(r.wakeups.frame, samples).row(0, named=True)
        line += (
            f"Loop by loop cyclictest reads {_num(pairs['median_us'])} us more at the median"
            f" ({_pct(pairs['non_negative'])} of {pairs['pairs']} pairs >= 0): it reads the"
            " clock in user space, after the switch-in and the return from clock_nanosleep,"
            " which the trace's latency does not include"
        )
    else:
        line += (
            "The trace does not hold every loop of the run whole, so the two are compared"
            " as distributions only"
        )
    return table, line


def _incomplete_table(r: RunWakeups, bundles: list[BundleData]) -> list[Table]:
    """Loops whose path the trace does not show whole, by the first missing stage."""
    if r.wakeups.incomplete.height == 0:
        return []
    return [
        Table(
            f"{_label(r.data, bundles)}{r.run.run_id}: loops not decomposed",
            r.wakeups.incomplete,
            note="first stage the trace lacks (trace start/end, lost events)",
        )
    ]


def _unknowns() -> list[str]:
    """What the decomposition cannot tell."""
    return [
        "what the timer interrupt waited for before its entry (irqs off, the interrupt"
        " controller, the hardware): irq_delay is one number",
        "the return to user space after the switch-in (cyclictest's offset above the trace)",
    ]


def _us(ns: object) -> float | None:
    """ns -> us, one decimal."""
    return None if ns is None else round(float(ns) / 1000, 1)  # type: ignore[arg-type]


def _num(value: object) -> str:
    """A number for a sentence."""
    return "?" if value is None else f"{float(value):.1f}"  # type: ignore[arg-type]


def _pct(value: object) -> str:
    """A share as a percentage for a sentence."""
    return "?" if value is None else f"{100 * float(value):.0f}%"  # type: ignore[arg-type]
