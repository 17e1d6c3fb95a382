"""The collection plan and the checks made before anything on the host changes."""

from dataclasses import replace

import pytest

from tracekit.errors import TracekitError
from tracekit.host.protocol import SCENARIOS, Roles, plan_runs


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
    assert [(p.detail["mode"], p.detail["cpu"]) for p in slots] == [
        ("page", 3), ("page", 1), ("page", 0), ("munmap", 3), ("munmap", 1), ("munmap", 0)
    ]  # fmt: skip
    assert all(p.run_id == f"before-probe-{p.detail['mode']}-cpu{p.detail['cpu']}" for p in slots)


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
