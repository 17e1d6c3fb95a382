"""The ground-truth section and the report's lead: a bundle around the real fixture boot
(tests/fixtures/groundtruth/README.md: one MMU-on VM on CPU 1, 6.1 nVHE, 4 x cortex-a76),
its VMM output as the guest run's, the boot's ground truth added as `vhost run` adds it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tracekit.bundle import EMULATED_LINE, BundleWriter, Manifest, RunRecord, read_manifest
from tracekit.ingest.bundle import load_bundle
from tracekit.report.assemble import build_report
from tracekit.report.model import Report
from tracekit.report.render import render
from tracekit.report.sections import groundtruth
from tracekit.vhost.runner import add_ground_truth

FIXTURE = Path(__file__).parent / "fixtures" / "groundtruth" / "nvhe-a76"


def gt_bundle(
    root: Path, kvm_mode: str = "nvhe", emulated: bool = True, truth: bool = True
) -> Path:
    """A bundle whose guest run holds the fixture's VMM output (its VM inside the run)."""
    host = {
        "emulated": emulated,
        "kernel_release": "6.1.0-50-arm64",
        "online_cpus": "0-3",
        "kvm": {"mode": kvm_mode},
        "cpus": [{"name": "Cortex-A76"}] * 4,
    }
    # backing as collect records it (the run signatures require 4k); the fixture's own
    # VMM ran with its default backing, before --backing existed.
    options = {"guest_cpus": [1], "after_guest": "none", "scenario": "main", "backing": "4k"}
    writer = BundleWriter.create(root, Manifest(host=host, options=options))
    shutil.copy(FIXTURE / "vmm.txt", writer.path("runs/guest/vmm.txt"))
    run = RunRecord(
        "guest", "guest", "guest", 0, 14_300_000_000, 14_500_000_000, ["runs/guest/vmm.txt"]
    )
    writer.end_run(writer.start_run(run))
    writer.finish()
    if truth:
        add_ground_truth(FIXTURE, root)
    return root


def _report(root: Path) -> Report:
    """The report of one bundle."""
    return build_report([load_bundle(root)])


def test_matching_bundle_has_counts_and_no_contradiction(tmp_path: Path) -> None:
    """The fixture matches the 6.1 nVHE signatures: tables, no contradiction in the lead."""
    report = _report(gt_bundle(tmp_path / "b"))
    section = next(s for s in report.sections if s.key == "groundtruth")
    assert report.contradictions == [] and section.contradictions == []
    assert section.findings[0].startswith("emulated ground truth from a QEMU TCG plugin")
    assert any("every checked step executed what its signature says" in f for f in section.findings)
    titles = [t.title for t in section.tables]
    assert any("per VM step" in t for t in titles) and any("expected against" in t for t in titles)
    checks = next(t.frame for t in section.tables if "expected against" in t.title)
    assert checks["ok"].all() and checks["seen_total"].sum() == 10
    # The bundle's guest run holds no trace: the first-run flush's VMID is not known
    # (the VM is named from the VMM's window); the init's VMALLS12E1 is 0 by the source.
    vmids = next(t.frame for t in section.tables if "by VMID" in t.title)
    by = {(r["operation"], r["vmid_basis"]): r for r in vmids.iter_rows(named=True)}
    assert by[("TLBI VMALLE1", "untraced")]["vmid"] is None
    assert by[("TLBI VMALLS12E1", "source")]["vmid"] == 0
    assert by[("TLBI ALLE2", "not-vmid-scoped")]["vmid"] is None
    assert any("never read" in u for u in section.unknowns)
    # The margin is the bundle's own clock fit error, said once (G3).
    margin = [f for f in section.findings if "VMIDs attributed within" in f]
    assert len(margin) == 1 and "bound 100 us" in margin[0]
    assert "NOT attributed by time" in groundtruth._margin_line(150_000)


CONTRADICTS = "CONTRADICTS THE SETUP"


def test_a_contradiction_leads_every_format(tmp_path: Path) -> None:
    """A bundle that says VHE while its ground truth shows nVHE's EL2 init at VM creation
    contradicts the 6.1 VHE signature: stated right after the warning line, in text,
    email, HTML and JSON."""
    report = _report(gt_bundle(tmp_path / "b", kvm_mode="vhe"))
    assert report.contradictions, "the VHE signature says creation runs no KVM invalidation"
    first = report.contradictions[0]
    assert "create: TLBI ALLE2 (___kvm_hyp_init) on CPU 0-3: expected 0, executed 1" in first
    assert report.warnings[0] == EMULATED_LINE
    text = render(report, "text").splitlines()
    assert text[0] == EMULATED_LINE and text[1].startswith(CONTRADICTS)
    email = render(report, "email").splitlines()
    assert email[0] == EMULATED_LINE and email[1].startswith(CONTRADICTS)
    html = render(report, "html")
    assert html.index(EMULATED_LINE) < html.index(CONTRADICTS) < html.index("Ground truth")
    data = json.loads(render(report, "json"))
    assert data["contradictions"] == report.contradictions


def test_a_probe_whose_returns_were_missed_did_fire(tmp_path: Path) -> None:
    """The traced run recorded no kvm_flush_remote_tlbs hit, but its kprobe_profile
    counted 2 missed returns: the section sums the misses and says the probe fired."""
    root = gt_bundle(tmp_path / "b", truth=False)
    manifest = read_manifest(root)
    manifest.scenario["kprobes"] = [
        "p:tracekit/kvm_flush_remote_tlbs kvm_flush_remote_tlbs",
        "r:tracekit/kvm_flush_remote_tlbs_ret kvm_flush_remote_tlbs",
    ]
    manifest.runs[0].probe_misses = {
        "tracekit/kvm_flush_remote_tlbs": 0,
        "tracekit/kvm_flush_remote_tlbs_ret": 2,
    }
    trace = root / "runs" / "guest" / "trace"
    trace.write_text(
        "# tracer: nop\n"
        "             vmm-131     [001] .....    14.400000: tracing_mark_write: tracekit-vmm:"
        " vm=0 event=teardown-end\n"
    )
    manifest.runs[0].files.append("runs/guest/trace")
    BundleWriter(root, manifest).finish()
    add_ground_truth(FIXTURE, root)
    section = next(s for s in _report(root).sections if s.key == "groundtruth")
    (said,) = [f for f in section.findings if "probe kvm_flush_remote_tlbs" in f]
    assert "fired, though no hit was recorded: its probes missed 0 hit(s) and 2 return(s)" in said
    probes = next(t.frame for t in section.tables if "kprobes named after a path" in t.title)
    assert probes.select("entries_missed", "returns_missed").row(0) == (0, 2)


def test_a_board_bundle_says_no_ground_truth(tmp_path: Path) -> None:
    """A board's bundle has no ground truth, and the section says so instead of counts."""
    data = load_bundle(gt_bundle(tmp_path / "board", emulated=False, truth=False))
    section = groundtruth.section([data])
    assert section is not None and section.tables == [] and section.contradictions == []
    assert any("no ground truth (collected on a board" in f for f in section.findings)
