"""One export: a trace's tables (optionally windowed) -> a .pftrace file.

Order of packets: system info and process tree first (so names and the kernel release
are known before any event), then the ftrace bundles, the loss counters, and
tracekit's tracks.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.errors import TracekitError
from tracekit.perfetto.ftrace import write_ftrace
from tracekit.perfetto.system import collect_tasks, process_tree_packet, system_info_packet
from tracekit.perfetto.tracks import write_tracks
from tracekit.perfetto.writer import PacketWriter

if TYPE_CHECKING:
    from tracekit.ingest.trace import Trace


@dataclass
class ExportResult:
    """What an export wrote: counts per event type, what the source had, file size."""

    counts: Counter[str]
    source_counts: Counter[str]
    packets: int
    bytes: int


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
) -> ExportResult:
    """Write TRACE (its events in WINDOW) as a Perfetto trace at OUT."""
    events = _in_window(trace.events, window)
    if events.is_empty():
        raise TracekitError(
            f"{trace.path}: no events to export"
            + (" in that --window" if window != (None, None) else "")
            + "; check the input with `tracekit ingest` and the window bounds"
        )
    tables = {name: _in_window(trace.event(name), window) for name in trace.event_names}
    tables = {name: table for name, table in tables.items() if not table.is_empty()}
    lost = _in_window(trace.lost, window)
    first_ts, last_ts = int(events["ts"].min()), int(events["ts"].max())  # type: ignore[arg-type]
    with PacketWriter(out) as writer:
        writer.write(system_info_packet(trace.meta, first_ts))
        tree = process_tree_packet(collect_tasks(events, tables), first_ts)
        if tree is not None:
            writer.write(tree)
        counts = write_ftrace(writer, events, tables, lost, symbols)
        write_tracks(writer, tables, lost, runs, last_ts)
    per_type = events.group_by("event").len().with_columns(pl.col("event").cast(pl.String))
    source = Counter(dict(per_type.iter_rows()))
    return ExportResult(counts, source, writer.packets, writer.bytes)


def read_kallsyms(path: str | os.PathLike[str]) -> dict[int, str]:
    """Addresses -> names from a /proc/kallsyms copy (tracekit.symbols reads it)."""
    from tracekit.symbols.kallsyms import read_kallsyms as read_table

    table = read_table(path)
    return {s.address: s.name for s in table.symbols}
