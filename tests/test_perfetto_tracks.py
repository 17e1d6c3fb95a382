"""tracekit's tracks from generated tables: VM lifecycle, time in guest, probe, runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from tracekit.analysis.exits import exit_reason
from tracekit.ingest.tables import LOST_SCHEMA
from tracekit.perfetto.protos import TracePacket, TrackEvent
from tracekit.perfetto.timeline import write_tracks
from tracekit.perfetto.validate import validate_file
from tracekit.perfetto.writer import PacketWriter, read_packets

LOST = pl.DataFrame(schema=LOST_SCHEMA)


def _prints(lines: list[tuple[int, int, str]]) -> pl.DataFrame:
    """A print table like the binary readers make (ts, common_pid, buf)."""
    return pl.DataFrame(
        {
            "row": range(len(lines)),
            "ts": [t for t, _, _ in lines],
            "cpu": [0] * len(lines),
            "common_pid": [p for _, p, _ in lines],
            "ip": [0] * len(lines),
            "buf": [b + "\n" for _, _, b in lines],
        },
        schema_overrides={"cpu": pl.Int32, "common_pid": pl.Int32, "ip": pl.UInt64},
    )


def _kvm(rows: list[tuple[int, int, int, str]]) -> dict[str, pl.DataFrame]:
    """arm64-shaped kvm_entry/kvm_exit tables from (row, ts, tid, 'entry'|'exit:ret:ec')."""
    entries = [r for r in rows if r[3] == "entry"]
    exits = [r for r in rows if r[3] != "entry"]
    common = {"cpu": pl.Int32, "common_pid": pl.Int32, "vcpu_pc": pl.UInt64}
    entry = pl.DataFrame(
        {
            "row": [r[0] for r in entries],
            "ts": [r[1] for r in entries],
            "cpu": [1] * len(entries),
            "common_pid": [r[2] for r in entries],
            "vcpu_pc": [0x40000000] * len(entries),
        },
        schema_overrides=common,
    )
    exit_ = pl.DataFrame(
        {
            "row": [r[0] for r in exits],
            "ts": [r[1] for r in exits],
            "cpu": [1] * len(exits),
            "common_pid": [r[2] for r in exits],
            "ret": [int(r[3].split(":")[1]) for r in exits],
            "esr_ec": [int(r[3].split(":")[2], 16) for r in exits],
            "vcpu_pc": [0x40000010] * len(exits),
        },
        schema_overrides={**common, "ret": pl.Int32, "esr_ec": pl.UInt32},
    )
    return {"kvm_entry": entry, "kvm_exit": exit_}


def _write(
    tmp_path: Path, tables: dict[str, pl.DataFrame], runs: tuple[dict, ...] = ()
) -> list[Any]:
    """Write the tracks, check them with the validator, return the packets."""
    out = tmp_path / "tracks.pftrace"
    with PacketWriter(out) as writer:
        write_tracks(writer, tables, LOST, runs, end_ts=10_000)
    report = validate_file(out)
    assert report.ok, report.problems
    return [TracePacket.FromString(raw) for raw in read_packets(out)]


def _slices(packets: list[Any]) -> dict[str, list[tuple[int, int, str]]]:
    """Per track name: (begin ts, end ts, slice name), rebuilt from begin/end pairs."""
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in packets}
    stacks: dict[int, list[tuple[int, str]]] = {}
    out: dict[str, list[tuple[int, int, str]]] = {}
    for p in packets:
        if not p.HasField("track_event"):
            continue
        uuid, kind = p.track_event.track_uuid, p.track_event.type
        if kind == TrackEvent.TYPE_SLICE_BEGIN:
            stacks.setdefault(uuid, []).append((p.timestamp, p.track_event.name))
        elif kind == TrackEvent.TYPE_SLICE_END:
            ts, name = stacks[uuid].pop()
            out.setdefault(names[uuid], []).append((ts, p.timestamp, name))
    return out


def test_vm_lifecycle_from_vmm_markers(tmp_path: Path) -> None:
    """create..teardown-end holds running (enter..poweroff) and teardown slices."""
    prints = _prints(
        [
            (100, 50, "tracekit-vmm: vm=0 event=create ipa_bits=40 vcpus=1"),
            (200, 51, "tracekit-vmm: vm=0 event=enter vcpu=0 cpu=2"),
            (300, 51, "tracekit-vmm: vm=0 event=poweroff vcpu=0"),
            (400, 50, "tracekit-vmm: vm=0 event=teardown-start"),
            (500, 50, "tracekit-vmm: vm=0 event=teardown-end"),
            (600, 50, "tracekit-vmm: vm=1 event=create ipa_bits=40 vcpus=1"),
            (700, 50, "unrelated print"),
        ]
    )
    slices = _slices(_write(tmp_path, {"print": prints}))
    assert sorted(slices["VM 0"]) == [
        (100, 500, "VM lifetime"),
        (200, 300, "vCPU 0 running"),
        (400, 500, "teardown (IPA 40 bits)"),
    ]
    assert slices["VM 1"] == [(600, 10_000, "VM lifetime")]  # still alive at trace end


def test_guest_slices_per_vcpu_thread_named_by_exit(tmp_path: Path) -> None:
    """kvm_entry..kvm_exit per thread, named by the arm64 exit reason."""
    tables = _kvm(
        [
            (0, 5, 51, "exit:2:16"),  # an exit before any entry: no slice
            (1, 10, 51, "entry"),
            (2, 12, 61, "entry"),
            (3, 20, 51, "exit:2:16"),
            (4, 25, 61, "exit:0:0"),
            (5, 30, 51, "entry"),
            (6, 40, 51, "exit:2:24"),
            (7, 50, 61, "entry"),
        ]
    )
    slices = _slices(_write(tmp_path, tables))
    assert slices["vCPU thread 51: in guest"] == [
        (10, 20, "guest: TRAP HVC64"),
        (30, 40, "guest: TRAP DABT_LOW"),
    ]
    assert slices["vCPU thread 61: in guest"] == [
        (12, 25, "guest: IRQ"),
        (50, 10_000, "in guest (trace ends)"),
    ]


def test_probe_windows_and_runs(tmp_path: Path) -> None:
    """Probe start/stop markers and manifest runs become slices on their tracks."""
    prints = _prints(
        [
            (100, 70, "tracekit-probe: event=start mode=mprotect cpu=1 pages=1 helpers=2,3"),
            (900, 70, "tracekit-probe: event=stop count=12"),
        ]
    )
    runs = [
        {
            "run_id": "b0",
            "phase": "before",
            "kind": "traced",
            "index": 0,
            "start_ns": 50,
            "end_ns": 950,
            "status": "ok",
        },
        {"run_id": "a0", "phase": "after", "kind": "quiet", "index": 0, "start_ns": None},
    ]
    slices = _slices(_write(tmp_path, {"print": prints}, tuple(runs)))
    assert slices["tracekit: TLBI probe on CPU 1"] == [(100, 900, "probe mprotect")]
    assert slices["tracekit: phases"] == [(50, 950, "before")]
    assert slices["phase before: runs"] == [(50, 950, "b0")]  # the untimed run is not drawn


def test_exit_reason_names() -> None:
    """arm64 exits by kind and class; x86 by exit_reason; unknown classes in hex."""
    assert exit_reason({"ret": 2, "esr_ec": 0x18}) == "TRAP SYS64"
    assert exit_reason({"ret": 2, "esr_ec": 0x3D}) == "TRAP EC=0x3d"
    assert exit_reason({"ret": 1, "esr_ec": 0}) == "EL1_SERROR"
    assert exit_reason({"exit_reason": 30}) == "exit_reason=30"
