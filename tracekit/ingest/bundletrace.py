"""A whole collect bundle as one Trace: every run's trace, tagged with its run and phase.

`tracekit.open(BUNDLE)` and `tracekit ingest BUNDLE` come here. Each run's trace is
ingested on its own and cached as Parquet beside it, inside the bundle (a second open
reads the caches); this module only stacks them. `row` stays a unique key (offset by the
rows of the runs before), `run_id` and `phase` columns say where every row came from, and
the bundle's tool results (cyclictest samples, stress-ng throughput, probe summaries)
are the Trace's tool tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

from tracekit.bundle import RunRecord, run_trace_path
from tracekit.ingest.bundle import BundleData, load_bundle, open_run_trace
from tracekit.ingest.tables import EVENTS_SCHEMA, LOST_SCHEMA, Tables, lean
from tracekit.ingest.trace import Trace
from tracekit.progress import Steps

T = TypeVar("T")


def open_bundle(
    path: Path,
    *,
    salvage: bool = False,
    use_cache: bool = True,
    symbols: Path | None = None,
    progress: Steps | None = None,
) -> Trace:
    """Every run trace of the bundle at PATH as one Trace (each run cached beside it);
    `progress` hears each run before it is read."""
    data = load_bundle(path)
    runs = [run for run in data.manifest.runs if run_trace_path(path, run.run_id) is not None]
    options = {"salvage": salvage, "use_cache": use_cache, "symbols": symbols}
    traces = []
    for done, run in enumerate(runs):
        if progress is not None:
            progress(done, len(runs), run.run_id)
        traces.append((run, open_run_trace(data, run, **options)))
    tables = _stack(traces, _tag)
    tables.tools = _tool_tables(data)
    tables.meta.update(_meta(data, traces, use_cache))
    return Trace(path, tables, from_cache=bool(traces) and all(t.from_cache for _, t in traces))


def _tag(frame: pl.DataFrame, run: RunRecord, offset: int | None) -> pl.DataFrame:
    """FRAME with its run and phase (and `row` shifted by OFFSET when it has rows)."""
    shifted = [pl.col("row") + offset] if offset is not None else []
    return frame.with_columns(
        *shifted,
        run_id=pl.lit(run.run_id, pl.Categorical),
        phase=pl.lit(run.phase, pl.Categorical),
    )


def _concat(frames: list[pl.DataFrame], schema: dict[str, Any]) -> pl.DataFrame:
    """Frames stacked (columns one run lacks are null there); SCHEMA's when there is none."""
    if not frames:
        tagged = {**schema, "run_id": pl.Categorical, "phase": pl.Categorical}
        return pl.DataFrame(schema=tagged)
    return pl.concat(frames, how="diagonal_relaxed")


def _stack(
    traces: Sequence[tuple[T, Trace]], tag: Callable[[pl.DataFrame, T, int | None], pl.DataFrame]
) -> Tables:
    """The traces' events, per-event and lost tables stacked in order, each tagged by
    `tag` (its rows shifted past the traces before it)."""
    events: list[pl.DataFrame] = []
    lost: list[pl.DataFrame] = []
    by_event: dict[str, list[pl.DataFrame]] = {}
    offset = 0
    for key, trace in traces:
        events.append(tag(trace.events, key, offset))
        lost.append(tag(trace.lost, key, None))
        for name in trace.event_names:
            by_event.setdefault(name, []).append(lean(tag(trace.event(name), key, offset)))
        offset += trace.events.height
    return Tables(
        _concat(events, EVENTS_SCHEMA),
        {name: _concat(frames, {}) for name, frames in sorted(by_event.items())},
        _concat(lost, LOST_SCHEMA),
        {},
    )


def _tool_tables(data: BundleData) -> dict[str, pl.DataFrame]:
    """The bundle's tool results, by name; empty ones left out."""
    tools = {
        "cyclictest_samples": data.latencies,
        "cyclictest_cycles": data.cycles,
        "stress_ng": data.stress,
        "probe": data.probes,
    }
    return {name: table for name, table in tools.items() if table.height}


def _meta(data: BundleData, traces: list[tuple[RunRecord, Trace]], cached: bool) -> dict[str, Any]:
    """What the bundle says about the stacked traces: runs, phases, clock, CPUs, state."""
    clocks = sorted({str(t.meta.get("clock") or "?") for _, t in traces})
    return {
        "reader": "bundle",
        "format": "bundle",
        "clock": clocks[0] if len(clocks) == 1 else f"mixed ({', '.join(clocks)})",
        "instance": "",
        "cpus": sorted({int(c) for _, t in traces for c in t.meta.get("cpus") or []}),
        "runs": [
            {"run_id": r.run_id, "phase": r.phase, "kind": r.kind, "status": r.status}
            for r, _ in traces
        ],
        "complete": data.manifest.complete,
        "phases": list(dict.fromkeys(run.phase for run, _ in traces)),
        "emulated": bool(data.manifest.host.get("emulated")),
        "skipped": [f"{run.run_id}: {n}" for run, t in traces for n in t.meta.get("skipped") or []],
        "cache": "beside each run's trace, in the bundle" if cached and traces else None,
    }


def open_bundles(
    path: Path, bundles: list[Path], progress: Steps | None = None, **options: Any
) -> Trace:
    """Every bundle under PATH (a campaign's directory) as one Trace: their runs stacked,
    a `bundle` column (its directory under PATH) on every table; `progress` hears each."""
    opened = []
    for done, bundle in enumerate(bundles):
        if progress is not None:
            progress(done, len(bundles), bundle.name)
        opened.append((bundle.relative_to(path).as_posix() or ".", open_bundle(bundle, **options)))
    tables = _stack(opened, _of_bundle)
    tools: dict[str, list[pl.DataFrame]] = {}
    for label, trace in opened:
        for name, table in trace.tools.items():
            tools.setdefault(name, []).append(_of_bundle(table, label, None))
    tables.tools = {n: pl.concat(f, how="diagonal_relaxed") for n, f in tools.items()}
    tables.meta.update(_campaign_meta(opened))
    return Trace(path, tables, from_cache=all(t.from_cache for _, t in opened))


def _of_bundle(frame: pl.DataFrame, label: str, offset: int | None) -> pl.DataFrame:
    """FRAME with a leading `bundle` column (and `row` shifted by OFFSET)."""
    shifted = [pl.col("row") + offset] if offset is not None else []
    return frame.with_columns(*shifted).select(
        pl.lit(label, pl.Categorical).alias("bundle"), pl.all()
    )


def _campaign_meta(opened: list[tuple[str, Trace]]) -> dict[str, Any]:
    """The bundles' metas merged: each run named with its bundle, CPUs and phases of all."""
    metas = [(label, t.meta) for label, t in opened]
    clocks = sorted({str(m.get("clock") or "?") for _, m in metas})
    return {
        "reader": "campaign",
        "format": "campaign",
        "clock": clocks[0] if len(clocks) == 1 else f"mixed ({', '.join(clocks)})",
        "instance": "",
        "bundles": [label for label, _ in metas],
        "cpus": sorted({int(c) for _, m in metas for c in m.get("cpus") or []}),
        "runs": [{"bundle": label, **r} for label, m in metas for r in m.get("runs") or []],
        "phases": list(dict.fromkeys(p for _, m in metas for p in m.get("phases") or [])),
        "complete": all(m.get("complete") for _, m in metas),
        "emulated": any(m.get("emulated") for _, m in metas),
        "skipped": [f"{label}: {s}" for label, m in metas for s in m.get("skipped") or []],
        "cache": "beside each run's trace, in each bundle" if opened else None,
    }
