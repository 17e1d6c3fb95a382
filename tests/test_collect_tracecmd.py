"""`tracekit collect --capture trace-cmd`: options, preflight, manifest, the capture itself.

The capture runs for real on this machine's tracefs (root; skipped otherwise) and, in the
emulated nVHE cortex-a76 host, as one more check of that configuration's single boot: a
whole collection whose traced runs leave trace.dat files that ingest and report read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
import test_collect
from click.testing import CliRunner
from conftest import VhostBoot
from tracefs_recording import recording_instance

import tracekit
from tracekit.bundle import Manifest, RunRecord, read_manifest, run_trace_path, verify_files
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.host.capture import capture_record, check_capture, new_capture
from tracekit.host.cleanup import CleanupStack
from tracekit.host.tools import find_tools, find_trace_cmd
from tracekit.host.tracecmdcapture import TRACE_DAT, TraceCmdCapture
from tracekit.ingest.bundle import load_bundle, open_run_trace, traced_runs

# `root` (skips without root or tracefs) and `unchanged`.
pytest_plugins = ["host_tracefs_support"]

NVHE = "nvhe-a76"
REPRODUCER_BUILD = Path(__file__).resolve().parent.parent / "reproducer" / "build"
FIX = Path(__file__).parent / "fixtures" / "ingest"
ROLES = ["collect", "--rt-cpu", "1", "--stress-cpus", "0", "--guest-cpu", "0"]
# The boot's trace-cmd collection is the hotplug-other one of tests/test_collect.py (one
# quiet and one traced run a phase, 2 s each, then that action's and the probe slots'
# runs): its tests read the capture, those the action. Imported, it is registered when
# this file runs alone too.
TRACECMD = test_collect.HOTPLUG_OTHER


def test_unknown_capture_is_rejected(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, [*ROLES, "--capture", "perf", "--dry-run", "-o", str(tmp_path / "b")]
    )
    assert result.exit_code == 2
    assert "--capture" in result.output and "Traceback" not in result.output
    with pytest.raises(TracekitError, match="unknown; choose one of raw, trace-cmd"):
        check_capture("perf", "none")


def test_trace_cmd_capture_refuses_a_rollover(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [*ROLES, "--capture", "trace-cmd", "--after-guest", "rollover", "--dry-run", "-o",
         str(tmp_path / "b")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--after-guest rollover needs --capture raw" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_missing_trace_cmd_is_one_line_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without trace-cmd on PATH the tool search fails, naming the package and --capture raw."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: nothing is found
    with pytest.raises(TracekitError) as err:
        find_trace_cmd()
    assert "trace-cmd not found on PATH" in str(err.value)
    assert "Debian's trace-cmd package" in str(err.value) and "--capture at raw" in str(err.value)


@pytest.mark.skipif(shutil.which("trace-cmd") is None, reason="trace-cmd is not installed")
def test_find_tools_looks_for_trace_cmd_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = [str(tmp_path / "vmm"), str(tmp_path / "tlbiprobe")]
    for path in fake:
        Path(path).write_text("")
    # The arm64 host's cyclictest and stress-ng, stood in for: only their presence counts.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("cyclictest", "stress-ng"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert find_tools(*fake).trace_cmd is None
    assert find_tools(*fake, trace_cmd=True).trace_cmd == shutil.which("trace-cmd")


def test_manifest_records_the_capture() -> None:
    assert capture_record("raw", None) == {"method": "raw", "file": "trace", "trace_clock": "boot"}
    record = capture_record("trace-cmd", "/usr/bin/trace-cmd")
    assert record == {
        "method": "trace-cmd",
        "file": "trace.dat",
        "trace_clock": "boot",
        "tool": "/usr/bin/trace-cmd",
    }


def _bundle_with_a_trace_dat(tmp_path: Path) -> Path:
    """A bundle whose one traced run holds a real trace.dat (an x86 fixture)."""
    root = tmp_path / "bundle"
    (root / "runs" / "before-traced-0").mkdir(parents=True)
    shutil.copyfile(FIX / "small.v7zstd.dat", root / "runs" / "before-traced-0" / TRACE_DAT)
    manifest = Manifest(
        options={"capture": "trace-cmd"},
        scenario={
            "capture": capture_record("trace-cmd", "trace-cmd"),
            "events_enabled": ["sched/sched_switch", "sched/sched_wakeup"],
        },
        runs=[RunRecord("before-traced-0", "before", "traced", 0, status="ok")],
        complete=True,
    )
    (root / "manifest.json").write_text(json.dumps(manifest.to_json()))
    return root


def test_ingest_finds_a_runs_trace_dat(tmp_path: Path) -> None:
    """traced_runs/open_run_trace take trace.dat like a raw capture, with the bundle's clock."""
    root = _bundle_with_a_trace_dat(tmp_path)
    data = load_bundle(root)
    runs = traced_runs(data)
    assert [r.run_id for r in runs] == ["before-traced-0"]
    assert run_trace_path(root, runs[0].run_id) == root / "runs" / "before-traced-0" / TRACE_DAT
    trace = open_run_trace(data, runs[0])
    assert trace.meta["reader"].startswith("trace.dat")
    # The file says `local` (the top level's clock when it was made); the run used boot.
    assert trace.meta["clock_in_file"] == "local" and trace.meta["clock"] == "boot"
    assert trace.meta["events_enabled"] == ["sched/sched_switch", "sched/sched_wakeup"]
    assert trace.events.height == tracekit.open(FIX / "small.v7zstd.dat").events.height
    # Opened by its path, from the cache now, the run's file still gets the bundle's clock.
    direct = tracekit.open(root / "runs" / "before-traced-0" / TRACE_DAT)
    assert direct.from_cache and direct.meta["clock"] == "boot"
    assert tracekit.open(FIX / "small.v7zstd.dat").meta["clock"] == "local"  # no bundle


def test_a_run_without_a_trace_is_one_line(tmp_path: Path) -> None:
    root = _bundle_with_a_trace_dat(tmp_path)
    data = load_bundle(root)
    with pytest.raises(TracekitError, match="run guest has no trace"):
        open_run_trace(data, RunRecord("guest", "guest", "guest", 0))


@pytest.mark.skipif(shutil.which("trace-cmd") is None, reason="trace-cmd is not installed")
def test_trace_cmd_extract_of_our_instance(tmp_path: Path, unchanged: dict[str, object]) -> None:
    """On this machine's tracefs: the instance's events and markers, its stats, and the
    instance itself still there afterwards (trace-cmd 3.1 removes it without -k)."""
    markers = [f"tracekit-tc-marker-{n:03d}" for n in range(50)]
    with CleanupStack() as stack:
        instance = recording_instance(stack, 512, ["sched/sched_switch", "sched/sched_waking"])
        capture = new_capture("trace-cmd", instance, tmp_path / "run", shutil.which("trace-cmd"))
        assert isinstance(capture, TraceCmdCapture) and capture.drain().total_pages == 0
        capture.start()
        instance.start()
        for marker in markers:
            instance.write_marker(marker)
        subprocess.run(["true"], check=True)  # a fork and an exec: context switches
        instance.stop()
        capture.finish()
        assert instance.path.is_dir(), "trace-cmd extract removed the instance"
        assert instance.read("tracing_on").strip() == "0"
        stats = {cpu: instance.cpu_stats(cpu) for cpu in instance.cpus()}
    assert all(s["entries"] == 0 for s in stats.values()), "the buffers were read out"
    assert (tmp_path / "run" / "trace-cmd-extract.txt.argv").is_file()
    trace = tracekit.open(tmp_path / "run" / TRACE_DAT, use_cache=False)
    assert trace.meta["instance"] == instance.name
    assert trace.event("print")["buf"].str.strip_chars().to_list() == markers
    assert "sched_switch" in trace.event_names
    assert trace.lost.height == 0


def test_raw_stays_the_default_capture() -> None:
    help_text = CliRunner().invoke(main, ["collect", "--help"]).output
    assert "--capture [raw|trace-cmd]" in help_text and "[default: raw]" in help_text


def _check_dir(boot: VhostBoot, name: str) -> Path:
    """The host-side directory of one batched check, which must have succeeded."""
    if not (REPRODUCER_BUILD / "vmm").is_file():
        pytest.skip("reproducer/build is missing: make -C reproducer CROSS_COMPILE=aarch64-...")
    check = boot.checks[name]
    assert check.status == 0, f"{name}:\n{check.stdout}\n{check.stderr}"
    return boot.result.out_dir / "checks" / name


@pytest.mark.vhost
def test_trace_cmd_collection_is_complete(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    here = _check_dir(vhost_boot(NVHE), TRACECMD)
    bundle = here / "bundle"
    manifest = read_manifest(bundle)
    assert manifest.complete and verify_files(bundle, manifest) == []
    assert manifest.options["capture"] == "trace-cmd"
    assert manifest.scenario["capture"]["method"] == "trace-cmd"
    assert manifest.host["tools"]["trace-cmd"].startswith("trace-cmd version")
    traced = [r for r in manifest.runs if r.lost_events]
    assert {r.kind for r in traced} >= {"traced", "guest"}
    for run in traced:
        assert f"runs/{run.run_id}/{TRACE_DAT}" in run.files
        assert f"runs/{run.run_id}/{TRACE_DAT}" in manifest.files  # with its sha256
        assert not (bundle / "runs" / run.run_id / "trace").exists()
        assert sorted(run.lost_events) == ["0", "1", "2", "3"]
    assert json.loads((here / "before.json").read_text()) == json.loads(
        (here / "after.json").read_text()
    )


@pytest.mark.vhost
def test_trace_cmd_guest_run_has_kvm_kprobes_and_markers(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    data = load_bundle(_check_dir(vhost_boot(NVHE), TRACECMD) / "bundle")
    guest = next(r for r in data.manifest.runs if r.run_id == "guest")
    trace = open_run_trace(data, guest)
    assert trace.meta["clock"] == "boot" and trace.meta["instance"].startswith("tracekit-")
    names = set(trace.events["event"].cast(pl.String).unique())
    assert {"kvm_entry", "kvm_exit", "sched_switch", "irq_handler_entry"} <= names
    assert {"kvm_arm_vmid_update", "kvm_free_stage2_pgd"} <= names  # tracekit kprobes
    assert trace.event("kvm_arm_vmid_update")["vmid_id"].max() > 0
    markers = trace.event("print")["buf"].to_list()
    assert any("tracekit-vmm:" in m and "event=create" in m for m in markers)
    assert any("run=guest begin" in m for m in markers)


@pytest.mark.vhost
def test_report_on_a_trace_cmd_bundle(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    bundle = _check_dir(vhost_boot(NVHE), TRACECMD) / "bundle"
    result = CliRunner().invoke(main, ["report", str(bundle)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("EMULATED HOST")
    assert "cyclictest p99.9 after/before" in result.output
    # The sections that read traces are all computed from the trace.dat files.
    assert "not computed" not in result.output, result.output
    for title in ("Wake-up latency on the rt CPU", "What the other CPUs did", "VM lifecycle"):
        assert title in result.output


@pytest.mark.vhost
def test_perfetto_export_of_a_trace_cmd_bundle(vhost_boot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = _check_dir(vhost_boot(NVHE), TRACECMD) / "bundle"
    out = tmp_path / "bundle.pftrace"
    result = CliRunner().invoke(main, ["perfetto", str(bundle), "-o", str(out)])
    assert result.exit_code == 0, result.output
    runs = "before-traced-0, guest, after-guest-hotplug-other, after-traced-0"
    assert f"traced runs exported: {runs}" in result.output
    assert "every event written (" in result.output
