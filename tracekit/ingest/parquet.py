"""`tracekit ingest X --parquet DIR`: a trace's tables as plain Parquet files to keep.

Unlike the cache (hidden, replaced whenever the input changes), DIR is the user's: the
same files the cache holds (events.parquet, lost.parquet, event-<name>.parquet,
tool-event-<name>.parquet) plus tables.json, which lists each table with its file, rows
and column types, and the trace's meta. Any Parquet reader opens them (polars, pyarrow,
DuckDB: docs/tables.md, "Parquet export").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from tracekit import __version__
from tracekit.errors import TracekitError
from tracekit.ingest.cache import write_tables
from tracekit.ingest.tables import Tables

INDEX = "tables.json"
INDEX_FORMAT = 1


def export_parquet(tables: Tables, source: Path, directory: Path) -> Path:
    """Write every table to DIR (new, empty, or a previous export) and its index."""
    if directory.exists() and not directory.is_dir():
        raise TracekitError(f"--parquet {directory}: a file is there; name a directory")
    if directory.is_dir() and any(directory.iterdir()) and not (directory / INDEX).is_file():
        raise TracekitError(
            f"--parquet {directory}: the directory holds other files; name a new or empty one"
        )
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.parquet"):  # a previous export's tables, all replaced
        old.unlink()
    names, tools = write_tables(directory, tables, whole=True)  # the documented schemas
    index = {
        "format": INDEX_FORMAT,
        "tracekit": __version__,
        "source": source.name,
        "tables": {
            "events": _entry("events.parquet", tables.events),
            "lost": _entry("lost.parquet", tables.lost),
            **{f"event:{n}": _entry(f, tables.event(n)) for n, f in names.items()},
            **{f"tool:{n}": _entry(f, tables.tools[n]) for n, f in tools.items()},
        },
        "meta": tables.meta,
    }
    (directory / INDEX).write_text(json.dumps(index, indent=1, default=str) + "\n")
    return directory


def _entry(file: str, frame: pl.DataFrame) -> dict[str, Any]:
    """One table in the index: its file, rows, and column types as polars names them."""
    return {
        "file": file,
        "rows": frame.height,
        "columns": {name: str(dtype) for name, dtype in frame.schema.items()},
    }
