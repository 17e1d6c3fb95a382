"""The ground truth on the Perfetto timeline: per CPU, instant events of the EL2, KVM and
broadcast invalidations (tests/test_report_groundtruth.py's bundle around the fixture)."""

from __future__ import annotations

from pathlib import Path

from test_report_groundtruth import gt_bundle

from tracekit.perfetto.bundle import export_bundle
from tracekit.perfetto.groundtruth import GROUP
from tracekit.perfetto.protos import TracePacket
from tracekit.perfetto.writer import read_packets


def test_el2_invalidations_drawn_per_cpu(tmp_path: Path) -> None:
    """The fixture's 10 EL2 invalidations of its VM (4 CPUs x ALLE2 + VMALLS12E1 at
    creation, VMALLE1 + IC IALLU on CPU 1 at the first run) are instants on CPU tracks."""
    bundle = gt_bundle(tmp_path / "b")
    out = tmp_path / "b.pftrace"
    export_bundle(bundle, out)
    packets = [TracePacket.FromString(raw) for raw in read_packets(out)]
    names = {
        p.track_descriptor.uuid: p.track_descriptor.name
        for p in packets
        if p.HasField("track_descriptor")
    }
    assert GROUP in names.values()
    instants = [
        (names[p.track_event.track_uuid], p.track_event.name)
        for p in packets
        if p.HasField("track_event")
        and names.get(p.track_event.track_uuid, "").endswith(" invalidations")
    ]
    assert sorted(instants) == sorted(
        [
            (f"CPU {c} invalidations", op)
            for c in range(4)
            for op in ("TLBI ALLE2", "TLBI VMALLS12E1")
        ]
        + [("CPU 1 invalidations", "TLBI VMALLE1"), ("CPU 1 invalidations", "IC IALLU")]
    )


def test_no_ground_truth_no_track(tmp_path: Path) -> None:
    """A bundle without ground truth gets no such track."""
    bundle = gt_bundle(tmp_path / "b", truth=False)
    out = tmp_path / "b.pftrace"
    export_bundle(bundle, out)
    packets = [TracePacket.FromString(raw) for raw in read_packets(out)]
    assert GROUP not in {p.track_descriptor.name for p in packets if p.HasField("track_descriptor")}
