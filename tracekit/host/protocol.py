"""The experiment as data: scenarios, phases and the ordered list of runs they make.

The report's protocol (../shared/BRIEF.md), made rigorous: quiet runs (cyclictest and
stress-ng only) give the headline numbers, traced runs give the attribution, probe
slots measure broadcast-TLBI cost without spoiling the latency numbers, and the guest
runs once, traced, between the "before" and "after" phases.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.cpus import format_cpu_list
from tracekit.errors import TracekitError

# Events of a traced run: the rt CPU's wake-up path, what the other CPUs do, the guest.
TRACED_EVENTS: tuple[str, ...] = (
    "sched/sched_switch",
    "sched/sched_waking",
    "sched/sched_wakeup",
    "irq/irq_handler_entry",
    "irq/irq_handler_exit",
    "irq/softirq_entry",
    "irq/softirq_exit",
    "timer/hrtimer_expire_entry",
    "timer/hrtimer_expire_exit",
    "timer/hrtimer_start",
    "ipi/ipi_raise",
    "ipi/ipi_entry",
    "ipi/ipi_exit",
    "power/cpu_idle",
    "kvm",
    # arm64 has no TLB-flush tracepoint: these syscalls are the stand-in for broadcast
    # TLBI activity on the stress CPUs.
    "syscalls/sys_enter_mprotect",
    "syscalls/sys_exit_mprotect",
    "syscalls/sys_enter_munmap",
    "syscalls/sys_exit_munmap",
    "syscalls/sys_enter_madvise",
    "syscalls/sys_exit_madvise",
)

# Host functions around TLB-related hypervisor calls and VMID assignment; the collector
# probes those the running kernel offers (names differ between kernel versions). Those
# with a tracepoint of their own (kvm_toggle_cache, kvm_set_way_flush) are not probed.
KPROBE_CANDIDATES: tuple[str, ...] = (
    "kvm_arm_vmid_update",
    "kvm_init_stage2_mmu",
    "kvm_free_stage2_pgd",
    "kvm_uninit_stage2_mmu",
    "kvm_arch_flush_shadow_all",
    "kvm_arch_destroy_vm",
    "__kvm_tlb_flush_vmid",
    "__kvm_flush_vm_context",
)

AFTER_GUEST_ACTIONS = ("none", "hotplug", "rollover")
PROBE_MODES = ("page", "range", "munmap")


@dataclass(frozen=True)
class Scenario:
    """A named experiment: its phases, guest variant, and what a traced run records."""

    name: str
    description: str
    phases: tuple[str, ...]
    guest_variant: str
    events: tuple[str, ...] = TRACED_EVENTS
    kprobes: tuple[str, ...] = KPROBE_CANDIDATES
    probe_modes: tuple[str, ...] = ("page",)


SCENARIOS: dict[str, Scenario] = {
    "main": Scenario(
        name="main",
        description=(
            "does one guest that turns its stage-1 MMU on leave the host's broadcast "
            "TLB invalidations slower? before -> guest -> after"
        ),
        phases=("before", "guest", "after"),
        guest_variant="mmu-on",
    ),
}


@dataclass(frozen=True)
class Roles:
    """Which CPU does what; checked before anything on the host changes."""

    rt_cpu: int
    stress_cpus: tuple[int, ...]
    guest_cpus: tuple[int, ...]

    def check(self, online: list[int]) -> None:
        """Reject overlapping roles and CPUs that are not online, with one clear line."""
        wanted = {self.rt_cpu, *self.stress_cpus, *self.guest_cpus}
        absent = sorted(wanted - set(online))
        if absent:
            raise TracekitError(
                f"CPU {format_cpu_list(absent)} is not online here (online: "
                f"{format_cpu_list(online)}); choose CPUs from the online list"
            )
        if not self.stress_cpus:
            raise TracekitError("--stress-cpus is empty; name at least one stress CPU")
        if self.rt_cpu in self.stress_cpus:
            raise TracekitError(
                f"--rt-cpu {self.rt_cpu} is also a stress CPU; the isolated CPU must only "
                "run cyclictest"
            )
        if self.rt_cpu in self.guest_cpus:
            raise TracekitError(
                f"--rt-cpu {self.rt_cpu} is also a guest CPU; run the guest elsewhere "
                "(the report runs it on one of the stress CPUs)"
            )


@dataclass(frozen=True)
class PlannedRun:
    """One step of a collection, in the order it runs."""

    run_id: str
    phase: str
    kind: str  # quiet, traced, probe, guest, after-guest
    index: int
    detail: dict[str, object] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for --dry-run and progress output."""
        extra = " ".join(f"{k}={v}" for k, v in self.detail.items())
        return f"{self.run_id:<24} {self.phase:<7} {self.kind:<11} {extra}".rstrip()


def plan_runs(
    scenario: Scenario, roles: Roles, runs: int, traced_runs: int, after_guest: str
) -> list[PlannedRun]:
    """The ordered runs of a collection: per phase quiet, traced, then probe slots."""
    if after_guest not in AFTER_GUEST_ACTIONS:
        raise TracekitError(
            f"unknown --after-guest {after_guest!r}; choose one of {', '.join(AFTER_GUEST_ACTIONS)}"
        )
    planned: list[PlannedRun] = []
    for phase in scenario.phases:
        if phase == "guest":
            planned.append(PlannedRun("guest", phase, "guest", 0, {"cpus": roles.guest_cpus}))
            if after_guest != "none":
                planned.append(PlannedRun(f"after-guest-{after_guest}", phase, "after-guest", 0))
            continue
        planned += [PlannedRun(f"{phase}-quiet-{i}", phase, "quiet", i) for i in range(runs)]
        planned += [
            PlannedRun(f"{phase}-traced-{i}", phase, "traced", i) for i in range(traced_runs)
        ]
        for mode in scenario.probe_modes:
            for cpu in (roles.rt_cpu, roles.stress_cpus[0]):
                planned.append(
                    PlannedRun(f"{phase}-probe-{mode}-cpu{cpu}", phase, "probe", 0, {"cpu": cpu})
                )
    return planned
