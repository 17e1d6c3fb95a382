"""--after-guest tlbi:OP@TARGET and preflight's view of reproducer/kpatch's interface.

No kernel with the series runs here (the kpatch-marked boot tests run it): the
interface is a file, and these tests write and read files laid out as it is. The
interface texts are what the series' op_show and teardown_show print (6.1 patch 2, 3).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.analysis.gtsignatures import packaged_signatures
from tracekit.bundle import check_run_id
from tracekit.campaign.plan import AFTER_GUEST_ACTIONS as PLAN_ACTIONS
from tracekit.errors import TracekitError
from tracekit.host.afterguest import TLBI_ACTIONS, issue_maint, tlbi_request
from tracekit.host.preflight import check_kpatch_for, parse_kpatch, read_kpatch
from tracekit.host.protocol import AFTER_GUEST_ACTIONS, SCENARIOS, Roles, plan_runs, tlbi_cpu
from tracekit.vhost.kcustom import SERIES, built_suites

ROLES = Roles(rt_cpu=3, stress_cpus=(0, 1, 2), guest_cpus=(1,))
OP_TEXT = (
    "mode: nvhe\nvmid_bits: 16\n"
    "ops: alle1 alle1is vmalls12e1 vmalls12e1is vmalle1 vmalle1is iallu\n"
)


def test_requests_name_the_operation_cpu_and_vmid() -> None:
    """Each action is one request line: op, CPU, and for the VMID one, VMID and stage 2 off."""
    assert tlbi_request("tlbi:alle1@guest-cpu", 1, None) == "alle1 1"
    assert tlbi_request("tlbi:alle1@other-cpu", 0, 7) == "alle1 0"
    assert tlbi_request("tlbi:vmalls12e1is@vmid", 1, 7) == "vmalls12e1is 1 7 0"
    with pytest.raises(TracekitError, match="give --vmid N"):
        tlbi_request("tlbi:vmalls12e1is@vmid", 1, None)


def test_vmid_broadcast_is_issued_from_a_control_cpu() -> None:
    """Review of 20, #9: only alle1@guest-cpu runs on the guest's CPU (6.1's EL2 init off it)."""
    assert tlbi_cpu("tlbi:alle1@guest-cpu", ROLES) == 1
    assert tlbi_cpu("tlbi:alle1@other-cpu", ROLES) == 0
    assert tlbi_cpu("tlbi:vmalls12e1is@vmid", ROLES) == 0
    busy = Roles(rt_cpu=3, stress_cpus=(1,), guest_cpus=(1,))
    with pytest.raises(TracekitError, match="tlbi:vmalls12e1is@vmid act on a stress CPU"):
        plan_runs(SCENARIOS["main"], busy, 1, 0, "tlbi:vmalls12e1is@vmid", vmid=5)


def test_campaign_and_collect_offer_the_same_actions() -> None:
    """The campaign plan's copy of the list is the collector's."""
    assert tuple(PLAN_ACTIONS) == tuple(AFTER_GUEST_ACTIONS)
    assert set(TLBI_ACTIONS) <= set(AFTER_GUEST_ACTIONS)


@pytest.mark.parametrize("action", list(TLBI_ACTIONS))
def test_planned_after_guest_run_has_a_valid_id(action: str) -> None:
    """The run follows the guest, with an id a bundle accepts."""
    plan = plan_runs(SCENARIOS["main"], ROLES, runs=1, traced_runs=0, after_guest=action, vmid=5)
    after = [run for run in plan if run.run_id.startswith("after-guest-")]
    assert len(after) == 1
    assert check_run_id(after[0].run_id) == after[0].run_id
    assert ":" not in after[0].run_id and "@" not in after[0].run_id
    kinds = [run.run_id for run in plan]
    assert kinds.index(after[0].run_id) == kinds.index("guest") + 1


def test_plan_refuses_what_an_action_lacks() -> None:
    """The VMID one needs --vmid; the other-CPU control needs a CPU the guest did not use."""
    with pytest.raises(TracekitError, match="give --vmid N"):
        plan_runs(SCENARIOS["main"], ROLES, 1, 0, "tlbi:vmalls12e1is@vmid")
    busy = Roles(rt_cpu=3, stress_cpus=(1,), guest_cpus=(1,))
    with pytest.raises(TracekitError, match="tlbi:alle1@other-cpu and tlbi:vmalls12e1is@vmid act"):
        plan_runs(SCENARIOS["main"], busy, 1, 0, "tlbi:alle1@other-cpu")


def test_issue_writes_the_request_and_logs_its_times(tmp_path: Path) -> None:
    """One write of the request line; the log has it with the times around it."""
    op = tmp_path / "op"
    op.write_text("")
    ticks = iter([100, 250])
    log = issue_maint("alle1 1", lambda: next(ticks), op)
    assert op.read_text() == "alle1 1\n"
    assert log == ["alle1 1 issued at 100, done at 250"]


def test_issue_without_the_series_or_refused(tmp_path: Path) -> None:
    """No interface: one line naming the series; a failed write: one line with the reason."""
    with pytest.raises(TracekitError, match="reproducer/kpatch"):
        issue_maint("alle1 1", lambda: 0, tmp_path / "absent")
    with pytest.raises(
        TracekitError, match=r"EL2 maintenance 'alle1 1' failed \(EISDIR\): Is a directory"
    ):
        issue_maint("alle1 1", lambda: 0, tmp_path)


def test_a_malformed_request_says_what_malformed_means() -> None:
    """EINVAL (the series' answer to a request it cannot run as written) is named with what
    the interface refuses, not a bare "invalid argument". A real EINVAL: this process's own
    oom_score_adj refuses a word."""
    with pytest.raises(TracekitError) as raised:
        issue_maint("alle1 1 5", lambda: 0, Path("/proc/self/oom_score_adj"))
    text = str(raised.value)
    assert "'alle1 1 5' failed (EINVAL)" in text
    assert "a field the operation does not take" in text and "CPU number" in text


def test_preflight_reads_the_interface(tmp_path: Path) -> None:
    """Mode, VMID width, operations and the teardown switch with its count."""
    assert read_kpatch(tmp_path) is None
    (tmp_path / "op").write_text(OP_TEXT)
    switch = "off [alle1is] last-ran\nflushes: 3\nfailed: 1\nvmid_bits: 16\n"
    (tmp_path / "teardown_flush").write_text(switch)
    found = read_kpatch(tmp_path)
    assert found is not None
    assert (found.mode, found.vmid_bits) == ("nvhe", 16)
    assert "vmalls12e1is" in found.ops and len(found.ops) == 7
    assert (found.teardown_flush, found.teardown_flushes) == ("alle1is", 3)
    assert found.teardown_failures == 1  # counted by the series since review S1


def test_preflight_protected_mode_and_no_switch() -> None:
    """Protected mode says it refuses; a kernel without the teardown file has no switch."""
    found = parse_kpatch(OP_TEXT.replace("nvhe", "protected (refused)"), None)
    assert found.mode == "protected (refused)"
    assert (found.teardown_flush, found.teardown_flushes) == (None, None)


def test_preflight_takes_hvhe_as_nvhe() -> None:
    """6.12's hVHE (nVHE hyp code, E2H set) reads `mode: hvhe`; the switch acts there, and
    every action is offered (the hypercall path, as nVHE)."""
    found = parse_kpatch(OP_TEXT.replace("nvhe", "hvhe"), "[off] alle1is last-ran\nflushes: 0\n")
    assert (found.mode, found.teardown_flush) == ("hvhe", "off")
    for action in TLBI_ACTIONS:
        check_kpatch_for(action, found, "yes")


@pytest.mark.parametrize("series", sorted(SERIES[suite] for suite in built_suites()))
def test_each_series_action_has_its_signatures(series: str) -> None:
    """Every tlbi: action is checked against the ground truth on each series tracekit ships,
    nVHE and VHE, with and without REPEAT_TLBI: the series' own instruction once on the
    target; in nVHE 6.1 brings EL2 up first (no VM alive), 6.12 does not (EL2 kept up)."""
    signatures = packaged_signatures()
    for mode in ("nvhe", "vhe"):
        for action, (op, _) in TLBI_ACTIONS.items():
            found = signatures.candidates(series, mode, "cortex-a76", action)
            assert found, (series, mode, action)
            for signature in found:
                ours = [e for e in signature.expect if e.function == "__kvm_debug_maint"]
                assert ours[0].operation == f"TLBI {op.upper()}" and ours[0].count == 1
                init = [e for e in signature.expect if e.function == "___kvm_hyp_init"]
                assert bool(init) == ((series, mode) == ("6.1", "nvhe")), (mode, action)
        vmid = signatures.candidates(series, mode, "cortex-a76", "tlbi:vmalls12e1is@vmid")
        assert sorted(dict(s.requires)["repeat_tlbi"] for s in vmid) == [("no",), ("yes",)]


def test_preflight_says_the_switch_is_inactive_outside_nvhe() -> None:
    """Review of 20, #14: with VHE the series accepts only off and says so; the state keeps it."""
    found = parse_kpatch(OP_TEXT.replace("nvhe", "vhe"), "[off] alle1is last-ran (inactive: vhe)\n")
    assert found.teardown_flush == "off (inactive: vhe)"
    nvhe = parse_kpatch(OP_TEXT, "[off] alle1is last-ran\nflushes: 0\n")
    assert nvhe.teardown_flush == "off"


def test_report_header_names_the_series_and_switch(tmp_path: Path) -> None:
    """A bundle whose preflight found the series says so, with the teardown switch."""
    from report_bundles import edit_manifest, make_bundle

    from tracekit.ingest.bundle import load_bundle
    from tracekit.report.header import header_lines, host_line

    stock = load_bundle(make_bundle(tmp_path / "stock", 2, 1.0))
    assert "debug series" not in host_line(stock)
    patched = make_bundle(tmp_path / "kp", 2, 1.0)
    found = parse_kpatch(OP_TEXT, "off [alle1is] last-ran\nflushes: 0\n")

    def add(manifest: dict) -> None:
        """Put what preflight found in the manifest, as facts.py writes it."""
        manifest["host"]["kpatch"] = found.__dict__

    edit_manifest(patched, add)
    line = host_line(load_bundle(patched))
    assert line.endswith("; debug series (reproducer/kpatch) on, teardown_flush alle1is")
    both = header_lines([stock, load_bundle(patched)])
    assert sum("teardown_flush alle1is" in entry for entry in both) == 1


def test_preflight_refuses_an_action_this_kernel_cannot_do() -> None:
    """No series, protected mode, or an operation it lacks: one line before anything runs."""
    check_kpatch_for("hotplug", None, "yes")  # not a tlbi action: nothing to check
    with pytest.raises(TracekitError, match="--kernel bookworm:kpatch"):
        check_kpatch_for("tlbi:alle1@guest-cpu", None, "absent")
    refused = parse_kpatch(OP_TEXT.replace("nvhe", "protected (refused)"), None)
    with pytest.raises(TracekitError, match="refuses EL2 maintenance in protected mode"):
        check_kpatch_for("tlbi:alle1@guest-cpu", refused, "yes")
    older = parse_kpatch("mode: nvhe\nvmid_bits: 8\nops: alle1\n", None)
    check_kpatch_for("tlbi:alle1@other-cpu", older, "absent")
    with pytest.raises(TracekitError, match="offers alle1, not vmalls12e1is"):
        check_kpatch_for("tlbi:vmalls12e1is@vmid", older, "absent")


@pytest.mark.parametrize("mode", ["nvhe", "hvhe"])
def test_preflight_refuses_tlbi_where_each_operation_reinitialises_el2(mode: str) -> None:
    """6.12+ with kvm.enable_virt_at_load=0: the EL2 bring-up's ALLE1 on every CPU comes first."""
    found = parse_kpatch(OP_TEXT.replace("nvhe", mode), None)
    with pytest.raises(TracekitError, match="enable_virt_at_load=0 each operation first"):
        check_kpatch_for("tlbi:alle1@other-cpu", found, "no")
    check_kpatch_for("tlbi:alle1@other-cpu", found, "yes")
    check_kpatch_for("hotplug", found, "no")  # not a tlbi action


def test_preflight_keeps_tlbi_in_vhe_with_virtualisation_on_demand() -> None:
    """VHE's EL2 bring-up runs no ___kvm_hyp_init, so its operations stay isolated."""
    vhe = parse_kpatch(OP_TEXT.replace("nvhe", "vhe"), None)
    check_kpatch_for("tlbi:alle1@other-cpu", vhe, "no")
