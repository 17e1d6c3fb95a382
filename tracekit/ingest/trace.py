"""The Trace: one recording's tables (events, per-event, lost), its meta and its summary.

Opening a path as a Trace (which reader, the Parquet cache) is tracekit/ingest/opening.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest.tables import Tables


class Trace:
    """Decoded tables of one recording (see docs/tables.md for the schemas)."""

    def __init__(self, path: Path, tables: Tables, from_cache: bool) -> None:
        self.path = path
        self._tables = tables
        self.from_cache = from_cache

    @property
    def events(self) -> pl.DataFrame:
        """One row per event: row, ts, cpu, common_pid, tgid, comm, event, system, flags, ..."""
        return self._tables.events

    @property
    def lost(self) -> pl.DataFrame:
        """One row per lost-events report: cpu, ts, page, count, source, detail."""
        return self._tables.lost

    @property
    def meta(self) -> dict[str, Any]:
        """What the container said: reader, clock, instance, CPUs, uname, skipped, ..."""
        return self._tables.meta

    @property
    def tools(self) -> dict[str, pl.DataFrame]:
        """Tool-result tables (cyclictest_threads, stress_ng, perf_stat, ...), by name."""
        return self._tables.tools

    @property
    def event_names(self) -> list[str]:
        """Names of the per-event tables present, sorted."""
        return sorted(self._tables.by_event)

    def event(self, name: str) -> pl.DataFrame:
        """The typed table of one event type (row, ts, cpu, common_pid, then its fields)."""
        try:
            return self._tables.event(name)
        except KeyError:
            have = ", ".join(self.event_names) or "none"
            raise TracekitError(
                f"{self.path}: no event {name!r} in this trace (it has: {have})"
            ) from None

    def __repr__(self) -> str:
        """What the trace is at a glance: source, reader, events, types, CPUs, runs, losses."""
        from tracekit.cpus import format_cpu_list

        meta = self.meta
        parts = [
            f"{self.path.name!r}",
            f"reader={meta.get('reader', '?')!r}",
            f"events={self.events.height}",
            f"event_types={len(self.event_names)}",
            f"cpus={format_cpu_list([int(c) for c in meta.get('cpus') or []]) or '-'}",
        ]
        if meta.get("bundles"):
            parts.append(f"bundles={len(meta['bundles'])}")
        if meta.get("runs") is not None:
            parts.append(f"runs={len(meta['runs'])}")
        counts = self.lost["count"]
        parts.append(f"lost={int(counts.sum())}" + ("+unknown" if counts.null_count() else ""))
        if self.tools:
            parts.append(f"tools={sorted(self.tools)}")
        return f"Trace({', '.join(parts)})"

    def write_parquet(self, directory: str | Path) -> Path:
        """Every table as a Parquet file in DIRECTORY, with tables.json listing them."""
        from tracekit.ingest.parquet import export_parquet

        return export_parquet(self._tables, self.path, Path(directory))

    def lazy(self, name: str | None = None) -> pl.LazyFrame:
        """A LazyFrame over the events table, or over one event's table."""
        return (self.events if name is None else self.event(name)).lazy()

    def summary(self) -> str:
        """Events per type per CPU, time span, lost events, skipped data: plain text."""
        from tracekit.ingest.summary import summarise

        return summarise(self)
