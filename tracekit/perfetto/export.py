"""One export: one or several traces' tables (optionally windowed) -> a .pftrace file.

Order of packets: the phases and runs (from a bundle's manifest), then per trace: system
info (first trace only) and process tree (so names and the kernel release are known
before its events), its ftrace bundles and its tracks; then the loss counters summed
over the traces, and tracks that need no trace (a bundle's untraced runs).

Several traces recorded one after another (a bundle's traced runs) go, `separate`, into
a TAR of Perfetto traces (writer.py): one member per trace with its own system info,
process tree, ftrace bundles and loss counters, and one member with every track
(TIMELINE). Each recording is then its own trace to the importer, which starts each
CPU's sched state afresh in it: in one file, the first sched_switch of a run on a CPU
would be joined to the last of the run before across the untraced gap (one slice
through the gap when the pids agree, a mismatched_sched_switch_tids error when not).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.errors import TracekitError
from tracekit.perfetto.ftrace import FtraceSequence, write_ftrace, write_stats
from tracekit.perfetto.runs import run_group, write_phases
from tracekit.perfetto.system import (
    collect_tasks,
    kernel_release,
    process_tree_packet,
    system_info_packet,
    tree_names,
)
from tracekit.perfetto.timeline import write_trace_tracks
from tracekit.perfetto.tracks import TrackWriter
from tracekit.perfetto.writer import PacketWriter

# The archive member with every track (it sorts before the runs' members).
TIMELINE = "00-timeline.pftrace"

if TYPE_CHECKING:
    from tracekit.ingest.trace import Trace


@dataclass
class ExportResult:
    """What an export wrote: counts per event type, what the source had, file size."""

    counts: Counter[str]
    source_counts: Counter[str]
    packets: int
    bytes: int
    traces: list[str] = field(default_factory=list)  # the runs (or trace paths) written
    empty: list[str] = field(default_factory=list)  # those with no event in the window
    members: list[str] = field(default_factory=list)  # a TAR's traces (none: one trace)
    # sched_switches whose prev_pid is not the previous switch's next_pid on that CPU in
    # the same trace, as recorded (e.g. a CPU taken offline): the importer counts each
    # as mismatched_sched_switch_tids.
    switch_gaps: int = 0
    path: str = ""  # the file written


@dataclass
class TracePart:
    """One trace to write, with its kernel symbols and, from a bundle, its run."""

    trace: Trace
    symbols: Mapping[int, str] | None = None
    run: Mapping[str, Any] | None = None
    vmm_runs: Sequence[Mapping[str, str]] = ()
    vmid_bits: int | None = None  # as a rollover run recorded it (else inferred)
    lost_per_cpu: Mapping[int, int] | None = None  # a bundle run's (RunData): the report's
    host: Mapping[str, Any] | None = None  # a bundle's host facts (machine, kernel release)

    @property
    def name(self) -> str:
        """The run id, or the trace's path outside a bundle."""
        return str(self.run["run_id"]) if self.run else str(self.trace.path)


# Extra tracks of a run whose trace is open (e.g. cyclictest timed by its hrtimers).
RunTracks = Callable[[TrackWriter, int, TracePart, Mapping[str, pl.DataFrame]], None]
# Tracks that need no trace (e.g. untraced runs' samples), written after every trace.
ExtraTracks = Callable[[TrackWriter, int], None]
# Told, per trace, (its name, events written so far, its events) as the export goes.
Progress = Callable[[str, int, int], None]


def parse_window(text: str) -> tuple[int | None, int | None]:
    """`T0:T1` in seconds of the trace clock (either side may be empty) -> ns bounds."""
    if text.count(":") != 1:
        raise TracekitError(f"--window {text!r}: write it as T0:T1 in seconds, e.g. 12.5:13")
    bounds: list[int | None] = []
    for part in text.split(":"):
        try:
            bounds.append(round(float(part) * 1e9) if part.strip() else None)
        except ValueError:
            raise TracekitError(
                f"--window {text!r}: {part!r} is not a number of seconds; write T0:T1"
            ) from None
    t0, t1 = bounds
    if t0 is not None and t1 is not None and t1 < t0:
        raise TracekitError(f"--window {text!r}: the end is before the start")
    return t0, t1


def _in_window(frame: pl.DataFrame, window: tuple[int | None, int | None]) -> pl.DataFrame:
    """Rows of a table whose ts lies in [t0, t1] (null ts rows are kept)."""
    t0, t1 = window
    if t0 is None and t1 is None:
        return frame  # no copy of a multi-million-row table for nothing
    keep = pl.lit(True)
    if t0 is not None:
        keep &= pl.col("ts").is_null() | (pl.col("ts") >= t0)
    if t1 is not None:
        keep &= pl.col("ts").is_null() | (pl.col("ts") <= t1)
    return frame.filter(keep)


def export_trace(
    trace: Trace,
    out: str | os.PathLike[str],
    window: tuple[int | None, int | None] = (None, None),
    symbols: Mapping[int, str] | None = None,
    runs: Sequence[Mapping[str, Any]] = (),
    progress: Progress | None = None,
) -> ExportResult:
    """Write TRACE (its events in WINDOW) as a Perfetto trace at OUT."""
    if _in_window(trace.events, window).is_empty():
        raise TracekitError(
            f"{trace.path}: no events to export"
            + (" in that --window" if window != (None, None) else "")
            + "; check the input with `tracekit ingest` and the window bounds"
        )
    return export_parts([TracePart(trace, symbols)], out, window, runs, progress=progress)


def export_parts(
    parts: Iterable[TracePart],
    out: str | os.PathLike[str],
    window: tuple[int | None, int | None] = (None, None),
    runs: Sequence[Mapping[str, Any]] = (),
    run_tracks: RunTracks | None = None,
    extra: ExtraTracks | None = None,
    title: str = "tracekit",
    progress: Progress | None = None,
    separate: bool = False,
) -> ExportResult:
    """Write several traces (a bundle's runs, one after another in time) into one file.

    They share one track tree: the phases and runs first, then per trace its system info
    (once), process tree, events and tracks, then the summed loss counters and the EXTRA
    tracks. One ftrace sequence, unless SEPARATE: then OUT is a TAR of one trace per part
    and one of the tracks (module docstring). PARTS may be a generator: one trace at a
    time is held in memory. TITLE names the root track (e.g. that the host was emulated).
    """
    result = ExportResult(Counter(), Counter(), 0, 0)
    losts: list[pl.DataFrame] = []
    with PacketWriter(out, archive=separate) as writer:
        timeline = PacketWriter(_timeline_path(out)) if separate else writer
        with _Owned(timeline, separate):
            tracks = TrackWriter(timeline)
            root = tracks.track("root", title, ordering="EXPLICIT")
            write_phases(tracks, root, runs)
            sequence = FtraceSequence()
            for part in parts:  # no enumerate: its reused tuple would hold the last part
                if separate:  # each recording its own trace: its own sequence state
                    sequence = FtraceSequence(sequence.sched.tree_names)
                member = _member_name(len(writer.members) + 1, part.name) if separate else None
                lost = _write_part(
                    writer, tracks, root, part, window, sequence, runs, result, progress, member
                )
                if lost is not None:
                    losts.append(lost)
                    if separate:
                        write_stats(writer, lost)
                        writer.end_member()
                    if run_tracks is not None and part.run is not None:
                        parent = run_group(tracks, root, part.run, runs)
                        run_tracks(tracks, parent, part, _tables(part.trace, window))
                del part  # not held while the next trace is made: one trace at a time
            if losts and not separate:
                write_stats(writer, pl.concat(losts, how="vertical_relaxed"))
            if extra is not None:
                extra(tracks, root)
        if separate:
            writer.append_file(TIMELINE, timeline.path, timeline.packets)
            timeline.path.unlink()
    result.packets, result.bytes = writer.packets, Path(out).stat().st_size
    result.members, result.path = list(writer.members), str(out)
    return result


def _timeline_path(out: str | os.PathLike[str]) -> Path:
    """Where the tracks wait, beside OUT, until they join the archive."""
    out = Path(out)
    return out.with_name(f".{out.name}.timeline")


def _member_name(n: int, name: str) -> str:
    """The archive member of the Nth trace: numbered in time order, named after its run."""
    return f"{n:02d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', name)[-80:]}.pftrace"


class _Owned:
    """A with-block over a writer only when this export opened it (else a no-op), so a
    failed export leaves no timeline file behind."""

    def __init__(self, writer: PacketWriter, owned: bool) -> None:
        self.writer = writer
        self.owned = owned

    def __enter__(self) -> None:
        if self.owned:
            self.writer.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.owned:
            self.writer.__exit__(*exc)
            if exc[0] is not None:
                self.writer.path.unlink(missing_ok=True)


def _tables(trace: Trace, window: tuple[int | None, int | None]) -> dict[str, pl.DataFrame]:
    """The trace's typed tables in the window, empty ones left out."""
    tables = {name: _in_window(trace.event(name), window) for name in trace.event_names}
    return {name: table for name, table in tables.items() if not table.is_empty()}


def _write_part(
    writer: PacketWriter,
    tracks: TrackWriter,
    root: int,
    part: TracePart,
    window: tuple[int | None, int | None],
    sequence: FtraceSequence,
    runs: Sequence[Mapping[str, Any]],
    result: ExportResult,
    progress: Progress | None = None,
    member: str | None = None,
) -> pl.DataFrame | None:
    """One trace's packets (in the archive MEMBER, begun here when given) and tracks; its
    lost-events table, or None if it had no event."""
    trace = part.trace
    events = _in_window(trace.events, window)
    if events.is_empty():
        result.empty.append(part.name)
        return None
    if member is not None:
        writer.begin_member(member)
    tables = _tables(trace, window)
    lost = _in_window(trace.lost, window)
    first_ts, last_ts = int(events["ts"].min()), int(events["ts"].max())  # type: ignore[arg-type]
    if sequence.first:
        writer.write(system_info_packet(trace.meta, first_ts, part.host))
    tasks = collect_tasks(events, tables)
    tree = process_tree_packet(tasks, first_ts)
    if tree is not None:
        writer.write(tree)
        sequence.sched.tree_names.update(tree_names(tasks))
    release = {"kernel_release": kernel_release(trace.meta, part.host)}
    told = None if progress is None else (lambda done, total: progress(part.name, done, total))
    result.counts += write_ftrace(
        writer, events, tables, lost, part.symbols, sequence, False, release, told
    )
    parent, scope = root, ""
    if part.run is not None:
        parent, scope = run_group(tracks, root, part.run, runs), f"{part.name}/"
    write_trace_tracks(
        tracks, parent, tables, lost, last_ts, scope, events.select("row", "ts", "cpu"),
        part.vmm_runs, part.vmid_bits, part.lost_per_cpu, (part.run or {}).get("probe_misses"),
    )  # fmt: skip
    per_type = events.group_by("event").len().with_columns(pl.col("event").cast(pl.String))
    result.source_counts += Counter(dict(per_type.iter_rows()))
    result.switch_gaps += switch_gaps(tables.get("sched_switch"))
    result.traces.append(part.name)
    return lost


def switch_gaps(switches: pl.DataFrame | None) -> int:
    """sched_switches (rows in time order) whose prev_pid is not the next_pid of the
    switch before on their CPU: where the importer counts mismatched_sched_switch_tids."""
    if switches is None or switches.is_empty():
        return 0
    before = pl.col("next_pid").shift(1).over("cpu")
    return int(switches.select((pl.col("prev_pid") != before).sum()).item() or 0)
