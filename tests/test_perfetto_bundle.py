"""Exporting a bundle: the traced run's trace plus the manifest's runs as a track."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from perfetto_support import ftrace_events

import tracekit
from tracekit.bundle import BundleWriter, Manifest, RunRecord
from tracekit.ingest.trace import Trace
from tracekit.perfetto.bundle import export_bundle
from tracekit.perfetto.export import TIMELINE
from tracekit.perfetto.protos import TracePacket
from tracekit.perfetto.system import Tasks, process_tree_packet
from tracekit.perfetto.writer import read_members, read_packets

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"
# A run from another directory imports this checkout's tracekit, not an installed one.
_HERE_ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
WAKEUP = Path(__file__).parent / "fixtures" / "analysis" / "wakeup-bundle"


def _bundle(root: Path, traced: int, fixture: str = "small.v7.dat") -> Path:
    """A finished bundle with one quiet run and TRACED traced runs (FIXTURE each)."""
    span = tracekit.open(FIXTURES / fixture, use_cache=False).events["ts"]
    start, end = int(span.min()), int(span.max())  # type: ignore[arg-type]
    writer = BundleWriter.create(root, Manifest())
    quiet = writer.start_run(RunRecord("q0", "before", "quiet", 0, start - 10, start - 5))
    writer.end_run(quiet)
    for i in range(traced):
        name = f"runs/t{i}/trace.dat"
        shutil.copy(FIXTURES / fixture, writer.path(name))
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
    assert {"before", "q0", "t0"} <= names  # the phase and its runs
    assert len(ftrace_events(packets)) == 503  # compact sched events included


def test_events_of_unknown_ids_are_exported_not_a_traceback(tmp_path: Path) -> None:
    """A real bundle whose guest trace has ids without a format file (unknown_id_N, kept
    by ingest in the events table only): exported as generic events without fields."""
    bundle = tmp_path / "b"
    shutil.copytree(WAKEUP, bundle, ignore=shutil.ignore_patterns(".tracekit-cache"))
    out = tmp_path / "b.pftrace"
    done = _run(str(bundle), "-o", str(out))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    packets = [TracePacket.FromString(raw) for raw in read_packets(out)]
    generic = Counter(
        e.generic.event_name
        for p in packets
        if p.HasField("ftrace_events")
        for e in p.ftrace_events.event
        if e.HasField("generic")
    )
    assert generic["unknown_id_1235"] == 4 and generic["unknown_id_55"] == 4
    assert "every event written (" in done.stdout  # the counts per type checked


def test_bundle_with_two_traces_exports_both_and_run_picks_one(tmp_path: Path) -> None:
    """Two traced runs: both in one file (their overlap noted), or the one --run names."""
    bundle = _bundle(tmp_path / "b", traced=2)
    out = tmp_path / "b.pftrace"
    both = _run(str(bundle), "-o", str(out))
    assert both.returncode == 0, both.stderr
    assert "traced runs exported: t0, t1" in both.stdout
    assert "t0 and t1: their traces overlap in time" in both.stderr
    packets = [TracePacket.FromString(raw) for raw in read_packets(out)]
    assert len(ftrace_events(packets)) == 2 * 503
    one = _run(str(bundle), "-o", str(out), "--run", "t1")
    assert one.returncode == 0 and "traced runs exported: t1\n" in one.stdout
    unknown = _run(str(bundle), "-o", str(out), "--run", "t9")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
    assert "have: q0, t0, t1" in unknown.stderr


def test_a_multi_run_export_is_named_as_the_tar_it_is(tmp_path: Path) -> None:
    """Two traced runs without -o: BUNDLE.tar in the current directory, said to be a TAR
    of 3 traces; -o X.pftrace writes the same TAR there with one note line saying so."""
    bundle = _bundle(tmp_path / "b", traced=2)
    here = tmp_path / "here"
    here.mkdir()
    cmd = [sys.executable, "-m", "tracekit", "perfetto", str(bundle)]
    named = subprocess.run(cmd, capture_output=True, text=True, cwd=here, env=_HERE_ENV)
    assert named.returncode == 0, named.stderr
    assert (
        "b.tar: a TAR of 3 Perfetto traces (one per traced run, one of the tracks)" in named.stdout
    )
    members = [name for name, _ in read_members(here / "b.tar")]
    assert members == ["01-t0.pftrace", "02-t1.pftrace", TIMELINE]
    out = tmp_path / "b.pftrace"
    given = _run(str(bundle), "-o", str(out))
    assert given.returncode == 0, given.stderr
    notes = [line for line in given.stderr.splitlines() if str(out) in line]
    assert notes == [
        f"note: {out} is a TAR of 3 Perfetto traces (one per traced run, one of the tracks), "
        "not one trace: the Perfetto UI and trace_processor open it as one timeline, other "
        "tools may not; name it .tar (the default without -o) to say so"
    ]
    assert [name for name, _ in read_members(out)] == members
    one = subprocess.run(
        [*cmd, "--run", "t1"], capture_output=True, text=True, cwd=here, env=_HERE_ENV
    )
    assert one.returncode == 0 and (here / "b.pftrace").is_file()  # one trace: .pftrace
    assert "TAR" not in one.stdout + one.stderr


def test_a_bundle_export_holds_one_trace_at_a_time(tmp_path: Path) -> None:
    """Each traced run's trace is let go once written: when the next run is read, no
    earlier run's trace is alive (memory does not grow with the runs)."""
    bundle = _bundle(tmp_path / "b", traced=3)
    alive: list[int] = []

    def steps(done: int, total: int, run_id: str) -> None:
        """Count the traces alive before each run is read."""
        gc.collect()
        alive.append(sum(isinstance(o, Trace) for o in gc.get_objects()))

    result, _ = export_bundle(bundle, tmp_path / "b.pftrace", steps=steps)
    assert result.traces == ["t0", "t1", "t2"]
    assert alive == [0, 0, 0]


def test_each_runs_losses_are_carried(tmp_path: Path) -> None:
    """Two lossy runs: loss-flagged bundles from both, each run's overrun counters in its
    own trace of the archive (one stats packet each)."""
    bundle = _bundle(tmp_path / "b", traced=2, fixture="overrun.v7zstd.dat")
    out = tmp_path / "b.pftrace"
    assert _run(str(bundle), "-o", str(out)).returncode == 0
    packets = [TracePacket.FromString(raw) for raw in read_packets(out)]
    flagged = [p.ftrace_events.cpu for p in packets if p.ftrace_events.lost_events]
    single = tracekit.open(bundle / "runs" / "t0" / "trace.dat").lost
    pages = single.filter(single["ts"].is_not_null())
    assert len(flagged) == 2 * pages.height > 0  # one loss-flagged bundle per lost page
    per_run = [
        [TracePacket.FromString(raw).ftrace_stats for raw in member]
        for name, member in read_members(out)
        if name != TIMELINE
    ]
    for stats in per_run:
        (run_stats,) = [s for s in stats if s.cpu_stats]
        assert {s.cpu: s.overrun for s in run_stats.cpu_stats} == {0: 358, 1: 144}
    assert len(per_run) == 2


def test_run_and_phase_are_refused_for_a_trace(tmp_path: Path) -> None:
    """--run or --phase on a plain trace: a one-line error saying they select bundle runs."""
    done = _run(str(FIXTURES / "small.v7.dat"), "-o", str(tmp_path / "t.pftrace"), "--phase", "x")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "select runs of a bundle" in done.stderr


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
