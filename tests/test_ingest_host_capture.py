"""The contract: a raw capture written by tracekit.host decodes with tracekit.ingest.

Needs root and tracefs (skipped otherwise); uses this machine's own tracefs through an
instance of its own, and leaves every setting as it found it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import polars as pl
from tracefs_recording import recording_instance

import tracekit
from tracekit.host.cleanup import CleanupStack
from tracekit.host.rawcapture import RawCapture

pytest_plugins = ["host_tracefs_support"]


def test_host_capture_decodes_with_every_marker(
    tmp_path: Path, unchanged: dict[str, object]
) -> None:
    """Markers written across a mid-run drain come back once each, in order, with the
    scheduler events around them and no reported loss."""
    capture_dir = tmp_path / "capture"
    markers = [f"tracekit-ingest-marker-{n:04d}" for n in range(400)]
    with CleanupStack() as stack:
        instance = recording_instance(
            stack, 1024, ["sched/sched_switch", "sched/sched_process_exec"]
        )
        capture = RawCapture(instance, capture_dir, kallsyms=False)
        capture.start()
        instance.start()
        for marker in markers[:200]:
            instance.write_marker(marker)
        subprocess.run(["true"], check=True)
        capture.drain()
        for marker in markers[200:]:
            instance.write_marker(marker)
        instance.stop()
        capture.finish()
    trace = tracekit.open(capture_dir, use_cache=False)
    assert trace.meta["reader"] == "raw capture" and trace.meta["clock"] == "boot"
    printed = trace.event("print").sort("row")["buf"].str.strip_chars_end("\n").to_list()
    assert [p for p in printed if p.startswith("tracekit-ingest-marker-")] == markers
    assert trace.events["ts"].is_sorted()
    execs = trace.event("sched_process_exec")["filename"].to_list()
    assert any(name.endswith("/true") for name in execs)
    assert trace.lost.is_empty(), trace.lost
    comm = trace.events.filter(pl.col("event") == "sched_process_exec")["comm"]
    assert comm.null_count() < comm.len()
