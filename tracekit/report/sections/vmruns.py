"""The runs that ran the VMM, opened once for the vm, teardown and cacheflush sections.

Not a section itself: each `VmRun` pairs a run's VMM output (vmm.txt) with its trace and
the VM timeline its markers give, and hands out KVM event tables already given to VMs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracekit.analysis import vm
from tracekit.analysis.kvmtext import kvm_fields
from tracekit.bundle import RunRecord, run_trace_path
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData, open_run_trace
from tracekit.ingest.trace import Trace
from tracekit.ingest.vmm import VmmOutput, vmm_runs
from tracekit.report.header import bundle_label

EMPTY_EVENT = {"row": pl.Int64, "ts": pl.Int64, "cpu": pl.Int32, "common_pid": pl.Int32}


@dataclass
class VmRun:
    """One run's VMM output, trace and VM timeline (windows/threads None without markers)."""

    data: BundleData
    run: RunRecord
    vmm: VmmOutput
    trace: Trace
    label: str
    windows: pl.DataFrame | None = None
    threads: pl.DataFrame | None = None
    available: set[str] = field(default_factory=set)

    @property
    def lost(self) -> int:
        """Events the run's trace lost, over its CPUs (RunData's one definition)."""
        return self.data.run(self.run).lost_events

    def event(self, name: str) -> pl.DataFrame | None:
        """The event's table; empty when enabled but never fired; None when not recorded.

        A tracepoint that shares its name with one of tracekit's kprobes is ingested as
        `<system>:<name>` (e.g. kvm:kvm_toggle_cache); the tracepoint is the one meant.
        """
        recorded = tracepoint_name(self.trace.event_names, name)
        if recorded is not None:
            return kvm_fields(name, self.trace.event(recorded))
        if name in self.available:
            return pl.DataFrame(schema=EMPTY_EVENT)  # no row, so no field columns either
        return None

    def attributed(self, name: str) -> pl.DataFrame | None:
        """The event's rows with vm_seq and vcpu (None: not recorded, or no markers)."""
        rows = self.event(name)
        if rows is None or self.windows is None or self.threads is None:
            return None
        return vm.attribute(rows, self.windows, self.threads)

    def give_to_vms(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Any rows with ts and common_pid, with vm_seq and vcpu added (markers needed)."""
        if self.windows is None or self.threads is None:
            raise TracekitError(f"{self.label}: no VMM markers in the trace ({vm.MARKER_HOW})")
        return vm.attribute(rows, self.windows, self.threads)


def tracepoint_name(recorded: list[str], name: str) -> str | None:
    """The table name under which a trace holds tracepoint `name`, or None."""
    if name in recorded:
        return name
    qualified = [n for n in recorded if n.endswith(f":{name}") and not n.startswith("tracekit:")]
    return qualified[0] if qualified else None


def open_vm_run(data: BundleData, run: RunRecord, vmm: VmmOutput, label: str) -> VmRun:
    """Open the run's trace and build its VM timeline from the VMM's markers."""
    trace = open_run_trace(data, run)
    found = VmRun(data, run, vmm, trace, label)
    found.available = vm.available_events(trace.event_names, trace.meta)
    name = next((n for n in vm.MARKER_EVENTS if n in trace.event_names), None)
    if name is not None:
        markers = vm.vmm_markers(trace.event(name))
        if not markers.filter(pl.col("event") == "create").is_empty():
            found.windows = vm.vm_windows(markers)
            found.threads = vm.vcpu_threads(markers)
    return found


def vm_runs(bundles: list[BundleData]) -> list[VmRun]:
    """Every traced run of these bundles that ran the VMM, labelled for the report."""
    many = len(bundles) > 1
    out = []
    for data in bundles:
        prefix = f"{bundle_label(data)}: " if many else ""
        for run, vmm in vmm_runs(data):
            if run_trace_path(data.path, run.run_id) is not None:
                out.append(open_vm_run(data, run, vmm, f"{prefix}{run.run_id}"))
    return out
