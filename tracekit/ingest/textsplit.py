"""ftrace text lines -> event columns, in one streaming polars pass over the file.

An event line is `[INST: ]COMM-PID [(TGID)] [CPU] [IRQ] SEC.FRAC: EVENT: FIELDS`. The
part before the timestamp's dot (instance, task, CPU, irq-info column, whole seconds)
takes few distinct values in a trace (a task keeps its CPU for long and seconds change
slowly), so each line only cuts that prefix out as a Categorical and the per-line work
is a handful of byte searches and slices; the prefix regex then runs once per distinct
prefix, not once per line. Offsets come from `str.find` (bytes) and are used with the
`bin` slices (bytes too), so lines with UTF-8 comm names take the same path.

A line the cheap cuts do not fit (an unusual timestamp, a comm that fools the searches)
keeps its text and goes through the full regex (`EVENT_RE`), so the result never depends
on which path a line took.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

# The part before the timestamp's dot; comm is greedy like the kernel's `%s-%d`
# (a comm may itself contain `-digits`).
PREFIX_RE = (
    r"^(?:(?<inst>[\w.-]+):\s)?\s*(?<comm>.*)-(?<pid>\d+)(?:\s+\(\s*(?<tgid>-?\d+)\))?"
    r"\s+\[(?<cpu>\d+)\]\s+(?:(?<irq>\S+)\s+)?(?<sec>\d+)$"
)
EVENT_RE = (
    r"^(?:(?<inst>[\w.-]+):\s)?\s*(?<comm>.*)-(?<pid>\d+)(?:\s+\(\s*(?<tgid>-?\d+)\))?"
    r"\s+\[(?<cpu>\d+)\]\s+(?:(?<irq>\S+)\s+)?"
    r"(?<sec>\d+)\.(?<frac>\d+):\s+(?<event>[\w-]+):(?:\s+(?<fields>.*)|$)"
)
EVENT_NAME_RE = r"^[\w-]+$"
COLON, DOT, ZERO, NINE = (ord(c) for c in ":.09")

# The columns of one event line, from either path.
SPLIT_SCHEMA = {
    "lineno": pl.UInt32, "comm": pl.Categorical, "pid": pl.Int32, "tgid": pl.Int32,
    "cpu": pl.Int32, "preempt_count": pl.UInt8, "ts": pl.Int64, "event": pl.Categorical,
    "fields": pl.String,
}  # fmt: skip


def scan_lines(path: Path) -> pl.LazyFrame:
    """The file's lines (null for blank ones) with 1-based line numbers, lazily.

    polars' CSV reader with a separator that does not occur splits lines in Rust; invalid
    UTF-8 is replaced, not dropped.
    """
    return pl.scan_csv(
        path, has_header=False, separator="\x1f", quote_char=None, new_columns=["line"],
        schema={"line": pl.String}, encoding="utf8-lossy", truncate_ragged_lines=True,
    ).with_row_index("lineno", 1)  # fmt: skip


def _stamp_by_digit(lines: pl.LazyFrame) -> pl.LazyFrame:
    """`dot` and `end` from the first `digit: ` in the line (null: not a timestamp there).

    A plain search, twice as fast as the pattern `_stamp_by_dot` needs. It is the
    timestamp's colon unless something before it (an instance name, a comm) ends in a
    digit and a colon; such lines take `_stamp_by_dot`. Where it fits (a dot, then 6 or
    9 digits up to it), it is also the first `.digits: `: both find the same colon.
    """
    raw, col = pl.col("line").cast(pl.Binary), pl.col
    end = col("end")
    before = {n: raw.bin.get(end - n, null_on_oob=True) for n in (7, 10)}
    digit_after = {n: raw.bin.get(end - n + 1, null_on_oob=True).is_between(ZERO, NINE)
                   for n in (7, 10)}  # fmt: skip
    dot = (
        pl.when((end >= 7) & (before[7] == DOT) & digit_after[7]).then(end - 7)
        .when((end >= 10) & (before[10] == DOT) & digit_after[10]).then(end - 10)
    )  # fmt: skip
    return (
        lines.with_columns(end=pl.col("line").str.find(r"[0-9]: ").cast(pl.Int64) + 1)
        .with_columns(dot=dot.otherwise(None))
        .with_columns(end=pl.when(col("dot").is_not_null()).then(end))
    )


def _stamp_by_dot(lines: pl.LazyFrame) -> pl.LazyFrame:
    """`dot` and `end` from the first `.digits: ` in the line (null: no timestamp)."""
    raw, dot = pl.col("line").cast(pl.Binary), pl.col("dot")
    after = {n: raw.bin.get(dot + n, null_on_oob=True) for n in (7, 10)}
    end = pl.when(after[7] == COLON).then(dot + 7).when(after[10] == COLON).then(dot + 10)
    # [0-9], not \d: ASCII digits only, a smaller automaton and a faster search.
    found = lines.with_columns(dot=pl.col("line").str.find(r"\.[0-9]+: ").cast(pl.Int64))
    return found.with_columns(end=end.otherwise(None))


def _cut(stamped: pl.LazyFrame) -> pl.LazyFrame:
    """Prefix, fraction, event and the text after it, by byte offsets (null: no fit).

    `dot` is the timestamp's dot, `end` the colon after its 6 (µs) or 9 (ns,
    `trace-cmd report -t`) fraction digits, `colon` the event name's colon (`: `; an
    event at the end of its line takes the regex path).
    """
    raw, col = pl.col("line").cast(pl.Binary), pl.col
    dot = col("dot")
    return (
        stamped.with_columns(tail=raw.bin.slice(col("end") + 2))  # after `: `
        .with_columns(colon=col("tail").cast(pl.String).str.find(": ", literal=True))
        .with_columns(
            prefix=raw.bin.head(dot).cast(pl.String).cast(pl.Categorical),
            frac=raw.bin.slice(dot + 1, col("end") - dot - 1).cast(pl.String),
            event=col("tail").bin.head(col("colon")).cast(pl.String).cast(pl.Categorical),
        )
    )


def _columns(stamped: pl.LazyFrame) -> pl.DataFrame:
    """Event columns of every line and whether it fits (else its text is kept)."""
    col = pl.col
    micro = col("end") - col("dot") == 7  # 6 fraction digits: µs, else ns
    frac_ns = col("frac").str.to_integer(strict=False) * pl.when(micro).then(1000).otherwise(1)
    fits = (frac_ns.is_not_null() & col("event").is_not_null()).fill_null(False)
    fields = col("tail").bin.slice(col("colon") + 1).cast(pl.String).str.strip_chars_start()
    cut = _cut(stamped).select(
        "lineno", "prefix", "event", fits=fits, frac_ns=pl.when(fits).then(frac_ns),
        fields=pl.when(fits).then(fields), line=pl.when(~fits).then(col("line")),
    )  # fmt: skip
    return cut.collect(engine="streaming")


def split_events(lines: pl.LazyFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(event columns of the lines the cheap cuts fit, the other lines with their text).

    The timestamp is found by the fast search first, by the exact one in the lines the
    fast one missed. The first frame still has the raw `prefix` (see `decode_prefixes`).
    """
    frame = _columns(_stamp_by_digit(lines))
    if frame["fits"].all():  # the usual case: no copy of millions of rows by a filter
        return frame.drop("fits", "line"), frame.clear().select("lineno", "line")
    missed = frame.filter(~pl.col("fits")).select("lineno", "line")
    again = _columns(_stamp_by_dot(missed.lazy()))
    fit = pl.concat([frame.filter("fits"), again.filter("fits")]).sort("lineno")
    rest = again.filter(~pl.col("fits")).select("lineno", "line")
    return fit.drop("fits", "line"), rest


def _frac_ns(frac: pl.Expr) -> pl.Expr:
    """ns from a timestamp's fraction digits (6 for µs, 9 for ns)."""
    scale = pl.lit(10, pl.Int64).pow(pl.lit(9) - frac.str.len_bytes().cast(pl.Int64))
    return frac.str.to_integer(strict=False) * scale


def _preempt(irq: pl.Expr) -> pl.Expr:
    """The preempt depth: the irq-info column's 4th character ('.' means 0)."""
    depth = irq.str.slice(3, 1).str.replace(r"^\.$", "0")
    return depth.str.to_integer(base=16, strict=False).cast(pl.UInt8)


def _prefix_parts(prefixes: pl.Series) -> pl.DataFrame:
    """Task, CPU, preempt depth and whole seconds of each distinct prefix (null: no match)."""
    col = pl.col
    parts = prefixes.cast(pl.String).str.extract_groups(PREFIX_RE).struct.unnest()
    return parts.select(
        comm=col("comm").str.strip_chars().cast(pl.Categorical),
        pid=col("pid").cast(pl.Int32, strict=False),
        tgid=col("tgid").cast(pl.Int32, strict=False),
        cpu=col("cpu").cast(pl.Int32, strict=False),
        preempt_count=_preempt(col("irq")),
        sec_ns=col("sec").cast(pl.Int64, strict=False) * 1_000_000_000,
    )


def _category_index(values: pl.Series, distinct: pl.Series) -> pl.Series:
    """Each value's position in `distinct` (a Categorical's distinct values).

    Categorical codes are small integers, so a lookup table indexed by code beats a hash
    join several times over; codes grown large in a long session fall back to the join.
    """
    codes, known = values.to_physical(), distinct.to_physical()
    positions = pl.int_range(len(distinct), dtype=pl.UInt32, eager=True)
    top = int(known.max() or 0) + 1
    if top > 2 * len(values) + 65536:
        return codes.replace_strict(known, positions, default=None, return_dtype=pl.UInt32)
    table = pl.repeat(None, top, dtype=pl.UInt32, eager=True).scatter(known, positions)
    return table.gather(codes)


PREFIX_COLUMNS = ("comm", "pid", "tgid", "cpu", "preempt_count")


def decode_prefixes(fit: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    """Event columns of the fitting lines, and the line numbers whose prefix did not parse.

    PREFIX_RE runs on the distinct prefixes only; their Categorical codes index the result.
    """
    col = pl.col
    distinct = fit["prefix"].unique().drop_nulls()
    parts = _prefix_parts(distinct)
    at = _category_index(fit["prefix"], distinct)
    names = fit["event"].unique().drop_nulls()
    bad_names = names.filter(~names.cast(pl.String).str.contains(EVENT_NAME_RE))
    # One select: polars gathers the columns in parallel.
    events = fit.with_columns(at=at).select(
        "lineno", *(pl.lit(parts[c]).gather(col("at")) for c in PREFIX_COLUMNS),
        ts=pl.lit(parts["sec_ns"]).gather(col("at")) + col("frac_ns"), event="event",
        fields="fields",
    )  # fmt: skip
    ok = col("pid").is_not_null() & col("cpu").is_not_null() & col("ts").is_not_null()
    if len(bad_names):
        ok = ok & ~col("event").is_in(bad_names.implode())
    good = events.select(ok.all()).item()
    if good:
        return events, pl.Series("lineno", [], pl.UInt32)
    return events.filter(ok), events.filter(~ok)["lineno"]


def parse_slow(rest: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(event columns of the lines EVENT_RE matches, the lines it does not match)."""
    col = pl.col
    m = rest.with_columns(col("line").str.extract_groups(EVENT_RE).alias("m")).unnest("m")
    is_event = (
        col("pid").cast(pl.Int32, strict=False).is_not_null()
        & col("cpu").cast(pl.Int32, strict=False).is_not_null()
        & col("frac").str.to_integer(strict=False).is_not_null()
        & col("sec").cast(pl.Int64, strict=False).is_not_null()
        # ns in an Int64: at most 9 digits of seconds and of fraction, else not an event line
        & (col("frac").str.len_bytes() <= 9)
        & (col("sec").str.len_bytes() <= 9)
    ).fill_null(False)
    events = m.filter(is_event).select(
        "lineno",
        comm=col("comm").str.strip_chars().cast(pl.Categorical),
        pid=col("pid").cast(pl.Int32),
        tgid=col("tgid").cast(pl.Int32, strict=False),
        cpu=col("cpu").cast(pl.Int32),
        preempt_count=_preempt(col("irq")),
        ts=col("sec").cast(pl.Int64) * 1_000_000_000 + _frac_ns(col("frac")),
        event=col("event").cast(pl.Categorical),
        fields=col("fields").fill_null("").str.strip_chars_start(),
    )
    return events, m.filter(~is_event).select("lineno", "line")
