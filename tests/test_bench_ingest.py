"""benchmarks/ingest.py's quick mode as a smoke test: it runs, and what it generates reads
back as generated (no time is asserted: speed is the benchmark's to measure).

Only the generated function_graph shape runs here (the recorded ones need a workload and
a tracefs instance): it needs this machine's tracefs formats, kallsyms addresses (root)
and trace-cmd for the reference.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import polars as pl
import pytest
from scripts_loader import load_benchmark

import tracekit

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "ingest.py"

needs_tracefs = pytest.mark.skipif(
    os.geteuid() != 0
    or not Path("/sys/kernel/tracing/events/ftrace/funcgraph_entry/format").exists()
    or shutil.which("trace-cmd") is None,
    reason="needs root, tracefs with the funcgraph formats and trace-cmd",
)


@needs_tracefs
def test_quick_funcgraph_shape_runs_and_reads_back(tmp_path: Path) -> None:
    env = dict(os.environ, TRACEKIT_CACHE=str(tmp_path))
    argv = [sys.executable, str(BENCH), "--quick", "--shape", "funcgraph"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("funcgraph"))
    assert row.split()[2] == "40000"  # events tracekit read: 20 000 per CPU, as generated
    trace = tracekit.open(tmp_path / "bench" / "quick" / "funcgraph.dat", use_cache=False)
    entry, exit_ = trace.event("funcgraph_entry"), trace.event("funcgraph_exit")
    assert entry.height + exit_.height == 40000
    assert exit_.filter(pl.col("rettime") < pl.col("calltime")).height == 0
    assert entry["depth"].max() < 12 and entry["func_sym"].null_count() == 0
    report = (tmp_path / "bench" / "quick" / "funcgraph.report.txt").read_text()
    assert "funcgraph_entry" in report and "funcgraph_exit" in report


def _bench_module() -> ModuleType:
    """benchmarks/ingest.py imported as a module (it is a script, not a package)."""
    return load_benchmark("ingest")


def test_start_up_bound_shape_is_marked_in_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench_module()
    figures = [(1.0, 1.0, 100 << 20, "")]
    for shape in ("large", "large-1g"):
        bench.print_row(bench.Row(shape, "this", 10, 10, 50 << 20, figures, figures))  # type: ignore[attr-defined]
    small, big = capsys.readouterr().out.splitlines()
    assert small.split()[0] == "large*"  # the 1 s trace-cmd shape: ceiling below 5x
    assert big.split()[0] == "large-1g"  # the per-byte shape the targets apply to


def test_peak_spread_is_printed_beside_its_median(capsys: pytest.CaptureFixture[str]) -> None:
    """The peak over the data shows its min-max: the peak moves from run to run."""
    bench = _bench_module()
    tc = [(4.0, 4.0, 1, "")] * 3
    tk = [(1.0, 1.0, peak * 10**6, "") for peak in (100, 150, 120)]
    bench.print_row(bench.Row("v6", "this", 10, 10, 50 * 10**6, tc, tk))  # type: ignore[attr-defined]
    cells = capsys.readouterr().out.split()
    assert cells[-3:] == ["120", "2.40", "(2.00-3.00)"]
