"""Cache-toggle flushes: per-vCPU counts against the guests' design, durations, redundancy."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from vm_bundles import kvm_event, make_vm_bundle, open_fixture, timeline

from tracekit.analysis import cacheflush as cf
from tracekit.analysis import teardown as td
from tracekit.analysis import vm
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import load_bundle
from tracekit.ingest.trace import Trace
from tracekit.report.sections import cacheflush as cf_section

RAM = (0x4000_0000, 0x4100_0000)
PROBES = ("stage2_flush_vm", "stage2_flush_vm_ret", "kvm_pgtable_stage2_flush")


def _flushes(trace: Trace, by_probe: bool = True) -> pl.DataFrame:
    """The trace's flushes, timed by the flush probes or by neighbouring events."""
    windows, threads = timeline(trace)
    setways = (
        kvm_event(trace, "kvm_set_way_flush") if "kvm_set_way_flush" in trace.event_names else None
    )
    flushes = cf.flush_rows(kvm_event(trace, "kvm_toggle_cache"), setways)
    if by_probe:
        spans = td.function_spans(
            trace.event("stage2_flush_vm"), trace.event("stage2_flush_vm_ret")
        )
        flushes = cf.probe_durations(flushes, spans)
    else:
        # As if no probe had been recorded: their events leave the neighbour search.
        events = trace.events.filter(~pl.col("event").cast(pl.String).str.starts_with("stage2_"))
        events = events.filter(~pl.col("event").cast(pl.String).str.starts_with("kvm_pgtable_"))
        flushes = cf.neighbour_durations(flushes, events)
    flushes = vm.attribute(flushes, windows, threads)
    faults = vm.attribute(kvm_event(trace, "kvm_guest_fault"), windows, threads)
    return cf.mark_redundant(flushes, faults, RAM)


@pytest.mark.parametrize(("name", "vcpus"), [("cacheflush-1vcpu", 1), ("cacheflush-2vcpu", 2)])
def test_cache_toggle_guest_flushes_once_per_vcpu(name: str, vcpus: int) -> None:
    """cache-toggle on cortex-a76 (no FWB): 4 trapped VM-register writes per vCPU, one of
    which turns the caches on and flushes; set/way traps but never flushes."""
    per = cf.per_vcpu(_flushes(open_fixture(name)))
    assert per["vcpu"].to_list() == list(range(vcpus))
    assert per["toggles"].to_list() == [4] * vcpus
    assert per["toggle_flushes"].to_list() == [1] * vcpus
    assert per["set_way_flushes"].to_list() == [0] * vcpus
    assert (per["flush_ms"] > 0).all()


def test_setway_after_on_guest_flushes_on_set_way_too() -> None:
    """setway-after-on: caches on first (a toggle flush), then set/way with TVM clear."""
    per = cf.per_vcpu(_flushes(open_fixture("cacheflush-setway")))
    assert per["toggle_flushes"].to_list() == [1, 1]
    assert per["set_way_flushes"].to_list() == [1, 1]


def test_neighbour_span_bounds_the_probed_duration() -> None:
    """Without probes, the event-to-event span is at least the probed flush duration."""
    trace = open_fixture("cacheflush-setway")
    probed = _flushes(trace).filter(pl.col("flushed")).sort("row")
    spans = _flushes(trace, by_probe=False).filter(pl.col("flushed")).sort("row")
    assert probed["dur_ns"].null_count() == 0 and spans["dur_ns"].null_count() == 0
    assert (spans["dur_ns"] >= probed["dur_ns"]).all()
    assert spans["method"].unique().to_list() == [cf.BY_NEIGHBOUR]


def test_flushing_more_memory_takes_longer() -> None:
    """2 vCPUs touching 2 MiB each: the flushes walk more mapped pages than with 256 KiB."""
    small = _flushes(open_fixture("cacheflush-2vcpu"))
    big = _flushes(open_fixture("cacheflush-2vcpu-big"))
    assert big["dur_ns"].sum() > small["dur_ns"].sum()


def test_redundant_flushes_on_a_generated_sequence() -> None:
    """A flush with no RAM fault of its VM since the previous flush is redundant."""
    # VM 0: fault, flush, flush, MMIO fault, flush, RAM fault, flush; VM 1 interleaved.
    seq = [
        ("fault", 0, RAM[0]),
        ("flush", 0, None),
        ("fault", 1, RAM[0] + 4096),
        ("flush", 0, None),
        ("fault", 0, 0x3F00_0000),
        ("flush", 1, None),
        ("flush", 0, None),
        ("fault", 0, RAM[0] + 8192),
        ("flush", 1, None),
        ("flush", 0, None),
    ]
    rows = pl.DataFrame(
        [(i, kind, v, ipa) for i, (kind, v, ipa) in enumerate(seq)],
        schema={"row": pl.Int64, "kind": pl.String, "vm_seq": pl.Int32, "ipa": pl.Int64},
        orient="row",
    )
    flushes = rows.filter(pl.col("kind") == "flush").with_columns(pl.lit(True).alias("flushed"))
    faults = rows.filter(pl.col("kind") == "fault")
    marked = cf.mark_redundant(flushes, faults, RAM).sort("row")
    assert marked["redundant"].to_list() == [False, True, False, True, True, False]
    assert marked["new_mappings"].to_list() == [1, 0, 1, 0, 0, 1]
    # Without the RAM range the MMIO fault counts as a mapping: fewer redundant, never more.
    loose = cf.mark_redundant(flushes, faults).sort("row")
    assert loose["redundant"].to_list() == [False, True, False, False, True, False]


def test_missing_events_are_named() -> None:
    """Neither flush event nor guest faults: the error names all three and how to record."""
    with pytest.raises(
        TracekitError, match=r"kvm_toggle_cache .*kvm_set_way_flush .*kvm_guest_fault"
    ):
        cf.check_events(["sched_switch"])
    cf.check_events(["kvm_toggle_cache", "kvm_guest_fault"])


def test_section_checks_counts_against_the_design(tmp_path: Path) -> None:
    """The section says 'as designed' per run and tabulates flush time vs vCPUs."""
    runs = {"ct-1": "cacheflush-1vcpu", "ct-2": "cacheflush-2vcpu", "sw": "cacheflush-setway"}
    bundle = make_vm_bundle(
        tmp_path / "b", runs, "6.1.0-50-arm64", kind="vms", scenario="cache-toggle"
    )
    section = cf_section.section([load_bundle(bundle)])
    assert section is not None and section.lost_events == 0
    assert sum("as designed" in f and "NOT" not in f for f in section.findings) == 3
    assert any("flushed nothing" in f for f in section.findings)
    totals = next(t for t in section.tables if "vCPUs and memory" in t.title).frame
    assert totals["vcpus"].to_list() == [1, 2, 2]
    assert section.plots[0].kind == "xy"
    teardown_only = make_vm_bundle(tmp_path / "t", {"t": "teardown-6.1-a76"}, "6.1.0-50-arm64")
    assert cf_section.section([load_bundle(teardown_only)]) is None
