"""Broadcast-TLBI cost: probe percentiles per CPU and phase, before/after, flush paths.

Thin: numbers come from tracekit/analysis/tlbi.py. Probe slots are runs of their own (no
trace), so the probe part has no lost events; flush-path durations come from traces and
leave out runs that lost events, saying so.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from tracekit.analysis.compare import Comparison
from tracekit.analysis.tlbi import (
    FUNCGRAPH_EXIT,
    SAMPLE_MEANING,
    el2_unseen,
    flush_missed,
    flush_summary,
    funcgraph_durations,
    probe_comparisons,
    probe_histogram,
    probe_label,
    probe_pair_durations,
    probe_percentiles,
    require_flush_events,
)
from tracekit.bundle import RunKind
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData, open_run_trace, traced_runs
from tracekit.ingest.probe import probe_samples
from tracekit.report.header import bundle_label
from tracekit.report.model import Plot, Section, Table

# The traced runs whose flush-path calls the section times (not sweeps nor during phases).
FLUSH_RUN_KINDS = (RunKind.TRACED, RunKind.GUEST, RunKind.AFTER_GUEST)
# What a probe sample is (reproducer/tlbiprobe.c): said wherever probe numbers are shown.
PROBE_NOTE = "a sample is " + SAMPLE_MEANING.format(cpu="the cpu column")


def section(bundles: list[BundleData]) -> Section | None:
    """Probe distributions and verdicts per CPU, and flush-path durations when traced."""
    many = len(bundles) > 1
    findings: list[str] = []
    comparisons: list[Comparison] = []
    tables: list[Table] = []
    plots: list[Plot] = []
    unknowns: list[str] = []
    lost_total: int | None = None
    for data in bundles:
        prefix = f"{bundle_label(data)}: " if many else ""
        samples = probe_samples(data)
        if samples.height:
            since = {run.run_id: run.since_guest_ns for run in data.manifest.runs}
            tables += _probe_tables(samples, since, prefix)
            plots += _probe_plots(samples, prefix)
            found = probe_comparisons(samples)
            comparisons += [replace(c, metric=prefix + c.metric) for c in found]
            unknowns += _short(found, prefix)
            unknowns.append(
                f"{prefix}which CPU holds any state: not from the probe alone; its DSB ISH"
                " waits for every CPU, so a slower CPU here is the one that issued, and the"
                " slow responder may be any CPU"
            )
        flush = _flush(data, prefix)
        if flush is not None:
            unknowns += [prefix + line for line in el2_unseen(data.manifest.scenario)]
            table, lines, lost, missing = flush
            tables += [table] if table is not None else []
            findings += lines
            unknowns += [missing] if missing else []
            lost_total = (lost_total or 0) + lost
    if not tables and not findings:
        return None
    return Section(
        key="tlbi",
        title="Broadcast-TLBI cost per CPU and phase (probe; flush paths)",
        findings=findings,
        comparisons=comparisons,
        tables=tables,
        plots=plots,
        unknowns=unknowns,
        lost_events=lost_total,
    )


def _probe_tables(samples: pl.DataFrame, since: dict[str, int | None], prefix: str) -> list[Table]:
    """One percentile table per probe mode and direction (RW->RO, RO->RW never pooled)."""
    out = []
    per = probe_percentiles(samples, since)
    for (mode, pages, direction), rows in per.group_by(
        "mode", "pages", "direction", maintain_order=True
    ):
        out.append(
            Table(
                f"{prefix}probe ({probe_label(mode, direction, pages)}): one syscall per sample,"
                " per issuing CPU (us)",
                rows.select(
                    "cpu",
                    "phase",
                    "samples",
                    "p50_us",
                    "p99_us",
                    "max_us",
                    pl.col("since_guest_s").alias("after_guest_s"),
                ),
                note=(
                    "percentiles of every sample of the phase's slots on that CPU;"
                    " after_guest_s: how long after the guest ended the first slot started"
                    " (null: before the guest, or not recorded); "
                )
                + PROBE_NOTE,
            )
        )
    return out


def _probe_plots(samples: pl.DataFrame, prefix: str) -> list[Plot]:
    """One histogram per mode, direction and CPU, before/after as series, on a log scale."""
    frame = probe_histogram(samples)
    out = []
    groups = frame.group_by("mode", "pages", "direction", "cpu", maintain_order=True)
    for (mode, pages, direction, cpu), rows in groups:
        out.append(
            Plot(
                f"{prefix}probe ({probe_label(mode, direction, pages)}) issued on CPU {cpu}:"
                " syscall duration per phase",
                "histogram",
                rows.select("phase", "duration_us"),
                x="duration_us",
                series="phase",
                log_x=True,
                x_label="one syscall (us)",
                y_label="syscalls",
            )
        )
    return out


def _short(found: list[Comparison], prefix: str) -> list[str]:
    """Say, once, how many slots per phase a probe verdict would need."""
    short = [c for c in found if c.needed_runs is not None]
    if not short:
        return []
    c = short[0]
    return [
        f"{prefix}whether the probe's cost changed: {c.n_before}+{c.n_after} probe slots per"
        f" CPU cannot reach a verdict (a slot is one run); the rule needs"
        f" {c.needed_runs}+{c.needed_runs}"
    ]


def _flush(data: BundleData, prefix: str) -> tuple[Table | None, list[str], int, str | None] | None:
    """Flush-path table, findings, lost events used, what is missing; None: no traces."""
    runs = traced_runs(data, kinds=FLUSH_RUN_KINDS)
    if not runs:
        return None
    frames, missed, lines, lost, names = [], [], [], 0, set()
    for run in runs:
        trace = open_run_trace(data, run)
        names |= set(trace.event_names)
        durations, unpaired, unclosed = probe_pair_durations(trace.events, run.probe_misses)
        if FUNCGRAPH_EXIT in trace.event_names:
            graph = funcgraph_durations(trace.event(FUNCGRAPH_EXIT))
            durations = pl.concat([durations, graph])
        if durations.height == 0 and unpaired == 0:
            continue
        run_lost = data.run(run).lost_events
        if run_lost:
            lines.append(
                f"{prefix}{run.run_id} excluded from flush-path durations: it lost"
                f" {run_lost} events"
            )
            continue
        if unpaired:
            lines.append(
                f"{prefix}{run.run_id}: {unpaired} flush-path entry/return events had no"
                " partner; not counted"
            )
            lines += [f"{prefix}{run.run_id}: {note}" for note in unclosed]
        lost += run_lost  # used runs only: 0 here, since runs that lost events are left out
        frames.append(durations.with_columns(pl.lit(run.phase).alias("phase")))
        functions = sorted(set(durations["function"].to_list()))
        missed.append(flush_missed(functions, run.phase, run.probe_misses))
    try:
        require_flush_events(sorted(names))
    except TracekitError as err:
        return None, lines, lost, f"{prefix}flush-path durations: {err}"
    if not frames:
        return None, lines, lost, None
    summary = flush_summary(pl.concat(frames), pl.concat(missed))
    table = Table(
        f"{prefix}probed KVM paths (flush callers, teardown, VMID, stage-2 map): entry ->"
        " return per call (us, trace clock)",
        summary.select(
            "function",
            "phase",
            "cpu",
            "calls",
            "p50_us",
            "max_us",
            pl.col("missed_returns").alias("missed"),
        ),
        note=(
            "kprobe entry/return pairs (tracekit group) or function_graph; tracing adds cost;"
            " missed: returns the function's kretprobe missed in the phase's runs, on any CPU"
            " (kprobe_profile), calls these durations cannot include (null: not recorded, or"
            " timed by function_graph)"
        ),
    )
    return table, lines, lost, None
