"""The collection plan and the checks made before anything on the host changes."""

from dataclasses import replace
from pathlib import Path

import pytest

from tracekit.errors import TracekitError
from tracekit.host.protocol import SCENARIOS, Roles, control_cpus, plan_runs
from tracekit.host.tools import ToolPaths, probe_argv


def test_main_plan_order() -> None:
    roles = Roles(rt_cpu=3, stress_cpus=(0, 1, 2), guest_cpus=(1,))
    plan = plan_runs(SCENARIOS["main"], roles, runs=2, traced_runs=1, after_guest="hotplug")
    assert [p.run_id for p in plan] == [
        "before-quiet-0",
        "before-quiet-1",
        "before-traced-0",
        "before-probe-page-cpu3",
        "before-probe-page-cpu1",
        "before-probe-page-cpu0",
        "guest",
        "after-guest-hotplug",
        "after-quiet-0",
        "after-quiet-1",
        "after-traced-0",
        "after-probe-page-cpu3",
        "after-probe-page-cpu1",
        "after-probe-page-cpu0",
    ]


def test_the_guest_cpu_is_probed_beside_a_control_cpu() -> None:
    """The CPU that ran the guest (where the brief puts the state) has a slot, and so does
    a stress CPU that never ran it."""
    roles = Roles(rt_cpu=3, stress_cpus=(1, 2), guest_cpus=(1,))
    plan = plan_runs(SCENARIOS["main"], roles, runs=1, traced_runs=0, after_guest="none")
    assert [p.detail["cpu"] for p in plan if p.kind == "probe" and p.phase == "after"] == [3, 1, 2]


def test_every_probe_slot_keeps_its_own_mode() -> None:
    """A two-mode plan: each slot says its mode, and the runner takes it from the slot."""
    scenario = replace(SCENARIOS["main"], probe_modes=("page", "munmap"))
    roles = Roles(rt_cpu=3, stress_cpus=(0, 1, 2), guest_cpus=(1,))
    plan = plan_runs(scenario, roles, runs=1, traced_runs=0, after_guest="none")
    slots = [p for p in plan if p.kind == "probe" and p.phase == "before"]
    assert [(p.detail["mode"], p.detail["cpu"]) for p in slots[:4]] == [
        ("page", 3), ("page", 1), ("page", 0), ("munmap", 3)
    ]  # fmt: skip
    assert {p.detail["mode"] for p in slots[3:]} == {"munmap"}
    assert [p.run_id for p in slots[:3]] == [f"before-probe-page-cpu{c}" for c in (3, 1, 0)]


def test_range_and_munmap_slots_sit_on_both_sides_of_the_by_va_limit() -> None:
    """Review of 17, point 4: 512 pages is the by-VA limit; slots per count, in the id."""
    scenario = replace(SCENARIOS["main"], probe_modes=("page", "munmap"))
    roles = Roles(rt_cpu=3, stress_cpus=(0, 1, 2), guest_cpus=(1,))
    plan = plan_runs(scenario, roles, runs=1, traced_runs=0, after_guest="none")
    munmap = [p for p in plan if p.detail.get("mode") == "munmap" and p.phase == "after"]
    assert sorted({p.detail["pages"] for p in munmap}) == [1, 511, 513]
    assert "after-probe-munmap-511p-cpu1" in [p.run_id for p in munmap]
    assert len(munmap) == 3 * 3  # three counts on each of the three probed CPUs
    page = [p for p in plan if p.detail.get("mode") == "page"]
    assert {p.detail["pages"] for p in page} == {1}
    given = SCENARIOS["main"].defaults.merged(probe_pages=(16, 600))
    plan = plan_runs(scenario, roles, 1, 0, "none", given)
    assert sorted({p.detail["pages"] for p in plan if p.detail.get("mode") == "munmap"}) == [
        16,
        600,
    ]
    with pytest.raises(TracekitError, match=r"page mode only .* add --probe-modes"):
        plan_runs(SCENARIOS["main"], roles, 1, 0, "none", given)
    with pytest.raises(TracekitError, match="--probe-pages 0"):
        SCENARIOS["main"].defaults.merged(probe_pages=(0,))


def test_the_probe_gets_its_slots_page_count() -> None:
    """--pages reaches tlbiprobe for range/munmap; page mode refuses it, so never there."""
    tools = ToolPaths("cyclictest", "stress-ng", "vmm", "tlbiprobe", None)
    argv = probe_argv(tools, 3, [0], "munmap", 5, Path("p.bin"), None, 511)
    assert argv[argv.index("--pages") + 1] == "511"
    assert "--pages" not in probe_argv(tools, 3, [0], "page", 5, Path("p.bin"), None)


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        (Roles(3, (0, 1, 3), (1,)), "also a stress CPU"),
        (Roles(3, (0, 1, 2), (3,)), "also a guest CPU"),
        (Roles(7, (0, 1, 2), (1,)), "CPU 7 is not online"),
        (Roles(3, (), (1,)), "--stress-cpus is empty"),
    ],
)
def test_roles_rejected(roles: Roles, message: str) -> None:
    with pytest.raises(TracekitError, match=message):
        roles.check(online=[0, 1, 2, 3])


def test_unknown_after_guest() -> None:
    roles = Roles(3, (0, 1, 2), (1,))
    with pytest.raises(TracekitError, match="unknown --after-guest"):
        plan_runs(SCENARIOS["main"], roles, 1, 1, "reboot")


def test_vmid_prep_runs_first_with_its_count() -> None:
    """--vmid 5: four throwaway VMs before the before phase, on the guest CPUs."""
    roles = Roles(rt_cpu=3, stress_cpus=(0, 1, 2), guest_cpus=(1,))
    plan = plan_runs(SCENARIOS["main"], roles, 1, 0, "none", vmid=5)
    assert plan[0].run_id == "vmid-prep" and plan[0].kind == "vmid-prep"
    assert plan[0].detail == {"vms": 4, "vmid": 5, "cpus": (1,)}
    assert [p.kind for p in plan[1:]] == [
        p.kind for p in plan_runs(SCENARIOS["main"], roles, 1, 0, "none")
    ]


@pytest.mark.parametrize(
    ("scenario", "vmid", "message"),
    [
        ("main", 0, "0 is reserved"),
        ("main", 65536, "VMIDs 1 to 65535"),
        ("teardown", 3, "has none"),
    ],
)
def test_vmid_refused(scenario: str, vmid: int, message: str) -> None:
    """VMID 0 (reserved), beyond 16 bits, or a scenario without a fresh guest phase."""
    roles = Roles(rt_cpu=3, stress_cpus=(0, 1, 2), guest_cpus=(1,))
    with pytest.raises(TracekitError, match=message):
        plan_runs(SCENARIOS[scenario], roles, 1, 0, "none", vmid=vmid)


def test_hotplug_other_needs_a_stress_cpu_that_did_not_run_the_guest() -> None:
    """Review of 17, point 9: the control CPU is a stress CPU the guest never ran on."""
    roles = Roles(rt_cpu=3, stress_cpus=(1, 2), guest_cpus=(1,))
    plan = plan_runs(SCENARIOS["main"], roles, 1, 0, "hotplug-other")
    assert "after-guest-hotplug-other" in [p.run_id for p in plan]
    assert control_cpus(roles) == (2,)
    with pytest.raises(TracekitError, match="every stress CPU ran it"):
        plan_runs(SCENARIOS["main"], Roles(3, (1,), (1,)), 1, 0, "hotplug-other")


def test_el2_only_functions_give_way_to_their_host_side_callers_outside_vhe() -> None:
    """In nVHE/protected, __kvm_tlb_flush_vmid's kallsyms entry is the VHE copy: never fires."""
    from tracekit.host.protocol import KPROBE_CANDIDATES, host_side

    for mode in ("nvhe", "protected", "hvhe", "nvhe?"):
        probed, unseen = host_side(KPROBE_CANDIDATES, mode)
        assert "__kvm_tlb_flush_vmid" not in probed and "__kvm_flush_vm_context" not in probed
        assert {"kvm_flush_remote_tlbs", "kvm_arch_flush_remote_tlbs"} <= set(probed)
        assert probed.count("kvm_arm_vmid_update") == 1  # the rollover flush's caller
        assert set(unseen) == {"__kvm_tlb_flush_vmid", "__kvm_flush_vm_context"}
        assert "unseen by ftrace" in unseen["__kvm_tlb_flush_vmid"]
    probed, unseen = host_side(KPROBE_CANDIDATES, "vhe")
    assert probed == list(KPROBE_CANDIDATES) and unseen == {}
    probed, unseen = host_side(KPROBE_CANDIDATES, "unknown")
    assert (
        probed == list(KPROBE_CANDIDATES)
        and "fires only with VHE" in unseen["__kvm_flush_vm_context"]
    )


def test_el2_only_is_read_from_kallsyms_hypercall_handlers_user_probes_included() -> None:
    """A function with an nVHE hypercall handler in kallsyms is EL2-only outside VHE
    (vmid_ipa, flush_cpu_context: not in EL2_CALLERS); a bare __kvm_nvhe_ twin is not
    (the host runs its own kvm_pgtable_stage2_map in nVHE); user --kprobes are named."""
    from tracekit.host.protocol import host_side, user_probes_unseen

    # Names as 6.1.0-50's /proc/kallsyms lists them in the nvhe-a53 boot.
    kallsyms = {
        "__kvm_tlb_flush_vmid_ipa",
        "__kvm_nvhe___kvm_tlb_flush_vmid_ipa",
        "__kvm_nvhe_handle___kvm_tlb_flush_vmid_ipa",
        "__kvm_flush_cpu_context",
        "__kvm_nvhe_handle___kvm_flush_cpu_context",
        "__kvm_tlb_flush_vmid",
        "__kvm_nvhe_handle___kvm_tlb_flush_vmid",
        "kvm_pgtable_stage2_map",
        "__kvm_nvhe_kvm_pgtable_stage2_map",
    }
    wanted = (
        "__kvm_tlb_flush_vmid_ipa",
        "__kvm_flush_cpu_context",
        "__kvm_tlb_flush_vmid",
        "kvm_pgtable_stage2_map",
    )
    probed, unseen = host_side(wanted, "nvhe", kallsyms)
    assert "__kvm_tlb_flush_vmid_ipa" not in probed and "__kvm_flush_cpu_context" not in probed
    assert "not probed" in unseen["__kvm_tlb_flush_vmid_ipa"]
    assert "kvm_pgtable_stage2_map" in probed and "kvm_pgtable_stage2_map" not in unseen
    assert "kvm_pgtable_stage2_map" in unseen["__kvm_tlb_flush_vmid"]  # 6.1's BBM caller
    assert host_side(wanted, "vhe", kallsyms) == (list(wanted), {})
    lines = ["p:tracekit/mine __kvm_flush_cpu_context", "p:tracekit/map kvm_pgtable_stage2_map"]
    said = user_probes_unseen(lines, "protected", kallsyms)
    assert (
        list(said) == ["__kvm_flush_cpu_context"]
        and "never fires" in said["__kvm_flush_cpu_context"]
    )
    assert user_probes_unseen(lines, "vhe", kallsyms) == {}


def test_the_after_guest_actions_cpus_are_the_guests_or_the_controls() -> None:
    """hotplug acts on the guest CPU, hotplug-other on the last stress CPU that did not
    run the guest (the manifest records them for the ground truth's "target"): not the
    first, CPU 0, which with nohz_full keeps the timekeeping and cannot go offline (the
    nvhe-a76 boot's hotplug-other of CPU 0 failed with EBUSY)."""
    from tracekit.host.protocol import action_cpus

    roles = Roles(3, (0, 1, 2), (1,))
    assert action_cpus("hotplug", roles) == (1,)
    assert action_cpus("hotplug-other", roles) == (2,)
    assert action_cpus("tlbi:alle1@other-cpu", roles) == (0,)
    assert action_cpus("none", roles) == ()


def test_only_the_callers_the_kernel_defines_are_named_as_probed() -> None:
    """Review of 17, point 10: on 6.1 kvm_arch_flush_remote_tlbs and
    kvm_tlb_flush_vmid_range do not exist (6.12 names), so neither is planned nor named."""
    from tracekit.host.protocol import host_side

    # 6.1.176's: the hypercall handlers and the two callers it has (nvhe-a76 kallsyms).
    kallsyms = {
        "__kvm_nvhe_handle___kvm_tlb_flush_vmid",
        "__kvm_nvhe_handle___kvm_flush_vm_context",
        "kvm_flush_remote_tlbs",
        "kvm_pgtable_stage2_map",
        "kvm_arm_vmid_update",
    }
    probed, unseen = host_side(("__kvm_tlb_flush_vmid", "__kvm_flush_vm_context"), "nvhe", kallsyms)
    assert probed == ["kvm_flush_remote_tlbs", "kvm_pgtable_stage2_map", "kvm_arm_vmid_update"]
    said = unseen["__kvm_tlb_flush_vmid"]
    assert "probed instead: kvm_flush_remote_tlbs, kvm_pgtable_stage2_map" in said
    assert "kvm_arch_flush_remote_tlbs" not in said and "kvm_tlb_flush_vmid_range" not in said
    probed, unseen = host_side(
        ("__kvm_flush_vm_context",), "nvhe", kallsyms - {"kvm_arm_vmid_update"}
    )
    assert probed == [] and "is in this kernel: not probed" in unseen["__kvm_flush_vm_context"]
