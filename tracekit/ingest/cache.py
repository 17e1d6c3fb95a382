"""Parquet cache of decoded tables, reused while the inputs are unchanged.

Where: beside a bare trace file (`.<name>.tracekit/`), or inside a capture or bundle
directory (`.tracekit-cache/`). Key: every input file's relative path, size and SHA-256
(a given symbols file, kallsyms or vmlinux, is one of the inputs), plus the tracekit
version and salvage flag. A quick check on (size, mtime) avoids hashing
when nothing was touched; if those differ the content hash decides, so a `touch` does not
force a re-parse but any changed byte does.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl

from tracekit import __version__
from tracekit.ingest.tables import Tables

# 3: `<field>_sym` columns; 4: the events table says `common_pid` (was `pid`); 5: `_sym`
# columns Categorical.
CACHE_FORMAT = 5
# The cache's key (format, tracekit version, input size and mtime, options); not a
# bundle manifest, so not called one.
CACHE_KEY_FILE = "cache.json"
DIR_CACHE = ".tracekit-cache"


def cache_dir(path: Path) -> Path:
    """Where the cache of this input lives."""
    if path.is_dir():
        return path / DIR_CACHE
    return path.parent / f".{path.name}.tracekit"


def input_files(path: Path) -> list[Path]:
    """The files whose content the tables depend on (a directory's files, minus caches)."""
    if not path.is_dir():
        return [path]
    return sorted(
        p for p in path.rglob("*") if p.is_file() and DIR_CACHE not in p.relative_to(path).parts
    )


def _inputs(path: Path, symbols: Path | None) -> list[Path]:
    """The trace's input files, then the given symbols file (it changes the tables too)."""
    return input_files(path) + ([symbols] if symbols is not None else [])


def _label(path: Path, f: Path) -> str:
    """An input's name in the key: relative to the trace, absolute when outside it."""
    root = path if path.is_dir() else path.parent
    try:
        return str(f.relative_to(root))
    except ValueError:
        return str(f.resolve())


def _stat(path: Path, files: list[Path]) -> dict[str, list[int]]:
    """{name: [size, mtime_ns]} of every input."""
    return {_label(path, f): [f.stat().st_size, f.stat().st_mtime_ns] for f in files}


def _content_key(path: Path, files: list[Path], salvage: bool) -> str:
    """SHA-256 over the inputs' names, sizes and contents, the version and salvage flag."""
    h = hashlib.sha256(f"{CACHE_FORMAT} {__version__} salvage={salvage}\n".encode())
    for f in files:
        h.update(f"{_label(path, f)} {f.stat().st_size}\n".encode())
        with open(f, "rb") as src:
            while block := src.read(1 << 22):
                h.update(block)
    return h.hexdigest()


def _table_file(name: str) -> str:
    """A safe file name for a per-event table."""
    return "event-" + "".join(c if c.isalnum() or c in "_-" else "_" for c in name) + ".parquet"


def load(path: Path, salvage: bool, symbols: Path | None = None) -> tuple[Tables, bool] | None:
    """Cached tables (lazy scans inside eager frames' place) if still valid, else None."""
    cdir = cache_dir(path)
    try:
        manifest = json.loads((cdir / CACHE_KEY_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if manifest.get("format") != CACHE_FORMAT or manifest.get("tracekit") != __version__:
        return None
    if manifest.get("salvage") != salvage:
        return None
    files = _inputs(path, symbols)
    stat = _stat(path, files)
    if stat != manifest.get("stat"):
        if _content_key(path, files, salvage) != manifest.get("key"):
            return None
        manifest["stat"] = stat
        _write_manifest(cdir, manifest)
    return _read_tables(cdir, manifest), True


def _read_tables(cdir: Path, manifest: dict[str, Any]) -> Tables:
    """Read the Parquet files a manifest lists."""
    by_event = {name: pl.read_parquet(cdir / fname) for name, fname in manifest["tables"].items()}
    tools = {name: pl.read_parquet(cdir / fname) for name, fname in manifest["tools"].items()}
    return Tables(
        pl.read_parquet(cdir / "events.parquet"),
        by_event,
        pl.read_parquet(cdir / "lost.parquet"),
        manifest["meta"],
        tools,
    )


def _write_manifest(cdir: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest last-step atomically (a reader never sees half of it)."""
    tmp = cdir / f"{CACHE_KEY_FILE}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, default=str))
    tmp.replace(cdir / CACHE_KEY_FILE)


def write_tables(
    directory: Path, tables: Tables, whole: bool = False
) -> tuple[dict[str, str], dict[str, str]]:
    """events.parquet, lost.parquet, one event-<name> and tool-event-<name> file per table
    (typed tables as stored, lean or not, unless `whole`: then as `Tables.event` gives
    them); returns the file of each event table and of each tool table, by name."""
    tables.events.write_parquet(directory / "events.parquet")
    tables.lost.write_parquet(directory / "lost.parquet")
    names = {name: _table_file(name) for name in tables.by_event}
    for name in tables.by_event:
        df = tables.event(name) if whole else tables.by_event[name]
        df.write_parquet(directory / names[name])
    tools = {name: f"tool-{_table_file(name)}" for name in tables.tools}
    for name, df in tables.tools.items():
        df.write_parquet(directory / tools[name])
    return names, tools


def save(path: Path, tables: Tables, salvage: bool, symbols: Path | None = None) -> Path | None:
    """Store the tables; returns the cache directory, or None if it cannot be written."""
    cdir = cache_dir(path)
    files = _inputs(path, symbols)
    try:
        if cdir.exists():
            shutil.rmtree(cdir)
        cdir.mkdir(parents=True)
        names, tools = write_tables(cdir, tables)
        manifest = {
            "format": CACHE_FORMAT, "tracekit": __version__, "salvage": salvage,
            "stat": _stat(path, files), "key": _content_key(path, files, salvage),
            "tables": names, "tools": tools, "meta": tables.meta,
        }  # fmt: skip
        _write_manifest(cdir, manifest)
    except OSError:
        return None  # read-only location: the trace still opens, just not cached
    return cdir
