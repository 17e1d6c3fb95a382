"""A collect bundle's tool results as polars tables, one row per sample or per run.

The files a bundle's runs hold (cyclictest `-v -N` samples, stress-ng YAML, the probe's
JSON summary) become tables keyed by run, phase and kind, so analyses get plain frames
and never read files. A traced run's trace is opened separately (`open_run_trace`): a raw
capture directory `runs/<run>/trace`, or `runs/<run>/trace.dat` from `--capture trace-cmd`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.bundle import (
    MEASURE_KINDS,
    Manifest,
    RunFile,
    RunKind,
    RunRecord,
    bundle_problems,
    cut_files,
    damaged_files,
    read_manifest,
    run_dir,
    run_trace_path,
)
from tracekit.errors import TracekitError
from tracekit.ingest.rundata import RunData, cyclictest_cycles

if TYPE_CHECKING:
    from tracekit.ingest.groundtruth import GroundTruth
    from tracekit.ingest.trace import Trace
    from tracekit.simulate.model import Model
    from tracekit.simulate.simlog import EntryCheck, SimLog

LATENCY_SCHEMA = {
    "run_id": pl.String,
    "phase": pl.String,
    "kind": pl.String,
    "latency_ns": pl.Int64,
}
STRESS_SCHEMA = {"run_id": pl.String, "phase": pl.String, "kind": pl.String} | {
    "bogo_ops_per_s": pl.Float64
}
CYCLES_SCHEMA = {"run_id": pl.String, "cycles": pl.Int64}


@dataclass(frozen=True)
class BundleSimulation:
    """A simulated bundle's plugin log (the whole boot's: `text` tells one boot's bundles
    apart) and the model it ran (None when the bundle lacks the model's source)."""

    text: str
    log: SimLog
    model: Model | None
    # Whether the plugin watched the kernel's real CPU entry (None: it watched none); a
    # cpu-on model with mistakes here never cleared: its bundles test no prediction.
    entry: EntryCheck | None = None

    def not_as_modelled(self) -> bool:
        """The model clears by cpu-on and the plugin did not see its power-ons where the
        kernel enters (watched elsewhere, never, or not each one the kernel logged)."""
        return self.entry is not None and self.entry.cpu_on and bool(self.entry.mistakes)


@dataclass(frozen=True)
class BundleData:
    """A bundle's tool results as tables; each run's files through `run(run)`, opened once."""

    path: Path
    manifest: Manifest
    latencies: pl.DataFrame  # run_id, phase, kind, latency_ns: every cyclictest sample
    stress: pl.DataFrame  # run_id, phase, kind, bogo_ops_per_s (real time)
    probes: pl.DataFrame  # run_id, phase, cpu, mode, pages, count, p50_ns, p99_ns, max_ns, mean_ns
    lost: pl.DataFrame  # run_id, phase, kind, lost (sum over CPUs; traced runs only)
    cycles: pl.DataFrame  # run_id, cycles: loops cyclictest counted (its --json), per run
    opened: dict[str, RunData] = field(default_factory=dict, repr=False, compare=False)
    # What is missing or changed (bundle.bundle_problems: sizes; hashes with verify=True).
    problems: list[str] = field(default_factory=list, compare=False)
    damaged: set[str] = field(default_factory=set, repr=False, compare=False)  # never read
    # Built from a results dataset's tables (ingest/dataset.py): no run files to open.
    tables_only: bool = False
    _truth: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def ground_truth(self) -> tuple[GroundTruth, pl.DataFrame] | None:
        """The emulated ground truth (groundtruth/, added by `vhost run --ground-truth`)
        and its rows given to the runs, loaded once; None when the bundle has none."""
        from tracekit.ingest.groundtruth import bundle_ground_truth, has_ground_truth

        if "truth" not in self._truth:
            found = bundle_ground_truth(self.path) if has_ground_truth(self.path) else None
            self._truth["truth"] = found
        return self._truth["truth"]

    def simulation(self) -> BundleSimulation | None:
        """The simulation's log and model (groundtruth/ of `vhost run --simulate`), read
        once; None when the bundle holds no simulation log."""
        from tracekit.simulate.model import load_model
        from tracekit.simulate.simlog import parse_sim_log
        from tracekit.vhost.runner import GT_BUNDLE_DIR, SIM_LOG, SIM_SOURCE, cpu_entry_check

        if "simulation" not in self._truth:
            log_path = self.path / GT_BUNDLE_DIR / SIM_LOG
            source = self.path / GT_BUNDLE_DIR / SIM_SOURCE
            found = None
            if log_path.is_file():
                model = load_model(str(source)) if source.is_file() else None
                text = log_path.read_text(errors="replace")
                log = parse_sim_log(text, str(log_path))  # read once, for the check too
                entry = cpu_entry_check(self.path / GT_BUNDLE_DIR, log)
                found = BundleSimulation(text, log, model, entry)
            self._truth["simulation"] = found
        return self._truth["simulation"]

    def not_as_modelled(self) -> bool:
        """Whether the bundle ran under a cpu-on model the plugin did not apply as modelled
        (its simulation's check): its data answer to no model, and pool with no bundle
        whose model was applied."""
        simulation = self.simulation()
        return simulation is not None and simulation.not_as_modelled()

    def run(self, run: RunRecord) -> RunData:
        """The run's data: every file it holds, each loaded on first use and kept."""
        found = self.opened.get(run.run_id)
        if found is None:
            found = RunData(self.path, self.manifest, run, self.damaged)
            self.opened[run.run_id] = found
        return found


def load_bundle(path: str | Path, verify: bool = False) -> BundleData:
    """Read a bundle's manifest and its runs' tool outputs into tables.

    Its problems (missing, resized or cut files; with `verify`, changed hashes; what the
    runs' readers found) are listed in `problems`, for every output to show; a file whose
    size changed is never read, a cut one only as far as it is whole.
    """
    path = Path(path)  # a notebook passes a str
    manifest = read_manifest(path)
    damaged = damaged_files(path, manifest, full=verify)
    cut = cut_files(path, manifest)
    problems = bundle_problems(path, manifest, damaged=damaged, cut=cut)
    latencies, stress, probes, cycles = [], [], [], []
    opened = {
        run.run_id: RunData(path, manifest, run, set(damaged), set(cut) - set(damaged))
        for run in manifest.runs
    }
    for run in manifest.runs:
        data = opened[run.run_id]
        samples = data.cyclictest if run.kind in MEASURE_KINDS else None
        if samples is not None:
            latencies.append(_latencies(run, samples))
            if (counted := data.path(RunFile.CYCLICTEST_JSON)) is not None:
                cycles.append((run.run_id, cyclictest_cycles(counted)))
        if (ops := data.stress_ops_per_s) is not None:
            stress.append((run.run_id, run.phase, run.kind, ops))
        summary = data.probe_summary if run.kind == RunKind.PROBE else None
        if summary is not None:
            probes.append(_probe(run, summary))
    return BundleData(
        path=path,
        manifest=manifest,
        latencies=pl.concat(latencies) if latencies else pl.DataFrame(schema=LATENCY_SCHEMA),
        stress=pl.DataFrame(stress, schema=STRESS_SCHEMA, orient="row"),
        probes=pl.DataFrame(probes, orient="row") if probes else pl.DataFrame(),
        lost=recorded_lost(manifest),
        cycles=pl.DataFrame(cycles, schema=CYCLES_SCHEMA, orient="row"),
        opened=opened,
        problems=problems + [p for data in opened.values() for p in data.problems],
        damaged=set(damaged),
    )


def recorded_lost(manifest: Manifest) -> pl.DataFrame:
    """Lost events per run as the collector recorded them (RunData adds the trace's own)."""
    rows = [
        (run.run_id, run.phase, run.kind, sum(run.lost_events.values()))
        for run in manifest.runs
        if run.lost_events
    ]
    return pl.DataFrame(
        rows,
        schema={"run_id": pl.String, "phase": pl.String, "kind": pl.String} | {"lost": pl.Int64},
        orient="row",
    )


def traced_runs(data: BundleData, kinds: Collection[str] = (RunKind.TRACED,)) -> list[RunRecord]:
    """The bundle's runs of these kinds that recorded a trace, in run order."""
    return [
        run
        for run in data.manifest.runs
        if run.kind in kinds and run_trace_path(data.path, run.run_id) is not None
    ]


def open_run_trace(data: BundleData, run: RunRecord, **options: Any) -> Trace:
    """Ingest one run's trace (cached as Parquet beside it after the first time).

    `options` go to open_trace: salvage, use_cache, symbols.
    """
    from tracekit.ingest.opening import open_trace

    path = run_trace_path(data.path, run.run_id)
    if path is None:
        raise TracekitError(
            f"{data.path}: run {run.run_id} has no trace ({run_dir(run.run_id)}/"
            f"{RunFile.TRACE} or {RunFile.TRACE_DAT}); only traced runs have one"
        )
    found = data.run(run)
    if found.trace_path is None:  # there, but a file of it is missing or changed
        raise TracekitError(
            f"{data.path}: run {run.run_id}'s trace is damaged and not read "
            f"({'; '.join(p for p in data.problems if p.startswith(run_dir(run.run_id)))})"
        )
    if not options:  # the usual case: opened once, shared by every section and export
        trace = found.trace
        assert trace is not None  # found.trace_path is set
        return trace
    return open_trace(path, **options)  # a trace.dat gets the bundle's clock there


def add_collect_meta(trace: Trace, manifest: Manifest) -> None:
    """Give a trace-cmd capture what only the bundle knows: the instance's clock, its events.

    trace-cmd stores the top-level buffer's trace_clock in trace.dat, not that of the
    instance it extracted, and no list of enabled events; the raw capture has both.
    """
    capture = manifest.scenario.get("capture") or {}
    clock = capture.get("trace_clock")
    if clock and clock != trace.meta.get("clock"):
        trace.meta["clock_in_file"] = trace.meta.get("clock")
        trace.meta["clock"] = clock
    enabled = manifest.scenario.get("events_enabled")
    if enabled and not trace.meta.get("events_enabled"):
        trace.meta["events_enabled"] = list(enabled)


def _latencies(run: RunRecord, samples: pl.DataFrame) -> pl.DataFrame:
    """One run's cyclictest samples, tagged with the run."""
    return samples.select(
        pl.lit(run.run_id).alias("run_id"),
        pl.lit(run.phase).alias("phase"),
        pl.lit(run.kind).alias("kind"),
        pl.col("latency_ns").cast(pl.Int64),
    )


def _probe(run: RunRecord, summary: dict[str, Any]) -> dict[str, object]:
    """One probe slot's row from its summary as the probe printed it (RunData.probe_summary)."""
    return {
        "run_id": run.run_id,
        "phase": run.phase,
        "cpu": summary["cpu"],
        "mode": summary["mode"],
        "pages": summary.get("pages", 1),  # range/munmap slots' own count (page mode: 1)
        "count": summary["count"],
        "p50_ns": summary["p50_ns"],
        "p99_ns": summary["p99_ns"],
        "max_ns": summary["max_ns"],
        "mean_ns": summary["mean_ns"],
    }
