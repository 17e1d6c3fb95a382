"""A whole bundle as one Perfetto timeline: every traced run, and every run's own tracks.

All of a bundle's runs happened on one boot of one host, one after another, and every
trace is on the trace clock (CLOCK_BOOTTIME) that the manifest's run times use, so the
runs' timestamps line up as they are (two traced runs or more are written as a TAR of
one Perfetto trace per run and one of the tracks, which Perfetto merges on BOOTTIME);
`check_timeline` says so when they do not (a trace outside its run's times, traced runs
overlapping). `--run` selects one run, `--phase` a
phase's runs; the manifest's phases and runs are drawn for what is selected.

Per run, in its group: its trace's tracks, its cyclictest latencies (timed from the
trace when it has one: latency.py) and its TLBI probe samples (probe.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.bundle import Manifest, RunKind, RunRecord
from tracekit.errors import TracekitError
from tracekit.perfetto.export import ExportResult, Progress, TracePart, export_parts
from tracekit.perfetto.runs import OTHER_RANK, run_group
from tracekit.perfetto.scenario import TLBI_LOOP
from tracekit.perfetto.tracks import TrackWriter, write_spans

# What only a bundle needs (its loading, analyses, simulation notes, latency and probe
# tracks) is imported when a bundle is exported: `tracekit perfetto TRACE.dat` imports
# this module too, and those imports cost more than exporting a small trace.
if TYPE_CHECKING:
    import polars as pl

    from tracekit.ingest.bundle import BundleData
    from tracekit.ingest.rundata import RunData
    from tracekit.progress import Steps

EMULATED = "emulated host: its timings are not hardware timings"
# A trace may start before its run (the instance is armed first) and end after it.
CLOCK_SLACK_NS = 1_000_000_000


def select_runs(manifest: Manifest, run_id: str | None, phase: str | None) -> list[RunRecord]:
    """The runs to export: all, the one named, or a phase's (unknown names: one-line error)."""
    runs = list(manifest.runs)
    if run_id is not None:
        runs = [r for r in runs if r.run_id == run_id]
        if not runs:
            have = ", ".join(r.run_id for r in manifest.runs) or "none"
            raise TracekitError(f"--run {run_id}: no such run in the bundle (have: {have})")
    if phase is not None:
        runs = [r for r in runs if r.phase == phase]
        if not runs:
            have = ", ".join(dict.fromkeys(r.phase for r in manifest.runs)) or "none"
            raise TracekitError(f"--phase {phase}: no such run in the bundle (phases: {have})")
    return runs


def check_timeline(spans: Sequence[tuple[RunRecord, int, int]]) -> list[str]:
    """Notes on traces (run, first ts, last ts) off their runs' times or overlapping."""
    notes = []
    for run, first, last in spans:
        if (
            run.start_ns is not None
            and run.end_ns is not None
            and (first < run.start_ns - CLOCK_SLACK_NS or last > run.end_ns + CLOCK_SLACK_NS)
        ):
            notes.append(
                f"{run.run_id}: its trace ({first / 1e9:.3f}..{last / 1e9:.3f} s) lies outside"
                f" the run ({run.start_ns / 1e9:.3f}..{run.end_ns / 1e9:.3f} s): is it on "
                "another clock than the manifest's CLOCK_BOOTTIME?"
            )
    latest: tuple[RunRecord, int] | None = None  # the run ending last so far, and its end
    for run, first, last in sorted(spans, key=lambda s: s[1]):
        if latest is not None and first < latest[1]:
            notes.append(
                f"{latest[0].run_id} and {run.run_id}: their traces overlap in time; both are"
                " drawn as recorded"
            )
        if latest is None or last > latest[1]:
            latest = (run, last)
    return notes


def default_output(root: Path, archive: bool) -> Path:
    """Where a bundle's export goes when -o is not given: in the current directory, named
    after the bundle, .tar when it is a TAR of several traces (else .pftrace)."""
    return Path(f"{root.resolve().name}.{'tar' if archive else 'pftrace'}")


def export_bundle(
    root: Path,
    out: str | os.PathLike[str] | None,
    window: tuple[int | None, int | None] = (None, None),
    run_id: str | None = None,
    phase: str | None = None,
    symbols: Mapping[int, str] | None = None,
    steps: Steps | None = None,
    progress: Progress | None = None,
) -> tuple[ExportResult, list[str]]:
    """Export the selected runs of a bundle into one file; returns the result and notes.

    `steps` hears each traced run before it is read and written; `progress`, the events
    written of each trace. OUT None: default_output's name."""
    from tracekit.analysis.conditions import simulated_label
    from tracekit.ingest.bundle import load_bundle
    from tracekit.simulate.model import SIMULATED_NOTE

    data = load_bundle(root)
    manifest = data.manifest
    selected = [r for r in select_runs(manifest, run_id, phase) if _overlaps(r, window)]
    if not selected and manifest.runs:  # a bundle stopped before its first run: its notes
        raise TracekitError(
            f"{root}: no run of the selection overlaps --window; the runs span "
            f"{_span(manifest.runs)} s of the trace clock"
        )
    job = BundleExport(data, selected, window, symbols, steps)
    title = "tracekit"
    if manifest.host.get("emulated"):
        title += f" ({EMULATED})"
    simulated = simulated_label(manifest)
    simulation = data.simulation() if simulated != "none" else None
    unapplied = simulation is not None and simulation.not_as_modelled()
    if simulated != "none":
        title += f" (SIMULATED EFFECT {simulated}{', NOT AS MODELLED' if unapplied else ''})"
    # Two traced runs or more: one trace each in a TAR (export.py), so the importer does
    # not join one run's sched state to the next's across the untraced gap between them.
    separate = len(job.traced) > 1
    if out is None:
        out = default_output(root, separate)
    result = export_parts(
        job.parts(), out, window, job.drawn, job.with_trace, job.without_trace, title,
        progress, separate,
    )  # fmt: skip
    notes = check_timeline(job.spans)
    notes += [f"the bundle is damaged or incomplete: {p}" for p in data.problems]
    if manifest.host.get("emulated"):
        notes.append(f"the bundle was recorded on an {EMULATED}")
    if simulated != "none":
        notes.append(f"SIMULATED EFFECT {simulated}: {SIMULATED_NOTE}")
    if unapplied and simulation is not None and simulation.entry is not None:
        notes += simulation.entry.lines()
    return result, notes


class BundleExport:
    """The selected runs of one bundle, fed to export_parts one trace at a time."""

    def __init__(
        self,
        data: BundleData,
        selected: list[RunRecord],
        window: tuple[int | None, int | None],
        symbols: Mapping[int, str] | None,
        progress: Steps | None = None,
    ) -> None:
        self.progress = progress
        self.data = data
        self.manifest = data.manifest
        self.selected = selected
        self.window = window
        self.symbols = symbols
        self.drawn = [vars(r) for r in selected]
        traced = [r for r in selected if data.run(r).trace_path is not None]
        self.traced = sorted(traced, key=lambda run: run.start_ns or 0)
        self.spans: list[tuple[RunRecord, int, int]] = []  # per trace: run, first, last ts

    def parts(self) -> Iterator[TracePart]:
        """One traced run at a time (none held once written), with its own kallsyms copy
        unless one was given."""
        for done, run in enumerate(self.traced):
            if self.progress is not None:
                self.progress(done, len(self.traced), run.run_id)
            found = self.data.run(run)
            trace = found.trace
            assert trace is not None and found.trace_path is not None
            ts = trace.events["ts"]
            if not ts.is_empty():
                self.spans.append((run, int(ts.min()), int(ts.max())))  # type: ignore[arg-type]
            symbols = self.symbols if self.symbols is not None else found.kallsyms
            vmm, lost = _vmm_runs(found), found.lost_per_cpu
            host = self.manifest.host
            yield TracePart(trace, symbols, vars(run), vmm, found.vmid_bits, lost, host)
            # RunData keeps what it loads; its trace, the bulk of a run, is let go once
            # written, so one run's tables are held at a time however many runs there are.
            del trace
            found.__dict__.pop("trace", None)

    def with_trace(self, tracks: TrackWriter, parent: int, part: TracePart, tables: Any) -> None:
        """A traced run's cyclictest latencies, timed by its trace."""
        self._cyclictest(tracks, parent, part.run or {}, tables, part.trace.events)

    def without_trace(self, tracks: TrackWriter, top: int) -> None:
        """Untraced runs' latencies and probe samples; a during phase's guest."""
        from tracekit.perfetto.groundtruth import write_ground_truth
        from tracekit.perfetto.probe import write_probe_samples

        traced = {r.run_id for r in self.traced}
        for run in self.selected:
            found = self.data.run(run)
            if run.run_id not in traced and found.cyclictest is not None:
                group = run_group(tracks, top, vars(run), self.drawn)
                self._cyclictest(tracks, group, vars(run), None, None)
            if found.probe is not None:
                group = run_group(tracks, top, vars(run), self.drawn)
                write_probe_samples(
                    tracks, group, run.run_id, found.probe, run.start_ns, self.window
                )
        _background_guests(tracks, top, self.data, self.selected)
        write_ground_truth(tracks, top, self.data, self.selected, self.window)

    def _cyclictest(
        self,
        tracks: TrackWriter,
        parent: int,
        run: Mapping[str, Any],
        tables: Mapping[str, pl.DataFrame] | None,
        events: pl.DataFrame | None,
    ) -> None:
        """One run's cyclictest samples as a latency counter and its worst wake-ups."""
        from tracekit.analysis.wakeup import sleep_due_times
        from tracekit.perfetto.latency import timelines, write_latencies

        found = self.data.run(next(r for r in self.selected if r.run_id == run["run_id"]))
        interval, samples = found.cyclictest_interval_ns, found.cyclictest
        if interval is None or samples is None:
            return
        rt_cpu = self.manifest.options.get("rt_cpu")
        # The measuring threads' sleeps, as the wake-up decomposition finds them.
        timers = sleep_due_times(tables, int(rt_cpu)) if tables and rt_cpu is not None else []
        lines = timelines(samples, interval, int(run.get("start_ns") or 0), timers)
        write_latencies(tracks, parent, str(run["run_id"]), lines, self.window, rt_cpu)


def _overlaps(run: RunRecord, window: tuple[int | None, int | None]) -> bool:
    """Whether a run's time overlaps the window (runs without times are kept)."""
    t0, t1 = window
    if run.start_ns is None or run.end_ns is None:
        return True
    return (t1 is None or run.start_ns <= t1) and (t0 is None or run.end_ns >= t0)


def _span(runs: Sequence[RunRecord]) -> str:
    """First start .. last end of the runs, in seconds."""
    starts = [r.start_ns for r in runs if r.start_ns is not None]
    ends = [r.end_ns for r in runs if r.end_ns is not None]
    if not starts or not ends:
        return "?"
    return f"{min(starts) / 1e9:.3f}..{max(ends) / 1e9:.3f}"


def _vmm_runs(found: RunData) -> list[dict[str, str]]:
    """The VMM's `run` records of a run (its guest variants), when it kept vmm.txt."""
    return found.vmm.runs if found.vmm is not None else []


def _background_guests(
    tracks: TrackWriter, top: int, data: BundleData, selected: Sequence[RunRecord]
) -> None:
    """A guest kept running through a phase (guest-start .. guest-stop), on its CPUs."""
    manifest = data.manifest
    starts = {
        r.phase: r for r in selected if r.kind == RunKind.GUEST_START and r.start_ns is not None
    }
    for run in selected:
        begin = starts.get(run.phase)
        if run.kind != RunKind.GUEST_STOP or begin is None or run.end_ns is None:
            continue
        vmm = _vmm_runs(data.run(begin)) or _vmm_runs(data.run(run))
        variant = vmm[0].get("variant") if vmm else manifest.scenario.get("guest_variant")
        args = {"phase": run.phase, "variant": variant or "?", "timing": "the manifest's runs"}
        if vmm:
            args["tlbi_count"] = vmm[0].get("tlbi_count", "?")
        label = "guest TLBI loop" if variant == TLBI_LOOP else f"guest {variant or ''}".strip()
        for cpu in manifest.options.get("guest_cpus") or ["?"]:
            span = (int(begin.start_ns), int(run.end_ns), label, args)  # type: ignore[arg-type]
            write_spans(tracks, f"during:{run.phase}:{cpu}", f"CPU {cpu}: {label} "
                        f"(phase {run.phase})", top, [span], rank=OTHER_RANK)  # fmt: skip
