"""The report and the Perfetto export draw the same analysis results for one bundle: the
same VMs, VMIDs, kprobed call durations and lost events (they used to derive them apart,
with different rules: a text trace had VMs in the report and none in Perfetto)."""

import shutil
from pathlib import Path

import polars as pl
from perfetto_support import read_export
from vm_bundles import make_vm_bundle

from tracekit.analysis import teardown as td
from tracekit.analysis import vm
from tracekit.ingest.bundle import load_bundle
from tracekit.perfetto.bundle import export_bundle
from tracekit.report.sections.vmruns import vm_runs

REAL = Path(__file__).parent / "fixtures" / "perfetto" / "nvhe-a76-kprobes"


def _lifetimes(export_path: Path) -> list:
    """The export's VM lifetime slices, over every VM track."""
    export = read_export(export_path)
    return [s for n, sl in export.slices.items() if n.startswith("VM ") for s in sl
            if s.name.endswith("VM lifetime")]  # fmt: skip


def test_vms_vmids_and_teardown_calls_agree(tmp_path: Path) -> None:
    root = tmp_path / "b"
    shutil.copytree(REAL, root)
    out = tmp_path / "guest.pftrace"
    export_bundle(root, out, run_id="guest")
    (found,) = [r for r in vm_runs([load_bundle(root)]) if r.run.run_id == "guest"]
    assert found.windows is not None
    lives = _lifetimes(out)
    assert len(lives) == found.windows.height == 1
    # VMIDs: the report's rule (events given to VMs, last non-zero id) is the export's.
    updates = found.attributed("kvm_arm_vmid_update")
    assert updates is not None
    bits = vm.vmid_width(updates, None)
    assert bits is not None
    report_vmids = vm.vm_vmids(updates, bits).sort("vm_seq")
    assert [s.args.get("vmid") for s in lives] == report_vmids["vmid"].to_list()
    # Kernel teardown calls: the durations the report sums are the slices drawn.
    export = read_export(out)
    drawn = sorted(
        s.end - s.start for s in export.slices["VM 0: teardown in the kernel (kprobes)"]
        if s.end > s.start
    )  # fmt: skip
    spans = []
    for name in ("kvm_free_stage2_pgd", "kvm_arch_destroy_vm"):
        entries, returns = found.event(name), found.event(f"{name}_ret")
        if entries is not None and returns is not None:
            spans += td.function_spans(entries, returns)["dur_ns"].to_list()
    assert spans and sorted(spans) == drawn
    # Lost events: one definition (RunData), the same in both.
    data = load_bundle(root)
    run = next(r for r in data.manifest.runs if r.run_id == "guest")
    timed = found.trace.lost.filter(pl.col("ts").is_not_null())
    assert data.run(run).lost_events == found.lost == int(timed["count"].fill_null(0).sum())


def test_a_text_trace_has_its_vms_in_both(tmp_path: Path) -> None:
    bundle = make_vm_bundle(tmp_path / "b", {"guest": "cacheflush-2vcpu"}, "6.1.0-50-arm64")
    (found,) = vm_runs([load_bundle(bundle)])
    assert found.windows is not None and found.windows.height > 0
    out = tmp_path / "text.pftrace"
    export_bundle(bundle, out)
    assert len(_lifetimes(out)) == found.windows.height
