"""`perf script` text of tracepoint and sampling events -> the same tables as the ftrace
text reader.

perf prints each tracepoint sample as `COMM TID [CPU] SECONDS: SYSTEM:EVENT: FIELDS`
(the CPU column only when the recording had per-CPU samples, e.g. `-a`; microseconds
unless `--ns`). Fields are the tracepoint's print format, so `key=value` pairs become
columns as in text.py. A sampling event (`perf record -e cpu-clock`, cycles, ...) prints
`COMM TID [CPU] SECONDS: PERIOD EVENT:` (perf script's default fields: the period is what
tells it from a tracepoint), then its callchain (`-g`), one `ADDR SYM+OFF (DSO)` frame a
line, leaf first, up to a blank line; without a callchain the leaf frame is on the same
line. A sampling event's table has `period`, the leaf frame's `ip`, `sym` and `dso`, and
the callchain as `callchain_ip` / `callchain_sym` lists. Lines that are neither samples,
frames, comments nor blank are counted and reported; perf itself reports lost samples on
stderr at `perf record` and `perf script` time (`--show-lost-events` prints them inline,
and those lines are counted too).
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest.tables import LOST_SCHEMA, Tables
from tracekit.ingest.text import read_lines, typed_tables

READER = "perf script"
_HEAD = (
    r"^\s*(?<comm>.*?)\s+(?<pid>-?\d{1,9})(?:/(?<tid>\d{1,9}))?\s+(?:\[(?<cpu>\d{1,9})\]\s+)?"
    r"(?<sec>\d{1,9})\.(?<frac>\d{1,9}):\s+"
)  # pids and CPUs are Int32, ns Int64: a longer number is damage, and its line not read
SAMPLE_RE = _HEAD + r"(?<system>[\w-]+):(?<event>[\w-]+):\s?(?<fields>.*)$"
SAMPLING_RE = (
    _HEAD + r"(?<period>\d{1,19})\s+(?<event>[\w-]+(?::\w+)?):\s*"
    r"(?:(?<ip>[0-9a-f]{1,16})\s+(?<sym>.*?)\s+\((?<dso>[^()]*)\))?\s*$"
)
FRAME_RE = r"^\s+(?<ip>[0-9a-f]{1,16})\s+(?<sym>.*?)\s+\((?<dso>[^()]*)\)\s*$"
_SAMPLE = re.compile(SAMPLE_RE.replace("(?<", "(?P<"), re.M)
_SAMPLING = re.compile(SAMPLING_RE.replace("(?<", "(?P<"), re.M)
SUPPORTED = (
    "tracepoint samples (`perf record -e SYSTEM:EVENT`) and sampling events with their "
    "period and callchain (`perf record -e cpu-clock [-g]`), in perf script's default fields"
)


def is_perf_script(head: str) -> bool:
    """Whether the first KBs of a text file are `perf script` samples."""
    found = _SAMPLE.search(head) or _SAMPLING.search(head)
    return found is not None and not re.search(r"^# tracer:", head, re.M)


def _matched(lines: pl.DataFrame, pattern: str, key: str) -> pl.DataFrame:
    """The lines matching a pattern, with its groups as columns."""
    parsed = lines.with_columns(pl.col("line").str.extract_groups(pattern).alias("m"))
    return parsed.unnest("m").filter(pl.col(key).is_not_null())


def _hex(col: str) -> pl.Expr:
    """A hexadecimal address column as UInt64."""
    return pl.col(col).str.to_integer(base=16, dtype=pl.UInt64, strict=False)


def _sampling(lines: pl.DataFrame, tracepoints: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    """Sampling-event headers with their callchains, and the line numbers of the frames."""
    heads = _matched(lines.filter(~pl.col("lineno").is_in(tracepoints["lineno"].implode())),
                     SAMPLING_RE, "period")  # fmt: skip
    if heads.is_empty():
        return heads, pl.Series("lineno", [], lines["lineno"].dtype)
    owner = lines.select(
        "lineno", "line",
        owner=pl.when(pl.col("lineno").is_in(heads["lineno"].implode())).then("lineno")
        .when(pl.col("line").is_null()).then(pl.lit(None, lines["lineno"].dtype)),
    ).with_columns(
        # a frame belongs to the last header before it, until the blank line ending the chain
        owner=pl.col("owner").forward_fill().over(pl.col("line").is_null().cum_sum())
    )  # fmt: skip
    in_chain = pl.col("owner").is_not_null() & (pl.col("owner") != pl.col("lineno"))
    frames = _matched(owner.filter(in_chain), FRAME_RE, "ip")
    chains = frames.group_by("owner").agg(
        callchain_ip=_hex("ip"), callchain_sym=pl.col("sym"), first_ip=pl.col("ip").first(),
        first_sym=pl.col("sym").first(), first_dso=pl.col("dso").first(),
    )  # fmt: skip
    heads = heads.join(chains, left_on="lineno", right_on="owner", how="left").with_columns(
        ip=pl.coalesce("ip", "first_ip"),
        sym=pl.coalesce("sym", "first_sym"),
        dso=pl.coalesce("dso", "first_dso"),
    )
    return heads, frames["lineno"]


def _events(samples: pl.DataFrame) -> pl.DataFrame:
    """The events table (ns timestamps from the digits perf printed)."""
    frac = pl.col("frac")
    scale = pl.lit(10, pl.Int64).pow(pl.lit(9) - frac.str.len_chars().cast(pl.Int64))
    ts = pl.col("sec").cast(pl.Int64) * 1_000_000_000 + frac.cast(pl.Int64) * scale
    tid = pl.coalesce(pl.col("tid"), pl.col("pid")).cast(pl.Int32)
    return samples.select(
        "lineno",
        ts=ts,
        cpu=pl.col("cpu").cast(pl.Int32),
        common_pid=tid,
        tgid=pl.when(pl.col("tid").is_not_null()).then(pl.col("pid").cast(pl.Int32)),
        comm=pl.col("comm").str.strip_chars(),
        event=pl.col("event"),
        system=pl.col("system"),
        flags=pl.lit(None, pl.UInt8),
        preempt_count=pl.lit(None, pl.UInt8),
        fields=pl.col("fields"),
    )


def _sampling_tables(heads: pl.DataFrame, events: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """One table per sampling event: period, leaf frame and callchain."""
    if heads.is_empty():
        return {}
    rows = events.select("lineno", "row", "ts", "cpu", "common_pid")
    joined = rows.join(heads, on="lineno").sort("row")
    cols = ["row", "ts", "cpu", "common_pid", pl.col("period").cast(pl.UInt64), _hex("ip"),
            "sym", "dso"]  # fmt: skip
    if joined["callchain_ip"].null_count() < joined.height:
        cols += ["callchain_ip", "callchain_sym"]
    return {
        str(name): group.select(cols)
        for (name,), group in joined.group_by("event", maintain_order=True)
    }


def read_perf_script(path: Path) -> Tables:
    """Parse `perf script` output of tracepoint and sampling events into Tables."""
    lines = read_lines(path, READER)
    tracepoints = _matched(lines, SAMPLE_RE, "event")
    heads, frame_lines = _sampling(lines, tracepoints)
    if tracepoints.is_empty() and heads.is_empty():
        raise TracekitError(f"{READER} reader: {path}: no samples; this reader reads {SUPPORTED}")
    known = pl.concat([tracepoints["lineno"], heads["lineno"], frame_lines])
    blank = pl.col("line").is_null() | pl.col("line").str.contains(r"^\s*(#|$)")
    other = lines.filter(~blank & ~pl.col("lineno").is_in(known.implode()))
    skipped = []
    if other.height:
        first = other.row(0, named=True)
        skipped.append(
            f"{other.height} line(s) that are not samples (first: line {first['lineno']}: "
            f"{first['line'][:60]!r})"
        )
    both = [f for f in (tracepoints, heads.with_columns(system=None, fields=None)) if f.height]
    events = _events(pl.concat(both, how="diagonal_relaxed").sort("lineno"))
    if not events["ts"].is_sorted():  # perf sorts by time; keep `row` in time order
        events = events.sort("ts", "cpu", maintain_order=True)
    events = events.with_columns(row=pl.int_range(pl.len(), dtype=pl.Int64))
    meta = {
        "reader": READER, "format": "perf-script", "clock": "perf", "instance": "",
        "cpus": sorted(events["cpu"].drop_nulls().unique().to_list()), "skipped": skipped,
        "unparsed_lines": other.height,
    }  # fmt: skip
    tables = typed_tables(events.filter(pl.col("fields").is_not_null()))
    tables.update(_sampling_tables(heads, events))
    events = events.drop("fields", "lineno").with_columns(
        pl.col("comm", "event", "system").cast(pl.Categorical)
    )
    return Tables(events, tables, pl.DataFrame(schema=LOST_SCHEMA), meta)
