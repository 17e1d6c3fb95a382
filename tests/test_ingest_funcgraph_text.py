"""function_graph text in every shape the kernel prints (tests/funcgraph_text.py), above
all the default one, without absolute timestamps: every line read, nothing skipped."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from funcgraph_text import Style, count, render, sample_tree

import tracekit
from tracekit.cli import main

STYLES = {
    "default": Style(),
    "args-retval": Style(args=True, retval="new"),
    "retval-6.5": Style(retval="old"),
    "tail-proc": Style(tail=True, proc=True),
    "abstime-args-retval": Style(abstime=True, args=True, retval="new", proc=True),
}
CPUS = (0, 1)
TREES = 2 * len(CPUS)  # two tasks' trees per CPU


def _open(tmp: Path, style: Style) -> tracekit.Trace:  # type: ignore[name-defined]
    """The rendered text, written and opened."""
    path = tmp / "graph.txt"
    path.write_text(render(style, CPUS))
    return tracekit.open(path, use_cache=False)


@pytest.mark.parametrize("name", STYLES)
def test_every_line_is_read(tmp_path: Path, name: str) -> None:
    """As many entries and exits as calls, none skipped, names without the module."""
    trace = _open(tmp_path, STYLES[name])
    calls, _ = count(sample_tree())
    assert trace.meta["unparsed_lines"] == 0 and trace.meta["skipped"] == []
    entries, exits = trace.event("funcgraph_entry"), trace.event("funcgraph_exit")
    assert entries.height == exits.height == calls * TREES
    assert "kvm_vcpu_ioctl" in entries["func_sym"].to_list()
    assert entries["depth"].max() == 2


@pytest.mark.parametrize("name", STYLES)
def test_durations_as_printed(tmp_path: Path, name: str) -> None:
    """Durations to the ns; 10 s and over (no decimals in the text) to the µs."""
    exits = _open(tmp_path, STYLES[name]).event("funcgraph_exit")
    got = dict(zip(exits["func_sym"].to_list(), exits["duration_ns"].to_list(), strict=False))
    top = exits.filter(pl.col("depth") == 0)["duration_ns"].unique().to_list()
    assert got["kmem_cache_alloc"] == 250 and got["path_openat"] == 999_999
    assert top == [12_345_678_000]


def test_args_and_retval_columns(tmp_path: Path) -> None:
    """funcgraph-args and funcgraph-retval values are kept as printed."""
    trace = _open(tmp_path, STYLES["args-retval"])
    entries, exits = trace.event("funcgraph_entry"), trace.event("funcgraph_exit")
    first = entries.row(0, named=True)
    assert first["func_sym"] == "do_sys_openat2" and first["args"].startswith("dfd=-100, ")
    assert entries.filter(func_sym="mutex_lock")["args"].to_list() == [None] * TREES
    rets = dict(zip(exits["func_sym"].to_list(), exits["retval"].to_list(), strict=False))
    assert rets["do_sys_openat2"] == "0x3" and rets["path_openat"] == "-2"
    old = _open(tmp_path, STYLES["retval-6.5"]).event("funcgraph_exit")
    assert old["retval"].to_list() == exits["retval"].to_list()
    assert "args" not in _open(tmp_path, STYLES["default"]).event("funcgraph_entry").columns


def test_task_from_the_switch_banner(tmp_path: Path) -> None:
    """Without funcgraph-proc, lines after `cat-1234 => kworker/0:1-56` are pid 56."""
    ev = _open(tmp_path, STYLES["default"]).events
    cpu0 = ev.filter(cpu=0)
    assert cpu0["common_pid"].null_count() == cpu0.height // 2  # before CPU 0's first banner
    assert cpu0["common_pid"].drop_nulls().unique().to_list() == [56]
    assert cpu0["comm"].drop_nulls().unique().cast(pl.String).to_list() == ["kworker/0:1"]
    proc = _open(tmp_path, STYLES["tail-proc"]).events
    assert proc["common_pid"].null_count() == 0 and set(proc["common_pid"].to_list()) == {1234, 56}


def test_times_with_abstime_and_none_without(tmp_path: Path) -> None:
    """funcgraph-abstime gives ns times; without it ts is null, not made up."""
    timed = _open(tmp_path, STYLES["abstime-args-retval"]).events
    assert timed["ts"].null_count() == 0 and timed["ts"].min() == 5_000_000_000
    assert _open(tmp_path, STYLES["default"]).events["ts"].null_count() == (
        2 * count(sample_tree())[0] * TREES
    )


@pytest.mark.parametrize("name", ["default", "args-retval"])
def test_ingest_summary_without_timestamps(tmp_path: Path, name: str) -> None:
    """`tracekit ingest` of the default output says it has no times (it crashed in _span)."""
    path = tmp_path / "graph.txt"
    path.write_text(render(STYLES[name], CPUS))
    res = CliRunner().invoke(main, ["ingest", "--no-cache", str(path)])
    assert res.exit_code == 0, res.output
    assert "without timestamps" in res.output and "funcgraph_entry" in res.output
