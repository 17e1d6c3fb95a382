"""`perf script` text of tracepoint events -> the same tables as the ftrace text reader.

perf prints each tracepoint sample as `COMM TID [CPU] SECONDS: SYSTEM:EVENT: FIELDS`
(the CPU column only when the recording had per-CPU samples, e.g. `-a`; microseconds
unless `--ns`). Fields are the tracepoint's print format, so `key=value` pairs become
columns as in text.py. Lines that are neither samples, comments nor blank are counted and
reported; perf itself reports lost samples on stderr at `perf record` and `perf script`
time (`--show-lost-events` prints them inline, and those lines are counted too).
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest.tables import LOST_SCHEMA, Tables
from tracekit.ingest.text import read_lines, typed_tables

READER = "perf script"
SAMPLE_RE = (
    r"^\s*(?<comm>.*?)\s+(?<pid>-?\d+)(?:/(?<tid>\d+))?\s+(?:\[(?<cpu>\d+)\]\s+)?"
    r"(?<sec>\d+)\.(?<frac>\d+):\s+(?<system>[\w-]+):(?<event>[\w-]+):\s?(?<fields>.*)$"
)
_SAMPLE = re.compile(SAMPLE_RE.replace("(?<", "(?P<"), re.M)


def is_perf_script(head: str) -> bool:
    """Whether the first KBs of a text file are `perf script` tracepoint samples."""
    return len(_SAMPLE.findall(head)) >= 1 and not re.search(r"^# tracer:", head, re.M)


def _samples(lines: pl.DataFrame) -> pl.DataFrame:
    """The sample lines with their parsed parts (others dropped here, counted by the caller)."""
    parsed = lines.with_columns(pl.col("line").str.extract_groups(SAMPLE_RE).alias("m"))
    return parsed.unnest("m").filter(pl.col("event").is_not_null())


def _events(samples: pl.DataFrame) -> pl.DataFrame:
    """The events table (ns timestamps from the digits perf printed)."""
    frac = pl.col("frac")
    scale = pl.lit(10, pl.Int64).pow(pl.lit(9) - frac.str.len_chars().cast(pl.Int64))
    ts = pl.col("sec").cast(pl.Int64) * 1_000_000_000 + frac.cast(pl.Int64) * scale
    tid = pl.coalesce(pl.col("tid"), pl.col("pid")).cast(pl.Int32)
    return samples.select(
        row=pl.int_range(pl.len(), dtype=pl.Int64),
        ts=ts,
        cpu=pl.col("cpu").cast(pl.Int32),
        pid=tid,
        tgid=pl.when(pl.col("tid").is_not_null()).then(pl.col("pid").cast(pl.Int32)),
        comm=pl.col("comm").str.strip_chars(),
        event=pl.col("event"),
        system=pl.col("system"),
        flags=pl.lit(None, pl.UInt8),
        preempt_count=pl.lit(None, pl.UInt8),
        fields=pl.col("fields"),
    )


def read_perf_script(path: Path) -> Tables:
    """Parse `perf script` output of tracepoint samples into Tables."""
    lines = read_lines(path, READER)
    samples = _samples(lines)
    if samples.is_empty():
        raise TracekitError(
            f"{READER} reader: {path}: no tracepoint samples (expected `perf script` output "
            "of `perf record -e SYSTEM:EVENT`)"
        )
    blank = pl.col("line").is_null() | pl.col("line").str.contains(r"^\s*(#|$)")
    other = lines.filter(~blank & ~pl.col("lineno").is_in(samples["lineno"].implode()))
    skipped = []
    if other.height:
        first = other.row(0, named=True)
        skipped.append(
            f"{other.height} line(s) that are not samples (first: line {first['lineno']}: "
            f"{first['line'][:60]!r})"
        )
    events = _events(samples)
    if not events["ts"].is_sorted():  # perf sorts by time; keep `row` in time order
        events = events.sort("ts", "cpu", maintain_order=True).with_columns(
            row=pl.int_range(pl.len(), dtype=pl.Int64)
        )
    meta = {
        "reader": READER, "format": "perf-script", "clock": "perf", "instance": "",
        "cpus": sorted(events["cpu"].drop_nulls().unique().to_list()), "skipped": skipped,
        "unparsed_lines": other.height,
    }  # fmt: skip
    tables = typed_tables(events)
    events = events.drop("fields").with_columns(
        pl.col("comm", "event", "system").cast(pl.Categorical)
    )
    return Tables(events, tables, pl.DataFrame(schema=LOST_SCHEMA), meta)
