"""A real bundle as one timeline: every run, phases in order, per-run groups, selection.

The bundle is tests/fixtures/perfetto/nvhe-a76-kprobes (a collect run in the emulated
host, cut down: see its README.md), copied first since ingest caches beside a trace.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from perfetto_support import Export, ftrace_events, read_export

import tracekit
from tracekit.bundle import RunRecord, read_manifest
from tracekit.errors import TracekitError
from tracekit.perfetto.bundle import check_timeline, export_bundle
from tracekit.perfetto.validate import validate_file

FIXTURE = Path(__file__).parent / "fixtures" / "perfetto" / "nvhe-a76-kprobes"
TRACED = ("before-traced-0", "guest")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the fixture bundle."""
    root = tmp_path_factory.mktemp("bundle") / "b"
    shutil.copytree(FIXTURE, root)
    return root


@pytest.fixture(scope="module")
def whole(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Export, str]:
    """The CLI's export of the whole bundle, read back, and its stdout."""
    out = tmp_path_factory.mktemp("pf") / "all.pftrace"
    cmd = [sys.executable, "-m", "tracekit", "perfetto", str(bundle), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return read_export(out), done.stdout + done.stderr


def _source_counts(bundle: Path, runs: tuple[str, ...]) -> Counter[str]:
    """Events per type over the runs' traces, as ingest reads them."""
    counts: Counter[str] = Counter()
    for run in runs:
        events = tracekit.open(bundle / "runs" / run / "trace").events
        counts += Counter(dict(events.group_by("event").len().iter_rows()))
    return counts


def _file_counts(export: Export) -> Counter[str]:
    """Events per type in an export's ftrace bundles."""
    counts: Counter[str] = Counter()
    for _, event in ftrace_events(export.packets):  # compact sched events included
        kind = event.WhichOneof("event")
        counts[event.generic.event_name if kind == "generic" else kind] += 1
    return counts


def test_every_traced_run_is_in_the_file(bundle: Path, whole: tuple[Export, str]) -> None:
    """Both traced runs' events, every one, and the CLI says which runs it wrote."""
    export, output = whole
    assert "traced runs exported: before-traced-0, guest" in output
    assert "every event written (" in output
    assert _file_counts(export) == _source_counts(bundle, TRACED)


def test_phases_in_time_order_with_their_runs(bundle: Path, whole: tuple[Export, str]) -> None:
    """One phases track (before -> guest -> after) and per phase its manifest runs."""
    export, _ = whole
    phases = sorted(export.slices["tracekit: phases"], key=lambda s: s.start)
    assert [s.name for s in phases] == ["before", "guest", "after"]
    assert all(a.end <= b.start for a, b in itertools.pairwise(phases))
    runs = read_manifest(bundle).runs
    for phase in ("before", "guest", "after"):
        drawn = {s.name for s in export.slices[f"phase {phase}: runs"]}
        assert drawn == {r.run_id for r in runs if r.phase == phase}
    traced = next(s for s in export.slices["phase before: runs"] if s.name == "before-traced-0")
    assert traced.args["lost_events"] == 0 and traced.args["lost_events_cpu3"] == 0


def test_each_run_has_its_group(whole: tuple[Export, str]) -> None:
    """Run groups hold their own tracks; the root says the host was emulated."""
    export, output = whole
    assert "tracekit (emulated host: its timings are not hardware timings)" in export.names.values()
    assert "emulated host" in output
    latency = "cyclictest latency, CPU 3 (before-traced-0)"
    assert latency in export.children("run before-traced-0 (traced)")
    assert "tracekit: VMs" in export.children("run guest (guest)")
    assert export.children("run before-probe-page-cpu3 (probe)") == [
        "TLBI probe on CPU 3: page, RW->RO and RO->RW pooled: syscall duration"
        " (before-probe-page-cpu3)"
    ]


def test_traces_line_up_with_their_runs(bundle: Path) -> None:
    """Each trace lies within its run's manifest times; a trace off its run is noted."""
    manifest = read_manifest(bundle)
    spans = []
    for run in manifest.runs:
        if run.run_id in TRACED:
            ts = tracekit.open(bundle / "runs" / run.run_id / "trace").events["ts"]
            spans.append((run, int(ts.min()), int(ts.max())))  # type: ignore[arg-type]
    assert check_timeline(spans) == []
    off = RunRecord("late", "after", "traced", 0, start_ns=0, end_ns=10)
    notes = check_timeline([*spans, (off, spans[0][1], spans[0][2])])
    assert any("late: its trace" in n and "another clock" in n for n in notes)
    assert any("overlap in time" in n for n in notes)


def test_run_and_phase_select(bundle: Path, tmp_path: Path) -> None:
    """--run keeps one run's events and tracks; --phase a phase's runs."""
    out = tmp_path / "guest.pftrace"
    result, _ = export_bundle(bundle, out, run_id="guest")
    assert result.traces == ["guest"]
    export = read_export(out)
    assert _file_counts(export) == _source_counts(bundle, ("guest",))
    assert [s.name for s in export.slices["tracekit: phases"]] == ["guest"]
    result, _ = export_bundle(bundle, out, phase="before")
    assert result.traces == ["before-traced-0"]
    assert validate_file(out, result.source_counts).ok
    assert "phase guest: runs" not in read_export(out).names.values()


def test_window_keeps_runs_and_events_inside(bundle: Path, tmp_path: Path) -> None:
    """A window on the guest's VM: only that run, only events inside; outside: an error."""
    guest = tracekit.open(bundle / "runs" / "guest" / "trace").events
    t0, t1 = int(guest["ts"].min()), int(guest["ts"].min()) + 20_000_000  # type: ignore[arg-type]
    out = tmp_path / "w.pftrace"
    result, _ = export_bundle(bundle, out, (t0, t1))
    assert result.traces == ["guest"]
    inside = guest.filter((guest["ts"] >= t0) & (guest["ts"] <= t1))
    assert sum(result.counts.values()) == inside.height
    assert validate_file(out, result.source_counts).ok
    with pytest.raises(TracekitError, match="no run of the selection overlaps --window"):
        export_bundle(bundle, out, (10**15, None))
    with pytest.raises(TracekitError, match=r"--phase during: .*phases: before, guest, after"):
        export_bundle(bundle, out, phase="during")
