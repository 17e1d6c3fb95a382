"""Bundles built around the real VM fixtures of tests/fixtures/analysis/ (vm-, teardown-,
cacheflush-): each run directory holds one fixture's trace text as `trace` and its VMM
stdout as `vmm.txt`, the way the collector lays out a run that ran the VMM.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

import tracekit
from tracekit.analysis import vm
from tracekit.analysis.kvmtext import kvm_fields
from tracekit.bundle import BundleWriter, Manifest, RunRecord
from tracekit.ingest.trace import Trace

FIXTURES = Path(__file__).parent / "fixtures" / "analysis"
KERNELS = {"teardown-6.1-a76": "6.1.0-50-arm64", "teardown-6.12-max": "6.12.117+deb13-arm64"}


def make_vm_bundle(
    root: Path, runs: dict[str, str], kernel: str, kind: str = "guest", scenario: str = "test"
) -> Path:
    """A complete emulated-host bundle with one run per {run_id: fixture name}."""
    host = {"emulated": True, "kernel_release": kernel, "kvm": {"mode": "nvhe"}}
    writer = BundleWriter.create(root, Manifest(host=host, scenario={"name": scenario}))
    for index, (run_id, name) in enumerate(runs.items()):
        shutil.copy(FIXTURES / f"{name}.trace", writer.path(f"runs/{run_id}/trace"))
        shutil.copy(FIXTURES / f"{name}.vmm.txt", writer.path(f"runs/{run_id}/vmm.txt"))
        run = writer.start_run(RunRecord(run_id, "guest", kind, index, lost_events={"0": 0}))
        writer.end_run(run)
    writer.finish()
    return root


def during_tlbi_loop_bundle(root: Path) -> Path:
    """A guest-broadcast bundle's during phase: the TLBI-loop guest started (its VMM
    record) and stopped around a quiet run, no run traced."""
    options = {"guest_cpus": [1], "scenario": "guest-broadcast"}
    writer = BundleWriter.create(root, Manifest(options=options))
    start = writer.start_run(RunRecord("during-guest-start", "during", "guest-start", 0, 100, 200))
    vmm = "record=run format=1 variant=tlbi-loop tlbi_count=4294967295 vcpus=1\n"
    writer.path("runs/during-guest-start/vmm.txt").write_text(vmm)
    writer.end_run(start)
    writer.end_run(writer.start_run(RunRecord("during-quiet-0", "during", "quiet", 0, 300, 900)))
    stop = RunRecord("during-guest-stop", "during", "guest-stop", 0, 950, 990)
    writer.end_run(writer.start_run(stop))
    writer.finish()
    return root


def open_fixture(name: str) -> Trace:
    """One fixture trace, ingested without writing a cache beside it."""
    return tracekit.open(FIXTURES / f"{name}.trace", use_cache=False)


def timeline(trace: Trace) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The VM windows and vCPU threads of a fixture trace."""
    markers = vm.vmm_markers(trace.event(vm.marker_event(trace.event_names)))
    return vm.vm_windows(markers), vm.vcpu_threads(markers)


def kvm_event(trace: Trace, name: str) -> pl.DataFrame:
    """An event's table with the binary readers' columns."""
    return kvm_fields(name, trace.event(name))
