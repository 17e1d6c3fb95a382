"""Scenario tracks: teardown spans with IPA size and VMID, stage-2 flushes, TLBI loops."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from perfetto_support import Export, read_export
from vm_bundles import during_tlbi_loop_bundle, make_vm_bundle

import tracekit
from tracekit.analysis.cacheflush import BY_NEIGHBOUR, BY_PROBE
from tracekit.bundle import BundleWriter, read_manifest
from tracekit.ingest.tables import LOST_SCHEMA
from tracekit.perfetto.bundle import export_bundle
from tracekit.perfetto.timeline import write_trace_tracks
from tracekit.perfetto.tracks import TrackWriter, write_spans
from tracekit.perfetto.validate import validate_file
from tracekit.perfetto.writer import PacketWriter

FIXTURE = Path(__file__).parent / "fixtures" / "perfetto" / "nvhe-a76-kprobes"
LOST = pl.DataFrame(schema=LOST_SCHEMA)
I32 = {"cpu": pl.Int32, "common_pid": pl.Int32}


def _table(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """A typed event table from row dicts (row, ts, cpu, common_pid, fields...)."""
    return pl.DataFrame(rows, schema_overrides=I32)


def _prints(lines: list[tuple[int, int, str]]) -> pl.DataFrame:
    """A print table from (ts, common_pid, text)."""
    return _table(
        [
            {"row": ts, "ts": ts, "cpu": 0, "common_pid": pid, "buf": f"{text}\n"}
            for ts, pid, text in lines
        ]
    )


def _write(
    tmp_path: Path,
    tables: dict[str, pl.DataFrame],
    events: pl.DataFrame | None = None,
    vmm_runs: tuple[dict[str, str], ...] = (),
) -> Export:
    """One trace's tracks written and validated, then read back."""
    out = tmp_path / "t.pftrace"
    with PacketWriter(out) as writer:
        tracks = TrackWriter(writer)
        root = tracks.track("root", "tracekit")
        write_trace_tracks(tracks, root, tables, LOST, 10_000, "", events, vmm_runs)
    report = validate_file(out)
    assert report.ok, report.problems
    return read_export(out)


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Export]:
    """The fixture bundle's guest run exported alone, and the bundle copy."""
    root = tmp_path_factory.mktemp("b") / "b"
    shutil.copytree(FIXTURE, root)
    out = root.parent / "guest.pftrace"
    export_bundle(root, out, run_id="guest")
    return root, read_export(out)


def test_teardown_span_has_ipa_size_and_vmid(guest: tuple[Path, Export]) -> None:
    """The teardown slice spans the VMM's markers and carries ipa_bits and the kprobe's VMID."""
    root, export = guest
    prints = tracekit.open(root / "runs" / "guest" / "trace").event("print")
    marks = {
        b.split("event=")[1].split()[0]: t
        for t, b in prints.select("ts", "buf").iter_rows()
        if "vm=0" in b
    }
    (teardown,) = [s for s in export.slices["VM 0"] if s.name == "teardown (IPA 40 bits)"]
    assert (teardown.start, teardown.end) == (marks["teardown-start"], marks["teardown-end"])
    assert teardown.args["ipa_bits"] == "40"
    assert teardown.args["vmid"] == 1 and teardown.args["vmid_generation"] == 1
    assert teardown.args["teardown_ns"] == teardown.end - teardown.start
    assert export.path("VM 0") == ["tracekit (emulated host: its timings are not hardware timings)",
                                   "run guest (guest)", "tracekit: VMs", "VM 0"]  # fmt: skip


def test_kernel_teardown_path_from_entry_return_kprobes(guest: tuple[Path, Export]) -> None:
    """Entry/return kprobes of the VMM thread during teardown are spans; entry-only, instants."""
    root, export = guest
    trace = tracekit.open(root / "runs" / "guest" / "trace")
    path = {s.name: s for s in export.slices["VM 0: teardown in the kernel (kprobes)"]}
    free = path["kvm_free_stage2_pgd"]
    assert free.start == trace.event("kvm_free_stage2_pgd")["ts"][0]
    assert free.end == trace.event("kvm_free_stage2_pgd_ret")["ts"][0]
    destroy = path["kvm_arch_destroy_vm"]
    assert destroy.end == trace.event("kvm_arch_destroy_vm_ret")["ts"][0]
    shadow = path["kvm_arch_flush_shadow_all"]
    assert shadow.start == shadow.end  # no return probe: an instant
    (teardown,) = [s for s in export.slices["VM 0"] if s.name.startswith("teardown")]
    assert all(teardown.start <= s.start <= s.end <= teardown.end for s in path.values())


def _teardown_without_a_return(root: Path, misses: dict[str, int] | None) -> Export:
    """The real 6.1 teardown bundle with its first kvm_free_stage2_pgd return cut, the
    run's kprobe misses recorded as MISSES, exported."""
    bundle = make_vm_bundle(root, {"teardown": "teardown-6.1-a76"}, "6.1.0-50-arm64")
    trace = bundle / "runs" / "teardown" / "trace"
    lines = trace.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if "kvm_free_stage2_pgd_ret:" in line)
    trace.write_text("".join(lines[:first] + lines[first + 1 :]))
    manifest = read_manifest(bundle)
    manifest.runs[0].probe_misses = misses
    BundleWriter(bundle, manifest).finish()  # recorded so, not changed later
    out = root.parent / f"{root.name}.pftrace"
    export_bundle(bundle, out)
    assert validate_file(out).ok
    return read_export(out)


def test_a_teardown_call_without_return_says_if_the_kretprobe_missed_it(tmp_path: Path) -> None:
    """The cut return's call is drawn to teardown-end, labelled by what the run's
    kprobe_profile says: maybe a missed return (1 missed), not one (0 missed), or unknown."""
    said = {}
    key = "tracekit/kvm_free_stage2_pgd_ret"
    for name, misses in (("missed", {key: 1}), ("none", {key: 0}), ("unknown", None)):
        export = _teardown_without_a_return(tmp_path / name, misses)
        (unclosed,) = [
            s
            for track, spans in export.slices.items()
            if track.endswith("teardown in the kernel (kprobes)")
            for s in spans
            if "return not recorded" in s.name
        ]
        said[name] = (unclosed.name, unclosed.args["missing_return"])
    assert said["missed"][0].endswith("(return not recorded: maybe missed by the kretprobe)")
    assert "may be one of them" in said["missed"][1]
    assert said["none"][0].endswith("(return not recorded: trace ended or events lost)")
    assert "missed none" in said["none"][1]
    assert said["unknown"][0] == "kvm_free_stage2_pgd (return not recorded)"
    assert "did not record the kretprobe's misses" in said["unknown"][1]


def _flush_tables(kprobe: bool) -> tuple[dict[str, pl.DataFrame], pl.DataFrame]:
    """Thread 51 (VM 0 vCPU 0): set/way at 200, toggle off->on at 400, toggle on->on at 600."""
    lines = [(100, 50, "tracekit-vmm: vm=0 event=create ipa_bits=40 vcpus=1"),
             (150, 51, "tracekit-vmm: vm=0 event=enter vcpu=0 cpu=2")]  # fmt: skip
    setway = _table([{"row": 200, "ts": 200, "cpu": 2, "common_pid": 51, "vcpu_pc": 1}])
    common = {"cpu": 2, "common_pid": 51, "vcpu_pc": 2}
    toggle = _table(
        [{"row": 400, "ts": 400, **common, "was": False, "now": True},
         {"row": 600, "ts": 600, **common, "was": True, "now": True}]
    )  # fmt: skip
    tables = {"print": _prints(lines), "kvm_set_way_flush": setway, "kvm_toggle_cache": toggle}
    other = [(180, 2), (260, 2), (330, 2), (590, 2)]  # the flushes' neighbours on CPU 2
    rows = [(t, c) for t, c, *_ in lines] + [(200, 2), (400, 2), (600, 2)] + other
    if kprobe:  # stage2_flush_vm entry/return around each real flush
        for name, col, spans in (("stage2_flush_vm", "__probe_ip", (210, 340)),
                                 ("stage2_flush_vm_ret", "__probe_func", (250, 390))):  # fmt: skip
            tables[name] = _table(
                [{"row": t, "ts": t, "cpu": 2, "common_pid": 51, col: 0xAB} for t in spans]
            )
            rows += [(t, 2) for t in spans]
    events = pl.DataFrame(
        sorted(rows), schema={"ts": pl.Int64, "cpu": pl.Int32}, orient="row"
    ).with_columns(pl.col("ts").alias("row"))
    return tables, events


def test_flushes_by_neighbouring_events(tmp_path: Path) -> None:
    """Toggle: from the event before it on its CPU; set/way: to the event after; no-op: instant."""
    tables, events = _flush_tables(kprobe=False)
    export = _write(tmp_path, tables, events)
    flushes = export.slices["VM 0 vCPU 0 (thread 51): stage-2 flushes"]
    got = [(s.start, s.end, s.name) for s in sorted(flushes, key=lambda s: s.start)]
    assert got == [
        (200, 260, "stage-2 flush (set/way)"),
        (330, 400, "stage-2 flush (cache toggle)"),
        (600, 600, "cache toggle (no flush: caches unchanged)"),
    ]
    assert {s.args["method"] for s in flushes} == {BY_NEIGHBOUR}


def test_flushes_by_flush_function_kprobes(tmp_path: Path) -> None:
    """With stage2_flush_vm entry/return recorded, each flush lasts its probed call."""
    tables, events = _flush_tables(kprobe=True)
    export = _write(tmp_path, tables, events)
    flushes = export.slices["VM 0 vCPU 0 (thread 51): stage-2 flushes"]
    timed = {s.name: s.end - s.start for s in flushes if s.args.get("dur_ns") is not None}
    assert timed == {"stage-2 flush (set/way)": 40, "stage-2 flush (cache toggle)": 50}
    assert {s.args["method"] for s in flushes if "dur_ns" in s.args} == {BY_PROBE}


def _loop_markers() -> dict[str, pl.DataFrame]:
    """One VM whose vCPU 0 runs on CPU 2 from 200 to 900."""
    return {"print": _prints([
        (100, 50, "tracekit-vmm: vm=0 event=create ipa_bits=40 vcpus=1"),
        (200, 51, "tracekit-vmm: vm=0 event=enter vcpu=0 cpu=2"),
        (900, 51, "tracekit-vmm: vm=0 event=poweroff vcpu=0"),
    ])}  # fmt: skip


def test_tlbi_loop_guest_is_a_span_on_its_cpu(tmp_path: Path) -> None:
    """A tlbi-loop variant: enter..poweroff on "CPU 2: guest TLBI loop"; other variants: none."""
    loop = {"variant": "tlbi-loop", "tlbi_count": "5000"}
    export = _write(tmp_path, _loop_markers(), vmm_runs=(loop,))
    (span,) = export.slices["CPU 2: guest TLBI loop"]
    assert (span.start, span.end, span.args["tlbi_count"]) == (200, 900, "5000")
    other = _write(tmp_path, _loop_markers(), vmm_runs=({"variant": "mmu-on"},))
    assert "CPU 2: guest TLBI loop" not in other.names.values()


def test_overlapping_spans_go_to_extra_lanes(tmp_path: Path) -> None:
    """Nested spans share a track; a partial overlap moves to "NAME (2)"; all validate."""
    out = tmp_path / "s.pftrace"
    with PacketWriter(out) as writer:
        tracks = TrackWriter(writer)
        root = tracks.track("root", "tracekit")
        spans = [(0, 100, "outer", {}), (10, 20, "inner", {}), (50, 150, "crossing", {}),
                 (60, None, "mark", {})]  # fmt: skip
        write_spans(tracks, "k", "spans", root, spans)
    assert validate_file(out).ok
    export = read_export(out)
    assert {s.name for s in export.slices["spans"]} == {"outer", "inner", "mark"}
    assert [s.name for s in export.slices["spans (2)"]] == ["crossing"]


def test_during_phase_guest_spans_its_phase(tmp_path: Path) -> None:
    """A guest kept running through a phase is drawn from guest-start to guest-stop."""
    out = tmp_path / "d.pftrace"
    export_bundle(during_tlbi_loop_bundle(tmp_path / "b"), out)
    assert validate_file(out).ok
    (span,) = read_export(out).slices["CPU 1: guest TLBI loop (phase during)"]
    assert (span.start, span.end, span.args["tlbi_count"]) == (100, 990, "4294967295")


def _vms(count: int, start: int = 0) -> list[tuple[int, int, str]]:
    """COUNT VMs of one VMM invocation, one after another, each entered on CPU 2."""
    lines = []
    for vm in range(count):
        t = start + vm * 100
        lines += [
            (t, 50, f"tracekit-vmm: vm={vm} event=create ipa_bits=40 vcpus=1"),
            (t + 10, 51, f"tracekit-vmm: vm={vm} event=enter vcpu=0 cpu=2"),
            (t + 20, 51, f"tracekit-vmm: vm={vm} event=poweroff vcpu=0"),
            (t + 30, 50, f"tracekit-vmm: vm={vm} event=teardown-start"),
            (t + 40, 50, f"tracekit-vmm: vm={vm} event=teardown-end"),
        ]
    return lines


def test_invocations_map_to_their_variants(tmp_path: Path) -> None:
    """Two VMM invocations (vm=0 again): each VM keeps its slices; only the loop is a loop."""
    tables = {"print": _prints(_vms(1) + _vms(1, start=1000))}
    variants = ({"variant": "mmu-on"}, {"variant": "tlbi-loop", "tlbi_count": "9"})
    export = _write(tmp_path, tables, vmm_runs=variants)
    lifetimes = [s for s in export.slices["VM 0"] if s.name == "VM lifetime"]
    assert sorted((s.start, s.end) for s in lifetimes) == [(0, 40), (1000, 1040)]
    (loop,) = export.slices["CPU 2: guest TLBI loop"]
    assert (loop.start, loop.end) == (1010, 1020)


def test_many_vms_share_one_track(tmp_path: Path) -> None:
    """Past 16 VM indexes (a rollover run's VMs) every VM is on one track, slices named."""
    export = _write(tmp_path, {"print": _prints(_vms(20))})
    assert not any(name.startswith("VM ") for name in export.names.values())
    spans = export.slices["all 20 VMs"]
    assert len([s for s in spans if s.name.endswith("VM lifetime")]) == 20
    assert "VM 19: teardown (IPA 40 bits)" in {s.name for s in spans}
