"""A run's data opens through one object: each file read once, checked against the manifest."""

from pathlib import Path

from tracekit.bundle import BundleWriter, Manifest, RunFile, RunRecord, run_file
from tracekit.ingest.bundle import load_bundle

VMM = "record=run variant=mmu-on vcpus=1 ram_mb=16 touch_kb=0 clock=boottime\n"


def _bundle(root: Path) -> Path:
    """A finished bundle whose one guest run kept its VMM output and argv record."""
    writer = BundleWriter.create(root, Manifest(options={"interval_us": 1000}))
    run = writer.start_run(RunRecord("guest", "guest", "guest", 0, lost_events={"0": 2, "1": 3}))
    writer.path(run_file("guest", RunFile.VMM)).write_text(VMM)
    writer.path(run_file("guest", f"{RunFile.CYCLICTEST}.argv")).write_text('["c", "-i", "250"]')
    writer.end_run(run)
    writer.finish()
    return root


def test_each_piece_is_read_once_and_shared(tmp_path: Path) -> None:
    data = load_bundle(_bundle(tmp_path / "b"))
    run = data.manifest.runs[0]
    found = data.run(run)
    assert data.run(run) is found
    assert found.vmm is not None and found.vmm.runs[0]["variant"] == "mmu-on"
    assert found.vmm is found.vmm  # cached, not re-read
    assert found.probe is None and found.trace is None and found.cyclictest is None
    assert found.cyclictest_interval_ns == 250_000  # the run's own command line wins
    assert found.lost_events == 5


def test_a_file_changed_since_collection_is_not_read_and_is_said(tmp_path: Path) -> None:
    root = _bundle(tmp_path / "b")
    (root / "runs" / "guest" / "vmm.txt").write_text(VMM + "record=run variant=x\n")
    data = load_bundle(root)
    assert data.run(data.manifest.runs[0]).vmm is None
    assert data.problems == [
        f"runs/guest/vmm.txt: {len(VMM) + 21} bytes, the manifest recorded {len(VMM)}"
    ]
