"""function_graph and kprobe text agree with the binary reader on the same events.

Fixtures from one boot of the emulated host (tests/fixtures/ingest/vhost/README.md): the
kernel's own `trace` text of each session, and the same events drained in binary by
tracekit's RawCapture. The text carries the kernel's names (%pS); the binary names come
from the capture's kallsyms copy through the `_sym` columns.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import tracekit

VH = Path(__file__).parent / "fixtures" / "ingest" / "vhost"


def _pair(name: str) -> tuple[tracekit.Trace, tracekit.Trace]:  # type: ignore[name-defined]
    """(text, binary) readings of one session."""
    text = tracekit.open(VH / f"{name}.trace.txt", use_cache=False)
    binary = tracekit.open(VH / f"{name}.rawcap", use_cache=False)
    return text, binary


def _us(ts: pl.Expr) -> pl.Expr:
    """ns truncated to whole microseconds, as function_graph's abstime column prints them."""
    return ts // 1000 * 1000


def _us_rounded(ts: pl.Expr) -> pl.Expr:
    """ns rounded to the nearest microsecond, as tracefs prints an event's time."""
    return (ts + 500) // 1000 * 1000


def test_graph_entries_match() -> None:
    """Every call the text shows is a binary funcgraph_entry: time, CPU, task, depth, name."""
    text, binary = _pair("graph")
    assert text.meta["reader"] == "function_graph text" and text.meta["unparsed_lines"] == 0
    cols = ["ts", "cpu", "common_pid", "depth", "func_sym"]
    ours = text.event("funcgraph_entry").select(cols)
    theirs = binary.event("funcgraph_entry").select(_us(pl.col("ts")), *cols[1:])
    assert ours.height > 20 and ours.schema == theirs.schema
    assert ours.equals(theirs)
    assert ours["depth"].max() == 2  # max_graph_depth 3: depths 0..2


def test_graph_exits_match() -> None:
    """Exits: name, depth and the printed duration equal rettime - calltime; `}` lines'
    times too (a leaf line prints only its entry time)."""
    text, binary = _pair("graph")
    ours = text.event("funcgraph_exit")
    theirs = binary.event("funcgraph_exit").with_columns(
        duration_ns=(pl.col("rettime") - pl.col("calltime")).cast(pl.Int64)
    )
    cols = ["cpu", "common_pid", "depth", "func_sym", "duration_ns"]
    assert ours.select(cols).equals(theirs.select(cols))
    closing = text.events.filter(pl.col("event") == "funcgraph_exit")["row"]
    leaf_rows = set(closing) & {r + 1 for r in text.event("funcgraph_entry")["row"]}
    braces = ~ours["row"].is_in(list(leaf_rows))
    assert braces.sum() > 5
    assert ours.filter(braces)["ts"].equals(theirs.filter(braces).select(_us(pl.col("ts")))["ts"])


def test_kprobe_text_matches_binary() -> None:
    """kprobe and kretprobe lines: same events, same fetched values, same probe sites."""
    text, binary = _pair("kprobe")
    for event, cols in (
        ("openat", ["cpu", "common_pid", "dfd", "__probe_ip_sym"]),
        ("openat_ret", ["cpu", "common_pid", "ret", "__probe_func_sym", "__probe_ret_ip_sym"]),
    ):
        ours = text.event(event)
        theirs = binary.event(event).cast({c: pl.Int64 for c in ("dfd", "ret") if c in cols})
        assert ours.height > 3
        assert ours.select(cols).equals(theirs.select(cols)), event
        assert ours["ts"].equals(theirs.select(_us_rounded(pl.col("ts")))["ts"])
    assert set(text.event("openat")["__probe_ip_sym"]) == {"do_sys_openat2"}


@pytest.mark.parametrize("name", ["graph", "kprobe"])
def test_binary_names_are_the_kernels(name: str) -> None:
    """The capture's kallsyms names every address the kernel named in its own text."""
    _, binary = _pair(name)
    for event in binary.event_names:
        for col in binary.event(event).columns:
            if col.endswith("_sym") and event.startswith(("funcgraph", "openat")):
                assert binary.event(event)[col].null_count() == 0, (event, col)
