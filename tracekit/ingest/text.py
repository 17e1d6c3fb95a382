"""ftrace text -> the same tables as the binary path, parsed with vectorised polars regexes.

Reads the tracefs `trace` file (with or without the irq-info columns, with or without
the tgid column) and `trace-cmd report` output (with or without -t, with an instance
prefix, raw -R). Loss markers — tracefs `CPU:N [LOST n EVENTS]` and trace-cmd
`CPU:N [n EVENTS DROPPED]` / `CPU:N [EVENTS DROPPED]` — become lost-table rows.
Every line that is neither an event, a loss marker, a comment nor blank is counted and
reported (never dropped silently); with no event line at all it is an error.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest.funcgraph import is_graph_text, read_graph_text
from tracekit.ingest.tables import LOST_SCHEMA, Tables

READER = "ftrace text"
EVENT_RE = (
    r"^(?:(?<inst>[\w.-]+):\s)?\s*(?<comm>.*?)-(?<pid>\d+)\s+(?:\(\s*(?<tgid>[-\d]+)\)\s+)?"
    r"\[(?<cpu>\d+)\]\s+(?:(?<irq>[.a-zA-Z][.a-zA-Z0-9]{3,4})\s+)?"
    r"(?<sec>\d+)\.(?<frac>\d+):\s+(?<event>[\w:-]+):\s?(?<fields>.*)$"
)
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


TASK_RE = r"^(?<comm>.*)-(?<pid>\d+)(?:\s+\(\s*(?<tgid>-?\d+)\))?$"


def _split_fast(lines: pl.LazyFrame) -> pl.LazyFrame:
    """The EVENT_RE groups from cheap string operations, one stage at a time.

    Only for ASCII lines: `find` gives byte offsets and `slice` counts characters.
    """
    line, col = pl.col("line"), pl.col
    return (
        lines.with_columns(inst=line.str.extract(r"^([\w.-]+): ", 1))
        .with_columns(
            body=pl.when(col("inst").is_not_null())
            .then(line.str.slice(col("inst").str.len_bytes() + 2))
            .otherwise(line)
        )
        .with_columns(lb=col("body").str.find(r"\[\d+\]"))
        .with_columns(
            left=col("body").str.slice(0, col("lb")).str.strip_chars(),
            rest=col("body").str.slice(col("lb")),
        )
        .with_columns(rb=col("rest").str.find("]", literal=True))
        .with_columns(
            cpu=col("rest").str.slice(1, col("rb") - 1),
            parts=col("rest").str.slice(col("rb") + 1).str.splitn(": ", 3),
            task=col("left").str.extract_groups(TASK_RE),
        )
        .unnest("task")
        .with_columns(
            head=col("parts").struct.field("field_0").str.strip_chars().str.split(" "),
            event=col("parts").struct.field("field_1"),
            fields=col("parts").struct.field("field_2").str.strip_chars_start(),
        )
        .with_columns(
            ts=col("head").list.last().str.split_exact(".", 1),
            irq=pl.when(col("head").list.len() > 1).then(col("head").list.first()),
        )
        .with_columns(sec=col("ts").struct.field("field_0"), frac=col("ts").struct.field("field_1"))
    )


def _parse(lines: pl.DataFrame) -> pl.DataFrame:
    """Event columns for every line (null where a line is not an event)."""
    line = pl.col("line")
    ascii_ = (line.str.len_bytes() == line.str.len_chars()).fill_null(False)
    cols = ["lineno", "line", "comm", "pid", "tgid", "cpu", "irq", "sec", "frac", "event", "fields"]
    both = _split_fast(lines.lazy().filter(ascii_)).select(cols).collect()
    slow = lines.filter(~ascii_)
    if slow.height:  # non-ASCII lines (a comm in UTF-8, say): the full regex
        slow = slow.with_columns(line.str.extract_groups(EVENT_RE).alias("m")).unnest("m")
        both = pl.concat([both, slow.select(cols)]).sort("lineno")
    valid = (
        pl.col("pid").cast(pl.Int64, strict=False).is_not_null()
        & pl.col("cpu").cast(pl.Int64, strict=False).is_not_null()
        & pl.col("sec").cast(pl.Int64, strict=False).is_not_null()
        & pl.col("frac").cast(pl.Int64, strict=False).is_not_null()
        & pl.col("event").str.contains(r"^[\w:-]+$")
    ).fill_null(False)
    return both.with_columns(pl.when(valid).then(pl.col("event")).alias("event"))


def _events(parsed: pl.DataFrame) -> pl.DataFrame:
    """The events table from the matched event lines."""
    frac = pl.col("frac")
    scale = pl.lit(10, pl.Int64).pow(pl.lit(9) - frac.str.len_chars().cast(pl.Int64))
    ts = pl.col("sec").cast(pl.Int64) * 1_000_000_000 + frac.cast(pl.Int64) * scale
    irq = pl.col("irq")
    depth = irq.str.slice(3, 1).str.replace(r"^\.$", "0")  # '.' in the column means 0
    preempt = depth.str.to_integer(base=16, strict=False).cast(pl.UInt8)
    return parsed.select(
        row=pl.int_range(pl.len(), dtype=pl.Int64),
        ts=ts,
        cpu=pl.col("cpu").cast(pl.Int32),
        pid=pl.col("pid").cast(pl.Int32),
        tgid=pl.col("tgid").cast(pl.Int32, strict=False),
        comm=pl.col("comm").str.strip_chars(),
        event=pl.col("event"),
        system=pl.lit(None, pl.String),
        flags=pl.lit(None, pl.UInt8),
        preempt_count=preempt,
        irq_info=irq,
        fields=pl.col("fields"),
    )


def typed_tables(events: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """One table per event: key=value fields become columns (integers when all are)."""
    out: dict[str, pl.DataFrame] = {}
    for (name,), group in events.group_by("event", maintain_order=True):
        head = group.select("row", "ts", "cpu", common_pid="pid")
        keys = group["fields"].head(1).str.extract_all(KEY_RE).explode().drop_nulls()
        cols = []
        for key in dict.fromkeys(k.strip().rstrip("=") for k in keys.to_list()):
            raw = group["fields"].str.extract(rf"(?:^|\s){key}=(\S*)", 1).alias(key)
            as_int = raw.str.to_integer(strict=False)
            cols.append(as_int if as_int.null_count() == raw.null_count() else raw)
        taken = set(head.columns)
        cols = [c.alias(f"field_{c.name}") if c.name in taken else c for c in cols]
        out[str(name)] = head.with_columns(*_probe_site(group["fields"]), *cols,
                                           fields=group["fields"])  # fmt: skip
    return out


# A kprobe's `(sym+0xoff/0xsize)`, a kretprobe's `(caller+0xoff/0xsize <- func)`.
PROBE_SITE_RE = r"^\((?<at>[\w.$]+)\+0x[0-9a-f]+/0x[0-9a-f]+(?: <- (?<func>[\w.$]+))?\)"


def _probe_site(fields: pl.Series) -> list[pl.Series]:
    """The probe site kprobe lines start with, named like the binary reader's `_sym` columns.

    Only the symbol name of `%pS`'s `name+0xoff/0xsize` is kept, so a kprobe gives
    `__probe_ip_sym` = `do_sys_openat2`, a kretprobe `__probe_func_sym` (the probed
    function) and `__probe_ret_ip_sym` (its caller, `__arm64_sys_openat`).
    """
    site = fields.str.extract_groups(PROBE_SITE_RE)
    at = site.struct.field("at")
    if at.null_count():
        return []  # not a probe (or not every line of it is): nothing is guessed
    func = site.struct.field("func")
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


def read_text(path: Path, salvage: bool = False) -> Tables:
    """Parse a tracefs or trace-cmd report text file into Tables."""
    lines = read_lines(path)
    marks = lines.filter(pl.col("line").str.contains("CPU:", literal=True))
    marks = marks.with_columns(pl.col("line").str.extract_groups(LOST_RE).alias("m")).unnest("m")
    is_mark = pl.col("cpu").is_not_null()
    if is_graph_text(lines):
        found = marks.filter(is_mark)
        return read_graph_text(lines, path, _lost(found, path), found["lineno"])
    parsed = _parse(lines)
    is_event = pl.col("event").is_not_null()
    ev_lines = parsed.filter(is_event)
    if ev_lines.is_empty():
        raise TracekitError(
            f"{READER} reader: {path}: no event lines found (expected tracefs `trace` or "
            "`trace-cmd report` text, or a trace.dat / raw capture directory)"
        )
    events = _events(ev_lines)
    blank = pl.col("line").is_null() | pl.col("line").str.contains(r"^\s*(#|$|cpus=|version =)")
    mark_lines = marks.filter(is_mark)["lineno"]
    other = parsed.filter(~is_event & ~blank & ~pl.col("lineno").is_in(mark_lines.implode()))
    skipped = skipped_lines(other, "events")
    meta = {
        "reader": READER, "format": "text", "clock": "", "instance": "",
        "cpus": sorted(events["cpu"].unique().to_list()), "skipped": skipped,
        "unparsed_lines": other.height,
    }  # fmt: skip
    tables = typed_tables(events)
    events = events.drop("irq_info", "fields").with_columns(
        pl.col("comm", "event", "system").cast(pl.Categorical)
    )
    return Tables(events, tables, _lost(marks.filter(is_mark), path), meta)
