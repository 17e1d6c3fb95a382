"""benchmarks/perfetto_export.py at a small size as a smoke test: the generated input reads
back as generated, the streamed export writes every run's events and says how its peak
compares with one run's (no time or memory is asserted: that is the benchmark's to
measure)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "perfetto_export.py"


def test_streamed_runs_export_every_event_and_compare_with_one(tmp_path: Path) -> None:
    env = dict(os.environ, TRACEKIT_CACHE=str(tmp_path))
    argv = [sys.executable, str(BENCH), "--events", "30000", "--runs", "3"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    exported = re.findall(r"events exported : ([\d,]+) \(7 types, (\d) trace", done.stdout)
    assert exported == [("30,000", "3"), ("10,000", "1")]  # the three runs, then the 1x
    assert re.search(r"streamed peak   : \d+ MB, [+-]\d+% over the 1x peak", done.stdout)
    runs = sorted((tmp_path / "bench" / "inputs" / "chained-30000-4cpu-3runs").iterdir())
    assert [r.name for r in runs] == ["run0", "run1", "run2"]
    sys.path.insert(0, str(BENCH.parent))
    from perfetto_export import load

    first, second = (load(r).events for r in runs[:2])
    assert first.height == second.height == 10_000
    assert first["ts"].max() < second["ts"].min()  # one run after another in time
