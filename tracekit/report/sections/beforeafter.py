"""The main case's headline: cyclictest and stress-ng before -> after one guest.

Quiet runs give the verdicts; traced runs are shown beside them (the observer effect).
With several bundles, every table gains a `bundle` column and every comparison names its
bundle.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from tracekit.analysis.beforeafter import (
    idle_after_guest,
    latency_comparisons,
    phase_summary,
    saturated_phases,
    stress_comparison,
)
from tracekit.analysis.compare import Comparison
from tracekit.analysis.decision import action_meaning
from tracekit.analysis.gtsignatures import kernel_series
from tracekit.bundle import RunKind
from tracekit.ingest.bundle import BundleData
from tracekit.report.header import bundle_label, is_emulated, kvm_mode
from tracekit.report.model import Plot, Section, Table
from tracekit.report.sections.tlbi import PROBE_NOTE

# pages: a range/munmap slot's count (1, 511, 513 by default); absent in older datasets.
PROBE_COLUMNS = ("phase", "cpu", "mode", "pages", "count", "p50_ns", "p99_ns", "max_ns")
# Below this many samples a run's p99.9 is its maximum (QUANTILE_INTERPOLATION "higher").
P999_SAMPLES = 1000


def section(bundles: list[BundleData]) -> Section | None:
    """Phase summary, before/after verdicts, probe summary, sample and loss checks."""
    with_latencies = [b for b in bundles if b.latencies.height]
    if not with_latencies and not any(b.probes.height for b in bundles):
        return None
    many = len(bundles) > 1
    findings, headline, comparisons, unknowns = [], [], [], []
    controls: list[str] = []
    for data in with_latencies:
        prefix = f"{bundle_label(data)}: " if many else ""
        found, unknown = _comparisons(data, prefix)
        headline += [c for c in found if c.role == "primary"]
        comparisons += [c for c in found if c.role != "primary"]
        unknowns += unknown
        findings += [prefix + _samples_line(data), prefix + _lost_line(data)]
        meaning = _action_meaning(data)
        findings += [prefix + meaning] if meaning else []
        controls += [prefix + f for f in _observer_effect(data)]
        idle = idle_after_guest(data.manifest.runs)
        controls += [prefix + idle] if idle else []
    # A saturated rt CPU contradicts the protocol's premise: the lead says it first.
    contradictions = _saturated(with_latencies, many)
    tables = [
        Table(
            "cyclictest on the rt CPU, mean of per-run values (us)",
            _stack([(b, phase_summary(b.latencies)) for b in with_latencies], many),
            note="runs and samples per phase and kind; max and p99.9 are per-run values",
        )
    ]
    probes = [(b, _probe_us(b.probes)) for b in bundles if b.probes.height]
    if probes:
        tables.append(
            Table(
                "TLBI probe per issuing CPU: one syscall per sample (us), one slot per phase",
                _stack(probes, many),
                note=PROBE_NOTE + "; the probe's own summary pools every direction (the TLBI"
                " section keeps RW->RO and RO->RW apart)",
            )
        )
    unknowns += _few_samples(with_latencies)
    if not with_latencies:
        unknowns.append("wake-up latency before/after: the bundles hold no cyclictest runs")
    return Section(
        key="beforeafter",
        title="Before -> after one guest (quiet runs; primary: cyclictest p99.9)",
        findings=findings,
        comparisons=comparisons,
        contradictions=contradictions,
        headline=headline,
        controls=controls,
        tables=tables if with_latencies else tables[1:],
        plots=_plots(with_latencies, many),
        unknowns=unknowns,
        # Quiet runs' tool outputs, no trace: nothing this section shows can lose events
        # (its finding names the traced runs' losses, which the trace sections count).
        lost_events=None,
    )


def _comparisons(data: BundleData, prefix: str) -> tuple[list[Comparison], list[str]]:
    """The bundle's quiet-run comparisons (primary first) and what they cannot tell."""
    quiet = data.latencies.filter(pl.col("kind") == RunKind.QUIET.value)
    phases = set(quiet["phase"].unique())
    if not {"before", "after"} <= phases:
        return [], [f"{prefix}no before/after verdict: quiet runs only in {sorted(phases)}"]
    found = latency_comparisons(data.latencies, interval_us=interval_of(data))
    found.sort(key=lambda c: c.role != "primary")
    quiet_stress = data.stress.filter(pl.col("kind") == RunKind.QUIET.value)
    if set(quiet_stress["phase"].unique()) >= {"before", "after"}:
        found.append(stress_comparison(data.stress))
    found = [replace(c, metric=prefix + c.metric) for c in found] if prefix else found
    short = [c for c in found if c.needed_runs is not None]
    unreachable = [c for c in found if c.no_verdict]
    unknowns = []
    if unreachable:
        unknowns.append(f"{prefix}whether the effect is there: {unreachable[0].no_verdict}")
    elif short:
        c = short[0]
        unknowns.append(
            f"{prefix}whether the effect is there: {c.n_before}+{c.n_after} quiet runs cannot"
            f" reach a verdict; the rule needs {c.needed_runs}+{c.needed_runs}"
        )
    return found, unknowns


def interval_of(data: BundleData) -> float | None:
    """cyclictest's interval (us) as the bundle's options recorded it; None: not recorded."""
    interval = data.manifest.options.get("interval_us")
    return float(interval) if interval else None


def _saturated(bundles: list[BundleData], many: bool) -> list[str]:
    """Say plainly when the rt CPU could not keep up with cyclictest's timer: one sentence
    for every bundle of the same host kind and interval, each bundle's medians in it."""
    found: dict[tuple[str, object], list[str]] = {}
    for data in bundles:
        interval = interval_of(data)
        if interval is None:
            continue
        rows = saturated_phases(data.latencies, interval)
        if rows.is_empty():
            continue
        where = ", ".join(
            f"{r['median_us']:.0f} us {r['phase']} {r['kind']}" for r in rows.to_dicts()
        )
        host = "emulated " if is_emulated(data) else ""
        found.setdefault((host, interval), []).append(
            f"{bundle_label(data)} ({where})" if many else f"({where})"
        )
    return [
        f"the {host}rt CPU is saturated: its median wake-up latency"
        f"{' in ' if many else ' '}{'; '.join(where)} is above"
        f" cyclictest's {interval:.0f} us interval: most wake-ups come after the next period"
        " was due, so these latencies measure how far behind the CPU fell, not its"
        " wake-up path"
        for (host, interval), where in found.items()
    ]


def _probe_us(probes: pl.DataFrame) -> pl.DataFrame:
    """The probe's own summary in us, the unit every probe table of the report uses."""
    times = [c for c in PROBE_COLUMNS if c.endswith("_ns")]
    return probes.select(
        *(c for c in PROBE_COLUMNS if c not in times and c in probes.columns),
        *((pl.col(c) / 1000).alias(c.removesuffix("_ns") + "_us") for c in times),
    )


def _stack(frames: list[tuple[BundleData, pl.DataFrame]], many: bool) -> pl.DataFrame:
    """One frame; with several bundles, a leading `bundle` column says whose row it is."""
    if not frames:
        return pl.DataFrame()
    if not many:
        return frames[0][1]
    return pl.concat(
        [f.select(pl.lit(bundle_label(b)).alias("bundle"), pl.all()) for b, f in frames],
        how="diagonal_relaxed",
    )


def _observer_effect(data: BundleData) -> list[str]:
    """Traced vs quiet per phase: what tracing itself does to the numbers."""
    summary = phase_summary(data.latencies)
    ratios = []
    for phase in ("before", "after"):
        rows = summary.filter(pl.col("phase") == phase)
        kinds = dict(zip(rows["kind"], rows["p99_9_us"], strict=True))
        if kinds.get(RunKind.QUIET) and kinds.get(RunKind.TRACED) is not None:
            ratios.append(f"{kinds[RunKind.TRACED] / kinds[RunKind.QUIET]:.2f}x {phase}")
    if not ratios:
        return []
    return [
        f"observer effect: traced runs' p99.9 is {', '.join(ratios)} the quiet runs' (mean of"
        " per-run values); headline numbers use quiet runs only"
    ]


def _few_samples(bundles: list[BundleData]) -> list[str]:
    """Runs too short for a p99.9 of their own: it is then their maximum."""
    short = sum(
        b.latencies.group_by("run_id").len().filter(pl.col("len") < P999_SAMPLES).height
        for b in bundles
    )
    if not short:
        return []
    return [
        f"a p99.9 distinct from the maximum: {short} run(s) have fewer than {P999_SAMPLES}"
        " samples, so their p99.9 is their maximum"
    ]


def _plots(bundles: list[BundleData], many: bool) -> list[Plot]:
    """Latency CDF per phase (quiet runs) and per-run p99.9 bars: the unit is the run."""
    if not bundles:
        return []
    samples, per_run = [], []
    for data in bundles:
        tag = pl.lit(f"{bundle_label(data)} " if many else "")
        quiet = data.latencies.filter(pl.col("kind") == RunKind.QUIET.value)
        samples.append(
            quiet.select(
                (tag + pl.col("phase")).alias("series"),
                (pl.col("latency_ns") / 1000).alias("latency_us"),
            )
        )
        per_run.append(
            quiet.group_by("run_id", "phase")
            .agg((pl.col("latency_ns").quantile(0.999, "higher") / 1000).alias("p99_9_us"))
            .select(
                (tag + pl.col("run_id")).alias("run_id"),
                (tag + pl.col("phase")).alias("series"),
                "p99_9_us",
            )
            .sort(pl.col("series").str.ends_with("after"), "run_id")
        )
    return [
        Plot(
            "cyclictest latency on the rt CPU, quiet runs (CDF)",
            "cdf",
            pl.concat(samples),
            x="latency_us",
            series="series",
            log_x=True,
            x_label="wake-up latency (us)",
            y_label="fraction of samples",
        ),
        Plot(
            "cyclictest p99.9 per quiet run",
            "bars",
            pl.concat(per_run),
            x="run_id",
            y="p99_9_us",
            series="series",
            x_label="run",
            y_label="p99.9 (us)",
        ),
    ]


def _action_meaning(data: BundleData) -> str | None:
    """What the bundle's after-guest action ran on its kernel (decision.action_meaning)."""
    action = str(data.manifest.options.get("after_guest", "none"))
    release = str(data.manifest.host.get("kernel_release", "?"))
    return action_meaning(action, kernel_series(release), kvm_mode(data))


def _samples_line(data: BundleData) -> str:
    """Samples read against the loops cyclictest counted: a shortfall is shown, not hidden."""
    if data.cycles.height == 0:
        return "cyclictest samples: no --json counts to check them against"
    recorded = data.latencies.group_by("run_id").len()
    joined = data.cycles.join(recorded, on="run_id", how="left").fill_null(0)
    short = joined.filter(pl.col("len") < pl.col("cycles"))
    total = int(joined["cycles"].sum())
    if short.height == 0:
        return f"cyclictest samples: all {total} loops it counted were recorded"
    missing = int((short["cycles"] - short["len"]).sum())
    return (
        f"cyclictest samples: {missing} of {total} loops it counted were not printed by -v "
        f"({short.height} runs); the verdicts use the {total - missing} recorded"
    )


def _lost_line(data: BundleData) -> str:
    """Lost trace events per traced run: they would change any trace-derived number."""
    if data.lost.height == 0:
        return "lost events: no traced runs"
    total = int(data.lost["lost"].sum())
    if total == 0:
        return f"lost events: none in {data.lost.height} traced runs"
    runs = ", ".join(f"{r} ({n})" for r, n in data.lost.select("run_id", "lost").iter_rows() if n)
    return f"lost events: {total} in traced runs: {runs}"
