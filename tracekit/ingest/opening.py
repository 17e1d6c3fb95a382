"""Opening a path as a Trace: which reader its content needs, and the Parquet cache.

A bundle directory is not a trace: `tracekit.open` hands it to
tracekit/ingest/bundletrace.py (every run's trace stacked); this opens one recording.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest import cache
from tracekit.ingest.rawcapture import is_raw_capture, read_raw_capture
from tracekit.ingest.tables import EVENTS_SCHEMA, LOST_SCHEMA, Tables, build_tables
from tracekit.ingest.trace import Trace
from tracekit.ingest.tracedat import MAGIC, read_tracedat
from tracekit.progress import Steps


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
    """Open a trace.dat, a raw capture directory or a text trace (cached as Parquet).

    `symbols`, a kallsyms copy or a vmlinux, names address fields in `<field>_sym`
    columns; without it the trace's own kallsyms copy does, when it has one.
    """
    path = Path(path)
    sym_path = check_symbols(symbols)
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


def check_symbols(symbols: str | Path | None) -> Path | None:
    """The symbols file to name addresses with, which must exist, or None."""
    sym_path = Path(symbols) if symbols is not None else None
    if sym_path is not None and not sym_path.is_file():
        raise TracekitError(f"symbols: {sym_path} does not exist; give a vmlinux or kallsyms copy")
    return sym_path


def open_path(
    path: str | Path,
    *,
    salvage: bool = False,
    use_cache: bool = True,
    symbols: str | Path | None = None,
    progress: Steps | None = None,
) -> Trace:
    """One recording, a whole collect bundle (every run's trace, run and phase columns),
    or a directory of bundles such as a campaign's (a bundle column too), as `tracekit
    report` takes them; `progress` hears a bundle's runs, or the bundles, one by one."""
    from tracekit.bundle import MANIFEST, find_bundles, is_bundle

    given = Path(path)
    holds_bundles = given.is_dir() and not is_raw_capture(given) and any(given.rglob(MANIFEST))
    if is_bundle(given) or holds_bundles:
        from tracekit.ingest.bundletrace import open_bundle, open_bundles

        options = {"salvage": salvage, "use_cache": use_cache, "symbols": check_symbols(symbols)}
        if is_bundle(given):
            return open_bundle(given, progress=progress, **options)  # type: ignore[arg-type]
        return open_bundles(given, find_bundles(given), progress=progress, **options)
    return open_trace(path, salvage=salvage, use_cache=use_cache, symbols=symbols)


def _with_bundle_meta(trace: Trace) -> Trace:
    """A run's trace.dat inside a bundle (BUNDLE/runs/RUN/trace.dat) gets what the bundle
    knows and the file does not: the instance's clock, the events enabled."""
    from tracekit.bundle import bundle_of, read_manifest

    root = bundle_of(trace.path)
    if root is not None:
        from tracekit.ingest.bundle import add_collect_meta  # its readers: only for a bundle

        add_collect_meta(trace, read_manifest(root))
    return trace
