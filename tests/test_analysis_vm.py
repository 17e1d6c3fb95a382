"""VM lifecycle analysis and the VMM output reader, on real traces and generated rows."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import polars as pl
import pytest
from report_bundles import make_bundle
from vm_bundles import FIXTURES, kvm_event, make_vm_bundle, open_fixture, timeline

from tracekit.analysis import vm
from tracekit.analysis.kvmtext import kvm_fields
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import load_bundle
from tracekit.ingest.vmm import parse_vmm_output, read_vmm_output
from tracekit.report.sections import vm as vm_section


def test_vmm_output_rows_carry_their_invocation() -> None:
    """Two invocations in one file: each VM row has its batch and that batch's vCPUs."""
    one = (FIXTURES / "teardown-6.1-a76.vmm.txt").read_text()
    two = (FIXTURES / "cacheflush-2vcpu.vmm.txt").read_text()
    out = parse_vmm_output(one + "not a record\n" + two)
    assert len(out.runs) == 2 and len(out.summaries) == 2
    assert out.vms.height == 10
    assert out.vms.filter(pl.col("batch") == 0)["ipa_bits"].to_list() == [32, 36, 40] * 3
    assert out.vms.filter(pl.col("batch") == 1)["vcpus"].to_list() == [2]
    assert out.vms["touch_kb"].to_list()[-1] == 256
    assert len(out.skipped) == 1 and "not a record" in out.skipped[0]


def test_vmm_output_errors_are_one_line() -> None:
    """A vm record before any run record, or a file with no run record, is refused."""
    with pytest.raises(TracekitError, match="before any `run` record"):
        parse_vmm_output("record=vm vm=0 ipa_bits=40 teardown_ns=1\n")
    with pytest.raises(TracekitError, match="no record=run line"):
        parse_vmm_output("hello\n")
    with pytest.raises(TracekitError, match=r"[Nn]o such file"):
        read_vmm_output(Path("/nonexistent/vmm.txt"))


def test_windows_follow_the_vmm_markers() -> None:
    """9 VMs with IPA sizes cycled, every step marked, in order, teardown after poweroff."""
    windows, threads = timeline(open_fixture("teardown-6.1-a76"))
    assert windows["vm_seq"].to_list() == list(range(9))
    assert windows["ipa_bits"].to_list() == [32, 36, 40] * 3
    steps = ["create_ts", "enter_ts", "poweroff_ts", "teardown_start_ts", "teardown_end_ts"]
    ordered = windows.select(pl.all_horizontal(pl.col(a) < pl.col(b) for a, b in pairwise(steps)))
    assert ordered.to_series().all()
    # One vCPU thread per VM, each a new thread, none of them the VMM's main thread.
    assert threads.height == 9 and threads["pid"].n_unique() == 9
    assert not set(threads["pid"]) & set(windows["vmm_pid"])


def test_vm_indices_restart_per_invocation() -> None:
    """Two VMM invocations in one trace: vm=0 twice, two distinct vm_seq windows."""
    rows = [
        (100, 10, "tracekit-vmm: vm=0 event=create ipa_bits=40 vcpus=1"),
        (200, 10, "tracekit-vmm: vm=0 event=teardown-start"),
        (300, 10, "tracekit-vmm: vm=0 event=teardown-end"),
        (400, 20, "tracekit-vmm: vm=0 event=create ipa_bits=44 vcpus=1"),
        (500, 20, "tracekit-vmm: vm=0 event=teardown-start"),
        (700, 20, "tracekit-vmm: vm=0 event=teardown-end"),
        (800, 20, "someone else's marker"),
    ]
    prints = pl.DataFrame(rows, schema=["ts", "common_pid", "buf"], orient="row")
    windows = vm.vm_windows(vm.vmm_markers(prints))
    assert windows["vmm_pid"].to_list() == [10, 20]
    assert windows["ipa_bits"].to_list() == [40, 44]
    assert windows["teardown_marker_ns"].to_list() == [100, 200]


def test_events_go_to_the_vcpu_whose_thread_emitted_them() -> None:
    """Two vCPUs each write MAIR, TCR, TTBR0, SCTLR: four cache-toggle events each."""
    trace = open_fixture("cacheflush-2vcpu")
    windows, threads = timeline(trace)
    toggles = vm.attribute(kvm_event(trace, "kvm_toggle_cache"), windows, threads)
    per = toggles.group_by("vcpu").len().sort("vcpu")
    assert per.rows() == [(0, 4), (1, 4)]
    # The main thread's teardown probes belong to the VM, with no vCPU.
    frees = vm.attribute(trace.event("kvm_free_stage2_pgd"), windows, threads)
    assert frees["vm_seq"].to_list() == [0] and frees["vcpu"].to_list() == [None]


def test_events_outside_any_vm_get_no_vm() -> None:
    """A thread the markers never named, or a VMM event after teardown-end, is nobody's."""
    trace = open_fixture("teardown-6.1-a76")
    windows, threads = timeline(trace)
    late = windows["teardown_end_ts"].max() + 1
    rows = pl.DataFrame(
        {"ts": [late, windows["create_ts"][0] + 1], "common_pid": [windows["vmm_pid"][0], 1]}
    )
    given = vm.attribute(rows, windows, threads)
    assert given["vm_seq"].to_list() == [None, None]


def test_exits_and_hvcs_per_vm() -> None:
    """Each VM of the mmu-on guest powers off with one HVC: PSCI SYSTEM_OFF."""
    trace = open_fixture("teardown-6.1-a76")
    windows, threads = timeline(trace)
    exits = vm.attribute(kvm_event(trace, "kvm_exit"), windows, threads)
    per = vm.exits_by_reason(exits)
    hvc = per.filter(pl.col("reason") == "TRAP HVC64")
    assert hvc["count"].to_list() == [1] * 9
    calls = vm.hvc_calls(vm.attribute(kvm_event(trace, "kvm_hvc_arm64"), windows, threads))
    assert calls["call"].unique().to_list() == ["SYSTEM_OFF"] and calls.height == 9


def test_lifecycle_counts_and_vmids() -> None:
    """Per VM: durations from markers, counts, and a new VMID for every VM."""
    trace = open_fixture("teardown-6.1-a76")
    windows, threads = timeline(trace)
    counted = {"exits": vm.attribute(kvm_event(trace, "kvm_exit"), windows, threads)}
    updates = vm.attribute(trace.event("kvm_arm_vmid_update"), windows, threads)
    bits = vm.infer_vmid_bits(updates)
    assert bits == 16
    table = vm.lifecycle(windows, counted, vm.vm_vmids(updates, bits))
    assert (table["teardown_marker_ns"] > 0).all() and (table["exits"] >= 1).all()
    assert table["guest_faults"].null_count() == 9  # not given: null, never 0
    vmids = table["vmid"].to_list()
    assert vmids == sorted(vmids) and len(set(vmids)) == 9
    assert vm.vmid_rollovers(updates, bits).is_empty()


def test_vmid_rollover_on_a_generated_sequence() -> None:
    """8-bit VMIDs: ids of generation 1 then 2 (0 = not yet assigned) give one rollover."""
    ids = [0, 258, 259, 0, 511, 259, 514, 515, 0, 516]
    updates = pl.DataFrame({"ts": list(range(len(ids))), "vmid_id": ids})
    rolls = vm.vmid_rollovers(updates, 8)
    assert rolls.rows() == [(6, 1, 2)]
    assert vm.infer_vmid_bits(updates) == 8


def test_missing_markers_name_the_event() -> None:
    """No trace_marker events: the error names `print` and how to get the markers."""
    with pytest.raises(TracekitError, match=r"print \(the VMM's trace markers"):
        vm.marker_event(["kvm_exit", "sched_switch"])
    empty = vm.vmm_markers(pl.DataFrame({"ts": [1], "common_pid": [1], "buf": ["hello"]}))
    with pytest.raises(TracekitError, match="tracekit-vmm markers"):
        vm.check_markers(empty)


def test_text_kvm_exit_gets_binary_columns() -> None:
    """tracefs text `TRAP: HSR_EC: 0x0016 (HVC64)` -> ret 2, esr_ec 0x16, as binary."""
    text = pl.DataFrame({"fields": ["TRAP: HSR_EC: 0x0016 (HVC64), PC: 0x0000000040000090"]})
    row = kvm_fields("kvm_exit", text).row(0, named=True)
    assert (row["ret"], row["esr_ec"], row["vcpu_pc"]) == (2, 0x16, 0x40000090)
    binary = pl.DataFrame({"ret": [0], "esr_ec": [0]})
    assert kvm_fields("kvm_exit", binary).equals(binary)


def test_section_lists_each_vm_run(tmp_path: Path) -> None:
    """The vm section names the runs and says the host was emulated; None without VMM runs."""
    bundle = make_vm_bundle(tmp_path / "b", {"teardown": "teardown-6.1-a76"}, "6.1.0-50-arm64")
    section = vm_section.section([load_bundle(bundle)])
    assert section is not None and section.lost_events == 0
    text = "\n".join(section.findings)
    assert "teardown: 9 VMs" in text and "SYSTEM_OFF x9" in text and "emulated host" in text
    assert any("EL2" in u for u in section.unknowns)
    plain = make_bundle(tmp_path / "plain", runs=2, factor=1.0)
    assert vm_section.section([load_bundle(plain)]) is None


def test_cache_toggles_count_only_changes_of_the_cache_state(tmp_path: Path) -> None:
    """2 vCPUs x (MAIR, TCR, TTBR0, SCTLR) traps = 8 events, of which 2 turned caches on."""
    trace = open_fixture("cacheflush-2vcpu")
    windows, threads = timeline(trace)
    toggles = vm.attribute(kvm_event(trace, "kvm_toggle_cache"), windows, threads)
    assert toggles.height == 8
    table = vm.lifecycle(windows, {"cache_toggles": toggles}, None)
    assert table["cache_toggles"].to_list() == [2]
    never = toggles.select("row", "ts", "vm_seq").clear()  # enabled, never fired: no fields
    assert vm.lifecycle(windows, {"cache_toggles": never}, None)["cache_toggles"].to_list() == [0]
    bundle = make_vm_bundle(tmp_path / "b", {"flush": "cacheflush-2vcpu"}, "6.1.0-50-arm64")
    section = vm_section.section([load_bundle(bundle)])
    assert section is not None
    assert "2 cache toggles" in "\n".join(section.findings)


def test_hvc_calls_of_an_event_enabled_but_never_fired() -> None:
    """No kvm_hvc_arm64 row (so no field columns): no calls, not an error."""
    empty = pl.DataFrame(schema={"row": pl.Int64, "ts": pl.Int64, "vm_seq": pl.Int64})
    assert vm.hvc_calls(empty).is_empty()


def test_tracepoint_found_under_its_qualified_name() -> None:
    """kvm_toggle_cache is both a tracepoint and a kprobe: the tracepoint is the one read."""
    from tracekit.report.sections.vmruns import tracepoint_name

    names = ["kvm:kvm_toggle_cache", "kvm_exit", "tracekit:kvm_toggle_cache"]
    assert tracepoint_name(names, "kvm_toggle_cache") == "kvm:kvm_toggle_cache"
    assert tracepoint_name(names, "kvm_exit") == "kvm_exit"
    assert tracepoint_name(["tracekit:kvm_toggle_cache"], "kvm_toggle_cache") is None


def test_a_vm_that_outlives_its_run_is_said_to_be_running() -> None:
    """A background guest's start run has its create and entry, not its end."""
    from tracekit.report.sections.vm import _run_and_teardown

    running = {"setup_ns": 30_000_000, "run_ns": None, "teardown_marker_ns": None}
    assert _run_and_teardown(running) == "still running when this run's trace ended"
    stopped = {"setup_ns": 1, "run_ns": 2_000_000, "teardown_marker_ns": 500_000, "stopped": True}
    assert _run_and_teardown(stopped) == "run 2.0 ms (stopped by a signal), teardown 0.5 ms"


def test_vmids_read_at_return_count_when_entries_show_zero() -> None:
    """6.12: each VM's one kvm_arm_vmid_update reads 0 at entry; the return has its VMID."""
    entries = pl.DataFrame({"ts": [10, 30], "common_pid": [7, 7], "vmid_id": [0, 0]})
    returns = pl.DataFrame({"ts": [11, 31], "common_pid": [7, 7], "vmid_id": [0x1FF, 0x201]})
    assert vm.vmid_rollovers(entries, 8).is_empty()  # the entry probe alone sees nothing
    readings = vm.vmid_readings(entries, returns)
    assert readings is not None and readings["ts"].to_list() == [10, 11, 30, 31]
    assert vm.vmid_rollovers(readings, 8).rows() == [(31, 1, 2)]
    assert vm.vmid_readings(None, None) is None
    assert vm.vmid_readings(entries, None) is not None  # 6.1: entries only


def test_stage2_mapping_sizes_per_vm_and_the_probe_misses_beside_them() -> None:
    """kvm_pgtable_stage2_map's size argument: pages and blocks counted per VM (outside
    any VM: left out); the section says the sizes and the entry probe's misses."""
    maps = pl.DataFrame(
        {
            "vm_seq": [0, 0, 0, 0, 0, 1, None],
            "size": [4096, 4096, 4096, 2 << 20, 2 << 20, 4096, 4096],
        },
        schema={"vm_seq": pl.Int32, "size": pl.UInt64},
    )
    per = vm.stage2_mappings(maps)
    assert per.rows() == [(0, 4096, 3, 12288), (0, 2 << 20, 2, 4 << 20), (1, 4096, 1, 4096)]
    assert [vm.size_name(s) for s in (4096, 2 << 20, 1 << 30, 1000)] == [
        "4 KiB", "2 MiB", "1 GiB", "1000 B"
    ]  # fmt: skip
    line, table = vm_section._stage2_maps(maps, {"tracekit/kvm_pgtable_stage2_map": 2}, "g")
    assert line == (
        "g: stage-2 map calls (kvm_pgtable_stage2_map) by size: 4 x 4 KiB, 2 x 2 MiB;"
        " the kprobe missed 2 call(s) (kprobe_profile)"
    )
    assert table is not None and table.frame["size"].to_list() == ["4 KiB", "2 MiB", "4 KiB"]
    none, _ = vm_section._stage2_maps(maps.clear(), None, "g")
    assert none == "g: no stage-2 map call seen (kvm_pgtable_stage2_map)"


def test_missed_vmid_probe_hits_are_said_with_the_vmids() -> None:
    """A VMID reading the kprobe missed can hide a VMID change or a rollover."""
    missed = {"tracekit/kvm_arm_vmid_update": 0, "tracekit/kvm_arm_vmid_update_ret": 3}
    assert vm.vmid_misses(missed) == (
        "the VMID kprobes missed hits (kvm_arm_vmid_update_ret 3; kprobe_profile):"
        " readings not taken"
    )
    assert vm.vmid_misses({"tracekit/kvm_arm_vmid_update": 0}) is None
    assert vm.vmid_misses(None) is None
