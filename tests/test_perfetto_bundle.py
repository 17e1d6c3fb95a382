"""Exporting a bundle: the traced run's trace plus the manifest's runs as a track."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tracekit
from tracekit.bundle import BundleWriter, Manifest, RunRecord
from tracekit.perfetto.protos import TracePacket
from tracekit.perfetto.system import Tasks, process_tree_packet
from tracekit.perfetto.writer import read_packets

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


def _bundle(root: Path, traced: int) -> Path:
    """A finished bundle with one quiet run and TRACED traced runs (small.v7.dat each)."""
    span = tracekit.open(FIXTURES / "small.v7.dat", use_cache=False).events["ts"]
    start, end = int(span.min()), int(span.max())  # type: ignore[arg-type]
    writer = BundleWriter.create(root, Manifest())
    quiet = writer.start_run(RunRecord("q0", "before", "quiet", 0, start - 10, start - 5))
    writer.end_run(quiet)
    for i in range(traced):
        name = f"runs/t{i}/trace.dat"
        shutil.copy(FIXTURES / "small.v7.dat", writer.path(name))
        run = writer.start_run(RunRecord(f"t{i}", "before", "traced", i, start, end, [name]))
        writer.end_run(run)
    writer.finish()
    return root


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `tracekit perfetto` in a subprocess."""
    cmd = [sys.executable, "-m", "tracekit", "perfetto", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_bundle_export_draws_runs(tmp_path: Path) -> None:
    """The traced run's events are exported and every timed run is a slice."""
    bundle = _bundle(tmp_path / "b", traced=1)
    out = tmp_path / "b.pftrace"
    done = _run(str(bundle), "-o", str(out))
    assert done.returncode == 0, done.stderr
    packets = [TracePacket.FromString(raw) for raw in read_packets(out)]
    names = {p.track_event.name for p in packets if p.HasField("track_event")}
    assert {"before quiet #0", "before traced #0"} <= names
    assert sum(len(p.ftrace_events.event) for p in packets) == 503


def test_bundle_with_two_traces_needs_run(tmp_path: Path) -> None:
    """Two traced runs: a one-line error naming them, then --run picks one."""
    bundle = _bundle(tmp_path / "b", traced=2)
    out = tmp_path / "b.pftrace"
    ambiguous = _run(str(bundle), "-o", str(out))
    assert ambiguous.returncode == 2
    assert ambiguous.stderr.count("\n") == 1 and "t0, t1" in ambiguous.stderr
    assert _run(str(bundle), "-o", str(out), "--run", "t1").returncode == 0


def test_process_tree_with_known_thread_groups() -> None:
    """Known tgids give processes with their threads; a cmdline is always there."""
    tasks = Tasks(
        names={10: "qemu", 11: "vcpu0", 20: "cat"},
        tgids={10: 10, 11: 10},
        parents={10: 1, 20: 10},
        executed={20: "/bin/cat"},
    )
    tree = process_tree_packet(tasks, 5).process_tree  # type: ignore[union-attr]
    procs = {p.pid: (p.ppid, list(p.cmdline), p.cmdline_is_comm) for p in tree.processes}
    assert procs == {10: (1, ["qemu"], True), 20: (10, ["/bin/cat"], False)}
    assert [(t.tid, t.tgid, t.name) for t in tree.threads] == [(11, 10, "vcpu0")]
    assert process_tree_packet(Tasks(names={5: "x"}), 5) is None  # nothing known: no guess
