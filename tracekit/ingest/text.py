"""ftrace text -> the same tables as the binary path, parsed with vectorised polars.

Reads the tracefs `trace` file (with or without the irq-info columns, with or without
the tgid column) and `trace-cmd report` output (with or without -t, with an instance
prefix, raw -R). Loss markers — tracefs `CPU:N [LOST n EVENTS]` and trace-cmd
`CPU:N [n EVENTS DROPPED]` / `CPU:N [EVENTS DROPPED]` — become lost-table rows.
Every line that is neither an event, a loss marker, a comment nor blank is counted and
reported (never dropped silently); with no event line at all it is an error.
Splitting lines into event columns is textsplit.py's job.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest.funcgraph import is_graph_text, read_graph_text
from tracekit.ingest.tables import LOST_SCHEMA, Tables
from tracekit.ingest.textsplit import (
    SPLIT_SCHEMA,
    decode_prefixes,
    parse_slow,
    scan_lines,
    split_events,
)

READER = "ftrace text"
LOST_RE = r"CPU:(?<cpu>\d+) \[(?:LOST (?<lost>\d+) EVENTS|(?:(?<dropped>\d+) )?EVENTS DROPPED)\]"
KEY_RE = r"(?:^|\s)(\w+)="


def read_lines(path: Path, reader: str = READER) -> pl.DataFrame:
    """The file's lines (null for blank ones) with their 1-based line numbers.

    polars' CSV reader with a separator that does not occur splits lines in Rust, many
    times faster than Python's splitlines; invalid UTF-8 is replaced, not dropped.
    """
    try:
        lines = pl.read_csv(
            path, has_header=False, separator="\x1f", quote_char=None, new_columns=["line"],
            schema={"line": pl.String}, encoding="utf8-lossy", truncate_ragged_lines=True,
        )  # fmt: skip
    except (OSError, pl.exceptions.PolarsError) as err:
        raise TracekitError(f"{reader} reader: {path}: {err}") from None
    return lines.with_row_index("lineno", 1)


def typed_tables(events: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """One table per event: key=value fields become columns (integers when all are)."""
    out: dict[str, pl.DataFrame] = {}
    used = events.select("row", "ts", "cpu", "common_pid", "event", "fields")  # gather no more
    for (name,), group in used.group_by("event", maintain_order=True):
        head = group.select("row", "ts", "cpu", "common_pid")
        printed = _print_columns(group["fields"]) if name == "print" else []
        if printed:  # a message's words are not fields
            out["print"] = head.with_columns(*printed, fields=group["fields"])
            continue
        found = group["fields"].head(1).str.extract_all(KEY_RE).explode().drop_nulls()
        keys = list(dict.fromkeys(k.strip().rstrip("=") for k in found.to_list()))
        cols = []
        for raw in _key_values(group["fields"], keys):
            as_int = raw.str.to_integer(strict=False)
            cols.append(as_int if as_int.null_count() == raw.null_count() else raw)
        taken = set(head.columns)
        cols = [c.alias(f"field_{c.name}") if c.name in taken else c for c in cols]
        out[str(name)] = head.with_columns(*_probe_site(group["fields"]), *cols,
                                           fields=group["fields"])  # fmt: skip
    return out


def _key_values(fields: pl.Series, keys: list[str]) -> list[pl.Series]:
    """Each key's value (the non-space text after `key=`) in every line, one Series per key.

    Most lines are exactly `k1=v1 k2=v2 ...` in the first line's order: one split on
    spaces gives every value by position, several times faster than a regex per key.
    Lines of another shape take the regex; both give the same values where both apply.
    """
    if not keys:
        return []
    if not _is_plain(fields[0], keys):  # events keep one shape: the regex for all lines
        return [_key_by_regex(fields, key) for key in keys]
    tokens = fields.str.split(" ")
    values = [tokens.list.get(i, null_on_oob=True) for i in range(len(keys))]
    plain = tokens.list.len() == len(keys)
    for key, value in zip(keys, values, strict=True):
        plain &= value.str.starts_with(f"{key}=")
    plain &= ~fields.str.contains(r"[^ \S]")  # other whitespace ends a value only in the regex
    plain = plain.fill_null(False)
    out = []
    for key, value in zip(keys, values, strict=True):
        by_position = value.str.slice(len(key) + 1)
        if not plain.all():
            by_position = by_position.zip_with(plain, _key_by_regex(fields, key))
        out.append(by_position.alias(key))
    return out


def _is_plain(line: str | None, keys: list[str]) -> bool:
    """Whether a line is exactly `k1=v1 k2=v2 ...` for these keys, in this order."""
    tokens = (line or "").split(" ")
    return (
        len(tokens) == len(keys)
        and all(t.startswith(f"{k}=") for t, k in zip(tokens, keys, strict=True))
        and not re.search(r"[^ \S]", line or "")
    )


def _key_by_regex(fields: pl.Series, key: str) -> pl.Series:
    """A key's value in lines of any shape: the non-space text after its first `key=`."""
    return fields.str.extract(rf"(?:^|\s){re.escape(key)}=(\S*)", 1).alias(key)


# ftrace's `print` event (trace markers, trace_printk) as `trace-cmd report` shows it:
# the caller's symbol, then the message (the binary reader's ip_sym and buf).
PRINT_RE = r"^(?<ip_sym>[\w.$]+): (?<buf>.*)$"


def _print_columns(fields: pl.Series) -> list[pl.Series]:
    """ip_sym and buf of `print` lines; none unless every line has that shape."""
    parts = fields.str.extract_groups(PRINT_RE)
    if parts.struct.field("buf").null_count():
        return []
    return [parts.struct.field("ip_sym").cast(pl.Categorical), parts.struct.field("buf")]


# A kprobe's `(sym+0xoff/0xsize)`, a kretprobe's `(caller+0xoff/0xsize <- func)`.
PROBE_SITE_RE = r"^\((?<at>[\w.$]+)\+0x[0-9a-f]+/0x[0-9a-f]+(?: <- (?<func>[\w.$]+))?\)"


def _probe_site(fields: pl.Series) -> list[pl.Series]:
    """The probe site kprobe lines start with, named like the binary reader's `_sym` columns.

    Only the symbol name of `%pS`'s `name+0xoff/0xsize` is kept, so a kprobe gives
    `__probe_ip_sym` = `do_sys_openat2`, a kretprobe `__probe_func_sym` (the probed
    function) and `__probe_ret_ip_sym` (its caller, `__arm64_sys_openat`).
    """
    if fields.head(1).str.extract_groups(PROBE_SITE_RE).struct.field("at").null_count():
        return []  # the first line is no probe: skip the regex over the others
    site = fields.str.extract_groups(PROBE_SITE_RE)
    at = site.struct.field("at")
    if at.null_count():
        return []  # not a probe (or not every line of it is): nothing is guessed
    func = site.struct.field("func").cast(pl.Categorical)  # as the binary `_sym` columns
    at = at.cast(pl.Categorical)
    if func.null_count() == 0:
        return [func.alias("__probe_func_sym"), at.alias("__probe_ret_ip_sym")]
    return [at.alias("__probe_ip_sym")]


def _lost(marks: pl.DataFrame, path: Path) -> pl.DataFrame:
    """Lost-table rows from LOST / DROPPED markers."""
    lost = pl.col("lost").cast(pl.Int64)
    return marks.select(
        cpu=pl.col("cpu").cast(pl.Int32),
        ts=pl.lit(None, pl.Int64),
        page=pl.lit(None, pl.Int64),
        count=pl.coalesce(lost, pl.col("dropped").cast(pl.Int64)),
        source=pl.lit("text_marker"),
        detail=pl.format(f"{path} line {{}}", pl.col("lineno")),
    ).cast(LOST_SCHEMA)  # type: ignore[arg-type]


def skipped_lines(other: pl.DataFrame, what: str) -> list[str]:
    """The summary line for text lines a reader did not parse: counted, first one shown."""
    if other.height == 0:
        return []
    first = other.row(0, named=True)
    return [
        f"{other.height} line(s) that are not {what} (first: line {first['lineno']}: "
        f"{first['line'][:60]!r})"
    ]


def _head(path: Path, n: int = 50) -> pl.DataFrame:
    """The first lines of the file (enough to recognise its kind)."""
    try:
        return scan_lines(path).head(n).collect()
    except (OSError, pl.exceptions.PolarsError) as err:
        raise TracekitError(f"{READER} reader: {path}: {err}") from None


def _reread(path: Path, linenos: pl.Series) -> pl.DataFrame:
    """The text of some lines again (those the cheap cuts misread: rare)."""
    wanted = scan_lines(path).filter(pl.col("lineno").is_in(linenos.implode()))
    return wanted.collect()


def _split(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(event columns of every event line in line order, the lines that are no event)."""
    try:
        fit, rest = split_events(scan_lines(path))
        fast, bad = decode_prefixes(fit)
        if bad.len():
            rest = pl.concat([rest, _reread(path, bad)]).sort("lineno")
    except (OSError, pl.exceptions.PolarsError) as err:
        raise TracekitError(f"{READER} reader: {path}: {err}") from None
    slow, other = parse_slow(rest)
    if slow.is_empty():
        return fast, other
    both = pl.concat([fast.cast(SPLIT_SCHEMA), slow.cast(SPLIT_SCHEMA)])  # type: ignore[arg-type]
    return both.sort("lineno"), other


def _events(split: pl.DataFrame) -> pl.DataFrame:
    """The events table (plus `fields`, for the typed tables) from the event columns."""
    return split.select(
        row=pl.int_range(pl.len(), dtype=pl.Int64),
        ts="ts", cpu="cpu", common_pid="pid", tgid="tgid", comm="comm", event="event",
        system=pl.lit(None, pl.Categorical), flags=pl.lit(None, pl.UInt8),
        preempt_count="preempt_count", fields="fields",
    )  # fmt: skip


def read_text(path: Path, salvage: bool = False) -> Tables:
    """Parse a tracefs or trace-cmd report text file into Tables."""
    if is_graph_text(_head(path)):
        lines = read_lines(path)
        marks = lines.filter(pl.col("line").str.contains("CPU:", literal=True))
        marks = marks.with_columns(pl.col("line").str.extract_groups(LOST_RE).alias("m"))
        found = marks.unnest("m").filter(pl.col("cpu").is_not_null())
        return read_graph_text(lines, path, _lost(found, path), found["lineno"])
    split, rest = _split(path)
    if split.is_empty():
        raise TracekitError(
            f"{READER} reader: {path}: no event lines found (expected tracefs `trace` or "
            "`trace-cmd report` text, function_graph text, `perf script` output of "
            "tracepoints or of sampling events in its default fields, or a trace.dat / raw "
            "capture directory)"
        )
    events = _events(split)
    del split
    marks = rest.filter(pl.col("line").str.contains("CPU:", literal=True))
    marks = marks.with_columns(pl.col("line").str.extract_groups(LOST_RE).alias("m")).unnest("m")
    marks = marks.filter(pl.col("cpu").is_not_null())
    blank = pl.col("line").is_null() | pl.col("line").str.contains(r"^\s*(#|$|cpus=|version =)")
    other = rest.filter(~blank & ~pl.col("lineno").is_in(marks["lineno"].implode()))
    meta = {
        "reader": READER, "format": "text", "clock": "", "instance": "",
        "cpus": sorted(events["cpu"].unique().to_list()),
        "skipped": skipped_lines(other, "events"), "unparsed_lines": other.height,
    }  # fmt: skip
    tables = typed_tables(events)
    return Tables(events.drop("fields"), tables, _lost(marks, path), meta)
