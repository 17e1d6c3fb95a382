"""A bundle's phases and runs as tracks, so before -> guest -> after reads left to right.

Under the "tracekit" root: one "phases" track (a slice per phase, from its first run's
start to its last run's end), then one track per phase holding its runs, then one group
per run that holds that run's own tracks (its trace's VMs and guest time, its
cyclictest latencies, its probe samples). Runs come from the manifest, with their start
and end on the trace clock (CLOCK_BOOTTIME) and their lost events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tracekit.perfetto.tracks import Span, TrackWriter, write_spans

# Sibling ranks under the root (its children are in EXPLICIT order).
PHASES_RANK = 0
PHASE_RANK = 1
RUN_RANK = 100
OTHER_RANK = 10_000

_DESCRIPTION = (
    "The collection's phases in time order; each run of a phase is a slice on the phase's "
    "track, and each run's own tracks are in the group named after it."
)


def timed_runs(runs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Runs with both a start and an end, in time order."""
    timed = [r for r in runs if r.get("start_ns") is not None and r.get("end_ns") is not None]
    return sorted(timed, key=lambda r: (int(r["start_ns"]), int(r["end_ns"])))


def run_args(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run's manifest facts as slice arguments, its lost events per CPU included."""
    args: dict[str, Any] = {
        k: run[k] for k in ("run_id", "phase", "kind", "index", "status", "note") if run.get(k)
    }
    lost = run.get("lost_events") or {}
    if lost:
        args["lost_events"] = sum(int(v) for v in lost.values())
        for cpu, count in sorted(lost.items()):
            args[f"lost_events_cpu{cpu}"] = int(count)
    return args


def write_phases(tracks: TrackWriter, root: int, runs: Sequence[Mapping[str, Any]]) -> None:
    """The phases track and one track per phase with its runs (untimed runs are skipped)."""
    timed = timed_runs(runs)
    if not timed:
        return
    phases: dict[str, list[Mapping[str, Any]]] = {}
    for run in timed:
        phases.setdefault(str(run.get("phase") or "?"), []).append(run)
    spans: list[Span] = []
    for phase, members in phases.items():
        start = min(int(r["start_ns"]) for r in members)
        end = max(int(r["end_ns"]) for r in members)
        spans.append((start, end, phase, {"runs": len(members)}))
    write_spans(tracks, "phases", "tracekit: phases", root, spans, _DESCRIPTION, PHASES_RANK)
    for rank, (phase, members) in enumerate(phases.items(), PHASE_RANK):
        write_spans(
            tracks,
            f"phase:{phase}",
            f"phase {phase}: runs",
            root,
            [
                (int(r["start_ns"]), int(r["end_ns"]), str(r["run_id"]), run_args(r))
                for r in members
            ],
            rank=rank,
        )


def run_group(
    tracks: TrackWriter, root: int, run: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]
) -> int:
    """The group track of one run (declared on first use), ranked by the run's start."""
    order = [str(r["run_id"]) for r in timed_runs(runs)]
    run_id = str(run["run_id"])
    rank = RUN_RANK + (order.index(run_id) if run_id in order else len(order))
    name = f"run {run_id}" + (f" ({run['kind']})" if run.get("kind") else "")
    return tracks.track(f"run:{run_id}", name, root, rank=rank, ordering="CHRONOLOGICAL")
