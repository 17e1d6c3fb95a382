"""One trace's tracekit tracks, composed under one "tracekit" parent so a newcomer finds
them together (a bundle's runs each get a group of their own: runs.py): the scenarios'
spans (scenario.py), the TLBI probe's windows, time in guest per vCPU thread, lost
events. Everything is drawn from the (windowed) trace tables and analysis results;
nothing is read from files here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from tracekit.analysis.exits import exit_reason
from tracekit.analysis.vm import marker_table, tracekit_markers
from tracekit.ingest.lost import lost_per_cpu
from tracekit.perfetto.tracks import TrackWriter
from tracekit.perfetto.writer import PacketWriter

# How a whole trace's per-CPU loss is counted (its instant says so).
LOST_TOTAL_HOW = "the largest count of the manifest and each of the trace's loss sources"


def write_trace_tracks(
    tracks: TrackWriter,
    parent: int,
    tables: Mapping[str, pl.DataFrame],
    lost: pl.DataFrame,
    end_ts: int | None,
    scope: str = "",
    events: pl.DataFrame | None = None,
    vmm_runs: Sequence[Mapping[str, str]] = (),
    vmid_bits: int | None = None,
    lost_totals: Mapping[int, int] | None = None,
    probe_misses: Mapping[str, int] | None = None,
) -> None:
    """Every track one trace allows, under PARENT; SCOPE keeps one run's tracks apart.

    `events` (row, ts, cpu) times flushes by their neighbours when no flush kprobe was
    recorded; `vmm_runs` are the VMM's `run` records (a bundle's vmm.txt), whose guest
    variants say which VM was a TLBI loop; `lost_totals` the events lost per CPU as a
    bundle's RunData counts them (else ingest's definition over the trace's own reports);
    `probe_misses` a bundle run's kprobe misses (RunRecord.probe_misses).
    """
    from tracekit.perfetto.scenario import write_scenario_tracks

    markers = list(markers_of(marker_table(tables)))
    write_scenario_tracks(
        tracks, parent, tables, markers, events, end_ts, scope, vmm_runs, vmid_bits, probe_misses
    )
    write_probe_runs(tracks, parent, markers, end_ts, scope)
    write_guest_time(tracks, parent, tables.get("kvm_entry"), tables.get("kvm_exit"), end_ts, scope)
    totals = lost_totals if lost_totals is not None else lost_per_cpu(lost, {})
    write_lost(tracks, parent, lost, totals, end_ts, scope)


def write_tracks(
    writer: PacketWriter,
    tables: Mapping[str, pl.DataFrame],
    lost: pl.DataFrame,
    runs: Sequence[Mapping[str, Any]] = (),
    end_ts: int | None = None,
) -> None:
    """One trace's tracks (and a bundle's phases and runs) under a new "tracekit" root."""
    from tracekit.perfetto.runs import write_phases

    tracks = TrackWriter(writer)
    root = tracks.track("root", "tracekit", ordering="EXPLICIT")
    write_phases(tracks, root, runs)
    write_trace_tracks(tracks, root, tables, lost, end_ts)


Marker = tuple[int, int, str, dict[str, str]]
"""(ts, pid, tool, key=value fields) of one tracekit trace marker."""


def markers_of(prints: pl.DataFrame | None) -> Iterable[Marker]:
    """Every tracekit trace marker (tracekit-vmm, tracekit-probe), as analysis reads them."""
    if prints is None:
        return
    for ts, pid, tool, text in tracekit_markers(prints).iter_rows():
        fields = dict(p.split("=", 1) for p in text.split() if "=" in p)
        yield ts, pid, tool, fields


def write_probe_runs(
    tracks: TrackWriter,
    root: int,
    markers: Sequence[Marker],
    end_ts: int | None,
    scope: str = "",
) -> None:
    """The TLBI probe's measuring windows (start..stop markers) per probe CPU."""
    started: dict[int, int] = {}  # probe pid -> its track
    for ts, pid, tool, fields in markers:
        if tool != "tracekit-probe":
            continue
        if fields.get("event") == "start":
            cpu = fields.get("cpu", "?")
            track = tracks.track(f"{scope}probe:{cpu}", f"tracekit: TLBI probe on CPU {cpu}", root)
            tracks.begin(track, ts, f"probe {fields.get('mode', '')}".strip(), fields)
            started[pid] = track
        elif fields.get("event") == "stop" and pid in started:
            track = started.pop(pid)
            tracks.end(track, ts, fields)
    for track in started.values():
        tracks.end(track, end_ts or 0, {"unfinished": True})


def write_guest_time(
    tracks: TrackWriter,
    root: int,
    entries: pl.DataFrame | None,
    exits: pl.DataFrame | None,
    end_ts: int | None,
    scope: str = "",
) -> None:
    """Per vCPU thread, an "in guest" slice from kvm_entry to kvm_exit, named by reason."""
    if entries is None or exits is None:
        return
    group = tracks.track(f"{scope}guest", "tracekit: time in guest (per vCPU thread)", root)
    fields = [c for c in exits.columns if c not in ("row", "ts", "cpu", "common_pid")]
    both = pl.concat(
        [
            entries.select("row", "ts", "common_pid"),
            exits.select("row", "ts", "common_pid", pl.struct(*fields).alias("exit")),
        ],
        how="diagonal_relaxed",
    ).sort("row")
    # Slices are written when they close, so each carries its exit reason as its name.
    inside: dict[int, int] = {}
    for _row, ts, tid, exit_fields in both.iter_rows():
        track = tracks.track(f"{scope}guest:{tid}", f"vCPU thread {tid}: in guest", group)
        if exit_fields is None:
            if tid in inside:  # two entries without an exit between them
                tracks.begin(track, inside[tid], "in guest (exit not recorded)")
                tracks.end(track, ts)
            inside[tid] = ts
        elif tid in inside:
            reason = exit_reason(exit_fields)
            args = {k: v for k, v in exit_fields.items() if v is not None}
            tracks.begin(track, inside.pop(tid), f"guest: {reason}", args)
            tracks.end(track, ts)
    for tid, ts in inside.items():
        track = tracks.track(f"{scope}guest:{tid}", "")
        tracks.begin(track, ts, "in guest (trace ends)")
        tracks.end(track, max(ts, end_ts or 0))


def write_lost(
    tracks: TrackWriter,
    root: int,
    lost: pl.DataFrame,
    totals: Mapping[int, int],
    end_ts: int | None,
    scope: str = "",
) -> None:
    """Per CPU the events the trace lost (one instant at its end, the report's count),
    and each timed loss report as an instant where it happened."""
    timed = lost.filter(pl.col("ts").is_not_null()).sort("ts", "cpu")
    shown = {cpu: n for cpu, n in totals.items() if n}
    if timed.is_empty() and not shown:
        return
    track = tracks.track(f"{scope}lost", "tracekit: lost events", root)
    last = 0
    for cpu, ts, count, source, detail in timed.select(
        "cpu", "ts", "count", "source", "detail"
    ).iter_rows():
        args = {"cpu": cpu, "source": source, "detail": detail or ""}
        if count is not None:
            args["count"] = count
        tracks.instant(track, ts, f"lost events on CPU {cpu}", args)
        last = ts
    at = max(end_ts or 0, last)  # after the timed ones: a track never goes back in time
    for cpu, n in sorted(shown.items()):
        args = {"cpu": cpu, "count": n, "counted": LOST_TOTAL_HOW}
        tracks.instant(track, at, f"{n} events lost on CPU {cpu} (whole trace)", args)
