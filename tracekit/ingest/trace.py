"""The Trace object: format detection, cache use, table access and the text summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest import cache
from tracekit.ingest.rawcapture import is_raw_capture, read_raw_capture
from tracekit.ingest.tables import EVENTS_SCHEMA, LOST_SCHEMA, Tables, build_tables
from tracekit.ingest.tracedat import MAGIC, read_tracedat


class Trace:
    """Decoded tables of one recording (see docs/tables.md for the schemas)."""

    def __init__(self, path: Path, tables: Tables, from_cache: bool) -> None:
        self.path = path
        self._tables = tables
        self.from_cache = from_cache

    @property
    def events(self) -> pl.DataFrame:
        """One row per event: row, ts, cpu, pid, tgid, comm, event, system, flags, ..."""
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
        """The typed table of one event type (row, ts, cpu, pid, then its fields)."""
        try:
            return self._tables.by_event[name]
        except KeyError:
            have = ", ".join(self.event_names) or "none"
            raise TracekitError(
                f"{self.path}: no event {name!r} in this trace (it has: {have})"
            ) from None

    def lazy(self, name: str | None = None) -> pl.LazyFrame:
        """A LazyFrame over the events table, or over one event's table."""
        return (self.events if name is None else self.event(name)).lazy()

    def summary(self) -> str:
        """Events per type per CPU, time span, lost events, skipped data: plain text."""
        from tracekit.ingest.summary import summarise

        return summarise(self)


def _kind(path: Path) -> str:
    """'rawcap', 'tracedat' or 'text', from the content (never from the file name)."""
    if path.is_dir():
        if is_raw_capture(path):
            return "rawcap"
        raise TracekitError(
            f"{path}: a directory with neither capture.json nor manifest.json; give a "
            "collect bundle, a raw capture directory (docs/raw-capture.md), a trace.dat or "
            "a text trace"
        )
    if not path.exists():
        raise TracekitError(f"{path}: no such file or directory")
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        raise TracekitError(f"{path}: the file is empty; was the recording interrupted?")
    if head.startswith(MAGIC):
        return "tracedat"
    if head.startswith(MAGIC[:3]):
        raise TracekitError(f"{path}: looks like a trace.dat but its magic is damaged")
    from tracekit.ingest.tools import detect_tool

    text = head.decode("utf-8", "replace")
    if detect_tool(text):
        return "tool"
    if b"\0" in head:
        raise TracekitError(
            f"{path}: binary data that is not a trace.dat; give a trace.dat, a raw "
            "capture directory or a text trace"
        )
    from tracekit.ingest.perfscript import is_perf_script

    return "perfscript" if is_perf_script(text) else "text"


def _parse(path: Path, kind: str, salvage: bool, symbols: Path | None) -> Tables:
    """Run the reader for this kind of input."""
    if kind == "rawcap":
        return build_tables(read_raw_capture(path, salvage), salvage, symbols)
    if kind == "tracedat":
        return build_tables(read_tracedat(path, salvage), salvage, symbols)
    if symbols is not None:
        raise TracekitError(
            f"{path}: symbols are only applied to binary traces (trace.dat, raw capture); "
            "a text trace already prints names: leave the symbols option out"
        )
    if kind == "tool":
        return _tool_tables(path)
    if kind == "perfscript":
        from tracekit.ingest.perfscript import read_perf_script

        return read_perf_script(path)
    from tracekit.ingest.text import read_text

    return read_text(path, salvage)


def _tool_tables(path: Path) -> Tables:
    """A tool's output: no events, its result tables under `tools`."""
    from tracekit.ingest.tools import read_tool

    tool, tools, skipped = read_tool(path)
    meta = {"reader": tool, "format": tool, "cpus": [], "skipped": skipped}
    events = pl.DataFrame(schema=EVENTS_SCHEMA)
    return Tables(events, {}, pl.DataFrame(schema=LOST_SCHEMA), meta, tools)


def open_trace(
    path: str | Path,
    *,
    salvage: bool = False,
    use_cache: bool = True,
    symbols: str | Path | None = None,
) -> Trace:
    """Open a trace.dat, a raw capture directory, a text trace (cached as Parquet) or a
    whole collect bundle (every run's trace, with run and phase columns).

    `symbols`, a kallsyms copy or a vmlinux, names address fields in `<field>_sym`
    columns; without it the trace's own kallsyms copy does, when it has one.
    """
    path = Path(path)
    sym_path = Path(symbols) if symbols is not None else None
    if sym_path is not None and not sym_path.is_file():
        raise TracekitError(f"symbols: {sym_path} does not exist; give a vmlinux or kallsyms copy")
    from tracekit.bundle import is_bundle
    from tracekit.ingest.bundletrace import open_bundle

    if is_bundle(path):
        return open_bundle(path, salvage=salvage, use_cache=use_cache, symbols=sym_path)
    kind = _kind(path)
    if use_cache:
        hit = cache.load(path, salvage, sym_path)
        if hit is not None:
            return _with_bundle_meta(Trace(path, hit[0], from_cache=True))
    tables = _parse(path, kind, salvage, sym_path)
    if use_cache:
        where = cache.save(path, tables, salvage, sym_path)
        tables.meta["cache"] = str(where) if where else None
    return _with_bundle_meta(Trace(path, tables, from_cache=False))


def _with_bundle_meta(trace: Trace) -> Trace:
    """A run's trace.dat inside a bundle (BUNDLE/runs/RUN/trace.dat) gets what the bundle
    knows and the file does not: the instance's clock, the events enabled."""
    from tracekit.bundle import bundle_of, read_manifest
    from tracekit.ingest.bundle import add_collect_meta

    root = bundle_of(trace.path)
    if root is not None:
        add_collect_meta(trace, read_manifest(root))
    return trace
