"""The collection plan and the checks made before anything on the host changes."""

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
        "before-probe-page-cpu0",
        "guest",
        "after-guest-hotplug",
        "after-quiet-0",
        "after-quiet-1",
        "after-traced-0",
        "after-probe-page-cpu3",
        "after-probe-page-cpu0",
    ]


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
