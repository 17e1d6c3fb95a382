"""function_graph text (the tracefs `trace` file under the function_graph tracer) -> tables.

Each line is `[TIME |] CPU) [TASK-PID |] [DURATION] |  INDENT BODY`, the optional parts
depending on the funcgraph-abstime, funcgraph-proc and funcgraph-duration options. The
body is a call entry `f() {`, a leaf `f();` (entry and exit in one line), an exit `}`
(`} /* f */` with funcgraph-tail) or a trace event printed as a comment `/* e: ... */`.
They become the binary reader's funcgraph_entry / funcgraph_exit tables, with the name in
`func_sym` (the address `func` is not printed: null) and the nesting in `depth` (INDENT is
two spaces per level). Exits carry `duration_ns` as printed (to the ns below 10 ms: the
kernel keeps seven digits, so longer durations lose decimals); a leaf's exit
row is stamped at its entry time plus that duration (the text has no exit time for it).
Without funcgraph-abstime (the default) ts is null; without funcgraph-proc (the default)
pid and comm come from the last context-switch banner on the line's CPU. funcgraph-args
and funcgraph-retval values become `args` (entries) and `retval` (exits) as printed.
Comment events go through the key=value path.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest.tables import Tables

READER = "function_graph text"
GRAPH_RE = (
    r"^\s*(?:(?<sec>\d{1,9})\.(?<frac>\d{1,9})\s+\|\s+)?(?<cpu>\d{1,9})\)\s+"
    r"(?:(?<comm>\S.*?)-(?<pid>\d{1,9})\s+\|\s)?\s*(?<over>[+!#*@$])?\s*"
    r"(?:(?<dur>\d{1,14}(?:\.\d{1,3})?)\s+us\s+)?\|  (?<body>.*)$"
)  # 7 digits of µs or more print without decimals, hence the optional fraction; longer
# numbers than Int64/Int32 hold are damage: such a line is not read, and counted as such
# `%ps` names a module's function `name [module]`; funcgraph-args prints `f(a=1, b=0x2)`,
# funcgraph-retaddr ` /* <-caller+0x1c/0x40 */`, funcgraph-retval ` /* ret=0x0 */` (6.5 to
# 6.14: ` /* = 0x0 */`, exits `} /* f = 0x0 */`), each after the entry, leaf or exit.
_NAME = r"(?<func>[\w.$]+)(?: \[[\w-]+\])?"
_RET = r"(?: <-(?<retaddr>\S+))?(?: (?:ret=|= )(?<ret>\S+))?"
ENTRY_RE = rf"^{_NAME}\((?<args>.*)\) \{{(?: /\* <-\S+ \*/)?$"
LEAF_RE = rf"^{_NAME}\((?<args>.*)\);(?: /\*{_RET} \*/)?$"
EXIT_RE = rf"^\}}(?: /\* {_NAME}{_RET} \*/)?$"
COMMENT_RE = r"^/\* (?<event>[\w:-]+): ?(?<fields>.*) \*/$"
# Decoration, not events: the context-switch banner between tasks (`0) ls-1 => cat-2`
# between dashed lines) and the interrupt arrows around an irq entry function's line.
BANNER_RE = r"^\s*(-{10,}|\d+\)\s+.*=>.*)\s*$|\|\s+(==========>|<==========) \|$"


def is_graph_text(lines: pl.DataFrame) -> bool:
    """Whether a text trace is function_graph output (its header, or its line shape)."""
    head = lines.head(50)["line"].drop_nulls()
    return bool(head.str.contains(r"^# tracer: function_graph").any())


SWITCH_RE = r"^\s*(?<cpu>\d{1,9})\)\s+\S.*?-\d+\s+=>\s+(?<comm>\S.*?)-(?<pid>\d{1,9})\s*$"


def _with_switch_pids(parsed: pl.DataFrame) -> pl.DataFrame:
    """Without funcgraph-proc, each line's task from the last context-switch banner on its
    CPU (`0) ls-1 => cat-2`); null before a CPU's first banner."""
    sw = pl.col("line").str.extract_groups(SWITCH_RE)
    parsed = parsed.with_columns(sw.alias("sw")).with_columns(
        cpu=pl.coalesce("cpu", pl.col("sw").struct.field("cpu"))
    )
    task = [
        pl.col("sw").struct.field(k).forward_fill().over("cpu", order_by="lineno").alias(f"sw_{k}")
        for k in ("pid", "comm")
    ]  # fmt: skip
    return (
        parsed.with_columns(task)
        .with_columns(pid=pl.coalesce("pid", "sw_pid"), comm=pl.coalesce("comm", "sw_comm"))
        .drop("sw", "sw_pid", "sw_comm")
    )


def _parsed(lines: pl.DataFrame) -> pl.DataFrame:
    """Graph lines with their parts, the body's kind, name and indentation."""
    body = pl.col("body")
    stripped = body.str.strip_chars_start(" ")
    parsed = _with_switch_pids(
        lines.with_columns(pl.col("line").str.extract_groups(GRAPH_RE).alias("m")).unnest("m")
    )
    return (
        parsed.filter(body.is_not_null())
        .with_columns(
            depth=((body.str.len_chars() - stripped.str.len_chars()) // 2).cast(pl.Int32),
            entry_m=stripped.str.extract_groups(ENTRY_RE),
            leaf_m=stripped.str.extract_groups(LEAF_RE),
            exit_m=stripped.str.extract_groups(EXIT_RE),
            exit_=stripped.str.contains(EXIT_RE),
            comment=stripped.str.extract_groups(COMMENT_RE),
        )
        .with_columns(
            entry=pl.col("entry_m").struct.field("func"),
            leaf=pl.col("leaf_m").struct.field("func"),
            tail=pl.col("exit_m").struct.field("func"),
            args=pl.coalesce(
                pl.col("entry_m").struct.field("args"), pl.col("leaf_m").struct.field("args")
            ),
            retval=pl.coalesce(
                pl.col("leaf_m").struct.field("ret"), pl.col("exit_m").struct.field("ret")
            ),
        )
    )


def _common(frame: pl.DataFrame) -> list[pl.Expr]:
    """ts (ns from the printed seconds), cpu, pid, comm of each line."""
    frac = pl.col("frac")
    scale = pl.lit(10, pl.Int64).pow(pl.lit(9) - frac.str.len_chars().cast(pl.Int64))
    ts = pl.col("sec").cast(pl.Int64) * 1_000_000_000 + frac.cast(pl.Int64) * scale
    return [
        ts.alias("ts"),
        pl.col("cpu").cast(pl.Int32),
        pl.col("pid").cast(pl.Int32),
        pl.col("comm").str.strip_chars(),
    ]


def _rows(parsed: pl.DataFrame) -> pl.DataFrame:
    """One row per event: entries and leaves give an entry, exits and leaves an exit."""
    # `us.frac`: the kernel keeps 7 digits in all, so long durations lose decimals.
    us = pl.col("dur").str.extract(r"^(\d+)", 1)
    frac = (
        pl.col("dur")
        .str.extract(r"\.(\d+)$", 1)
        .fill_null(pl.when(us.is_not_null()).then(pl.lit("0")))
    )
    scale = pl.lit(10, pl.Int64).pow(pl.lit(3) - frac.str.len_chars().cast(pl.Int64))
    duration = (us.cast(pl.Int64) * 1000 + frac.cast(pl.Int64) * scale).alias("duration_ns")
    base = parsed.select("lineno", *_common(parsed), "depth", duration, "entry", "leaf",
                         "exit_", "tail", "comment", "retval",
                         pl.col("args").replace("", None))  # fmt: skip
    entries = base.filter(pl.col("entry").is_not_null() | pl.col("leaf").is_not_null())
    entries = entries.select(
        "lineno", "ts", "cpu", "pid", "comm", "depth", sub=pl.lit(0),
        event=pl.lit("funcgraph_entry"), func_sym=pl.coalesce("entry", "leaf"),
        duration_ns=pl.lit(None, pl.Int64), fields=pl.lit(None, pl.String), args="args",
        retval=pl.lit(None, pl.String),
    )  # fmt: skip
    exits = base.filter(pl.col("exit_") | pl.col("leaf").is_not_null()).select(
        "lineno", pl.col("ts") + pl.when(pl.col("leaf").is_not_null()).then("duration_ns")
        .otherwise(0), "cpu", "pid", "comm", "depth", sub=pl.lit(1),
        event=pl.lit("funcgraph_exit"), func_sym=pl.coalesce("tail", "leaf"),
        duration_ns="duration_ns", fields=pl.lit(None, pl.String),
        args=pl.lit(None, pl.String), retval="retval",
    )  # fmt: skip
    comments = base.filter(pl.col("comment").struct.field("event").is_not_null()).select(
        "lineno", "ts", "cpu", "pid", "comm", pl.lit(None, pl.Int32).alias("depth"),
        sub=pl.lit(0), event=pl.col("comment").struct.field("event"),
        func_sym=pl.lit(None, pl.String), duration_ns=pl.lit(None, pl.Int64),
        fields=pl.col("comment").struct.field("fields"), args=pl.lit(None, pl.String),
        retval=pl.lit(None, pl.String),
    )  # fmt: skip
    rows = pl.concat([entries, exits, comments]).sort("lineno", "sub")
    return rows.with_columns(row=pl.int_range(pl.len(), dtype=pl.Int64))


def _graph_table(rows: pl.DataFrame, event: str) -> pl.DataFrame:
    """The funcgraph_entry or funcgraph_exit table, shaped like the binary one."""
    cols = ["row", "ts", "cpu", pl.col("pid").alias("common_pid"),
            pl.lit(None, pl.UInt64).alias("func"), pl.col("func_sym").cast(pl.Categorical),
            "depth"]  # fmt: skip
    if event == "funcgraph_exit":
        cols.append("duration_ns")
    rows = rows.filter(pl.col("event") == event)
    # funcgraph-args / funcgraph-retval as printed, when the text has them.
    extra = "args" if event == "funcgraph_entry" else "retval"
    if rows[extra].null_count() < rows.height:
        cols.append(extra)
    return rows.select(cols)


def read_graph_text(
    lines: pl.DataFrame, path: Path, lost: pl.DataFrame, marks: pl.Series
) -> Tables:
    """Parse function_graph text (its lines, from text.read_lines) into Tables.

    `lost` holds the rows of the `[LOST n EVENTS]` markers found at lines `marks`.
    """
    from tracekit.ingest.text import skipped_lines, typed_tables

    parsed = _parsed(lines)
    if parsed.is_empty():
        raise TracekitError(f"{READER} reader: {path}: no function_graph lines found")
    known = parsed.filter(
        pl.col("entry").is_not_null() | pl.col("leaf").is_not_null() | pl.col("exit_")
        | pl.col("comment").struct.field("event").is_not_null()
    )["lineno"]  # fmt: skip
    blank = pl.col("line").is_null() | pl.col("line").str.contains(r"^\s*(#|$)")
    other = lines.filter(
        ~blank
        & ~pl.col("lineno").is_in(pl.concat([known, marks.cast(known.dtype)]).implode())
        & ~pl.col("line").str.contains(BANNER_RE)
    )
    rows = _rows(parsed)
    tables = {e: _graph_table(rows, e) for e in ("funcgraph_entry", "funcgraph_exit")}
    comments = rows.filter(pl.col("fields").is_not_null())
    if comments.height:
        tables.update(typed_tables(comments.rename({"pid": "common_pid"})))
    skipped = skipped_lines(other, "graph lines")
    meta = {
        "reader": READER, "format": "text", "clock": "", "instance": "", "skipped": skipped,
        "cpus": sorted(rows["cpu"].drop_nulls().unique().to_list()),
        "unparsed_lines": other.height,
    }  # fmt: skip
    events = rows.select(
        "row", "ts", "cpu", common_pid="pid", tgid=pl.lit(None, pl.Int32), comm=pl.col("comm"),
        event=pl.col("event"), system=pl.when(pl.col("fields").is_null()).then(pl.lit("ftrace")),
        flags=pl.lit(None, pl.UInt8), preempt_count=pl.lit(None, pl.UInt8),
    ).with_columns(pl.col("comm", "event", "system").cast(pl.Categorical))  # fmt: skip
    return Tables(events, tables, lost, meta)
