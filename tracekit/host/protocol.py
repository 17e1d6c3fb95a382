"""The experiment as data: scenarios, phases and the ordered list of runs they make.

The report's protocol (../shared/BRIEF.md), made rigorous: quiet runs (cyclictest and
stress-ng only) give the headline numbers, traced runs give the attribution, probe
slots measure broadcast-TLBI cost without spoiling the latency numbers, and the guest
runs once, traced, between the "before" and "after" phases.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace

from tracekit.bundle import RunKind
from tracekit.cpus import format_cpu_list
from tracekit.errors import TracekitError
from tracekit.host.afterguest import TLBI_ACTIONS, tlbi_request

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
    # The host's stage-2 mappings of the guest's RAM, with their sizes (collect.KPROBE_ARGS).
    "kvm_pgtable_stage2_map",
)

# The paths function_graph (or entry/return probes) may follow, by concern. Names differ
# between kernel versions (6.1 frees stage 2 in kvm_free_stage2_pgd, 6.12 in
# kvm_uninit_stage2_mmu); only those the running kernel offers are used.
TLB_FLUSH_PATH: tuple[str, ...] = (
    "kvm_flush_remote_tlbs",
    "kvm_arch_flush_remote_tlbs",
    "kvm_tlb_flush_vmid_range",
    "__kvm_tlb_flush_vmid",
    "__kvm_flush_vm_context",
)
STAGE2_TEARDOWN_PATH: tuple[str, ...] = (
    "kvm_free_stage2_pgd",
    "kvm_uninit_stage2_mmu",
    "kvm_pgtable_stage2_destroy",
)
# kvm_toggle_cache and kvm_set_way_flush call stage2_flush_vm: a walk of the whole VM.
CACHE_FLUSH_PATH: tuple[str, ...] = ("kvm_toggle_cache", "kvm_set_way_flush", "stage2_flush_vm")

# Hypervisor calls: outside VHE they run at EL2, where kprobes cannot reach. kallsyms
# tells which functions these are: each has an nVHE hypercall handler,
# __kvm_nvhe_handle_NAME (hyp/nvhe/hyp-main.c, 6.1 and 6.12), and its unprefixed symbol
# is the VHE copy, which never runs in nVHE, hVHE or protected mode. A bare __kvm_nvhe_
# twin is not enough: pgtable.c, memcpy and the like are built into both, and the host
# runs its own copy of kvm_pgtable_stage2_map in nVHE.
EL2_MODES = ("nvhe", "hvhe", "protected")
HYPCALL_HANDLER = "__kvm_nvhe_handle_"
# Without kallsyms, the hypercalls tracekit's own lists name.
KNOWN_HYPCALLS = (
    "__kvm_tlb_flush_vmid",
    "__kvm_tlb_flush_vmid_ipa",
    "__kvm_tlb_flush_vmid_ipa_nsh",
    "__kvm_tlb_flush_vmid_range",
    "__kvm_flush_vm_context",
    "__kvm_flush_cpu_context",
)
# The host-side callers of those probed in their place, the kvm_call_hyp sites kprobes
# do see (6.1: mmu.c kvm_flush_remote_tlbs, and pgtable.c's break-before-make inside
# kvm_pgtable_stage2_map, stage2_map_walk_table_pre replacing a table by a block; 6.12:
# mmu.c kvm_arch_flush_remote_tlbs and pgtable.c kvm_tlb_flush_vmid_range, the fallback
# without FEAT_TLBIRANGE. The rollover's __kvm_flush_vm_context is called by vmid.c's
# static flush_context from new_vmid, so from kvm_arm_vmid_update.) What EL2 then
# executes is unseen by ftrace.
EL2_CALLERS: dict[str, tuple[str, ...]] = {
    "__kvm_tlb_flush_vmid": (
        "kvm_flush_remote_tlbs",
        "kvm_arch_flush_remote_tlbs",
        "kvm_tlb_flush_vmid_range",
        "kvm_pgtable_stage2_map",
    ),
    "__kvm_flush_vm_context": ("kvm_arm_vmid_update",),
}

# Their return is probed too: the ground truth counts an EL2 flush for a caller only
# inside its entry-to-return window on the same CPU (analysis/groundtruth.probe_checks).
EL2_CALLER_RETURNS = tuple(dict.fromkeys(c for cs in EL2_CALLERS.values() for c in cs))


def el2_only(function: str, kallsyms: Collection[str]) -> bool:
    """Whether a function is a hypercall (EL2 code outside VHE): kallsyms has its nVHE
    handler; without kallsyms, whether it is one of KNOWN_HYPCALLS."""
    if kallsyms:
        return f"{HYPCALL_HANDLER}{function}" in kallsyms
    return function in KNOWN_HYPCALLS


def host_side(
    functions: tuple[str, ...], kvm_mode: str, kallsyms: Collection[str] = ()
) -> tuple[list[str], dict[str, str]]:
    """The functions to probe in this KVM mode, and what each EL2-only one left out means.

    Outside VHE an EL2-only function (el2_only) is replaced by its host-side callers, or
    left out when none is known. An unknown mode keeps it (it fires if the host is VHE),
    and says so.
    """
    mode = kvm_mode.rstrip("?")
    if mode not in EL2_MODES and mode != "unknown":
        return list(functions), {}
    kept: list[str] = []
    unseen: dict[str, str] = {}
    for function in functions:
        if not el2_only(function, kallsyms):
            kept.append(function)
            continue
        if mode == "unknown":
            kept.append(function)
            unseen[function] = "KVM's mode is unknown: probed, but it fires only with VHE"
            continue
        callers = defined_callers(function, kallsyms)
        kept += callers
        instead = (
            f"its host-side callers are probed instead: {', '.join(callers)}"
            if callers
            else "no host-side caller known to tracekit is in this kernel: not probed"
        )
        unseen[function] = (
            f"runs at EL2 in {mode} mode, unseen by ftrace (kallsyms names only its VHE "
            f"copy); {instead}"
        )
    return list(dict.fromkeys(kept)), unseen


def defined_callers(function: str, kallsyms: Collection[str]) -> tuple[str, ...]:
    """The host-side callers of an EL2-only function this kernel defines (kallsyms; 6.1
    has no kvm_arch_flush_remote_tlbs or kvm_tlb_flush_vmid_range); without kallsyms,
    every caller tracekit knows (the collector then probes those it finds)."""
    callers = EL2_CALLERS.get(function, ())
    return tuple(c for c in callers if c in kallsyms) if kallsyms else callers


def user_probes_unseen(
    lines: Iterable[str], kvm_mode: str, kallsyms: Collection[str]
) -> dict[str, str]:
    """The user's --kprobe lines on an EL2-only function in a mode where it never fires:
    placed as asked, and named as unseen (target -> why)."""
    mode = kvm_mode.rstrip("?")
    if mode not in EL2_MODES:
        return {}
    unseen = {}
    for line in lines:
        fields = line.split()
        target = fields[1].split(":")[-1].split("+")[0] if len(fields) > 1 else ""
        if target and el2_only(target, kallsyms):
            unseen[target] = (
                f"your --kprobe {fields[0]}: runs at EL2 in {mode} mode, so this probe "
                "(on its VHE copy) never fires; probe a host-side caller instead"
            )
    return unseen


# hotplug-other: the negative control of hotplug, a stress CPU that never ran the guest;
# rollover-minus-one: rollover's, the same throwaway VMs but one (no rollover).
AFTER_GUEST_ACTIONS = (
    "none",
    "hotplug",
    "hotplug-other",
    "rollover",
    "rollover-minus-one",
    *TLBI_ACTIONS,
)
ROLLOVER_ACTIONS = ("rollover", "rollover-minus-one")
PROBE_MODES = ("page", "range", "munmap")

# What each phase name does (tracekit/host/collect.py runs them):
# measure: quiet, traced and probe runs; guest: one guest run (then the after-guest action);
# during: a measure phase while a guest runs in the background; sweep: traced VMM runs over
# the scenario's parameter points; churn: one untraced run of `repeat` VMs in turn with
# cyclictest on the rt CPU (tracekit/host/churn.py).
PHASE_KINDS = {
    "before": "measure",
    "after": "measure",
    "during": "during",
    "guest": "guest",
    "sweep": "sweep",
    "churn": "churn",
}

# KVM's default IPA size (type 0 VMs) and the smallest the VMM's RAM (1 GiB + RAM) fits in.
DEFAULT_IPA_BITS = 40
SMALLEST_IPA_BITS = 32
# Range/munmap probe page counts: with 4 KiB pages the kernel's by-VA limit is 512 pages
# (MAX_TLBI_OPS on 6.1, MAX_DVM_OPS later): below it one TLBI per page (range TLBIs with
# FEAT_TLBIRANGE), at or above it one TLBI ASIDE1IS. 1 and 511 sit below, 513 above.
DEFAULT_PROBE_PAGES = (1, 511, 513)
PROBE_MAX_PAGES = 1 << 24  # tlbiprobe's --pages limit
# Guest RAM layout of the VMM (reproducer/README.md): the cache-toggle slices start 2 MiB in.
RAM_MB_DEFAULT = 16
TOUCH_AREA_OFFSET_KB = 2048
# The tlbi-loop guest of a during phase must outlast the phase: the VMM's maximum count,
# stopped by the collector when the phase's runs are done.
ENDLESS_TLBI_COUNT = 0xFFFFFFFF


@dataclass(frozen=True)
class ScenarioParams:
    """The knobs of a scenario's guest runs; the bundle records the values used."""

    ipa_bits: tuple[int, ...] = ()  # empty: a spread up to the host's limit
    vcpus: tuple[int, ...] = (1,)
    touch_kb: tuple[int, ...] = (0,)
    repeat: int = 1  # VMs per sweep point
    tlbi_count: int = 0
    vm_budget_s: int = 600  # wall-clock budget of one sweep point's VMM run
    probe_pages: tuple[int, ...] = ()  # pages per range/munmap probe slot; empty: default
    # vm-churn: the VMM keeps one idle, never-run VM open over the churn (--hold-vm), so
    # KVM's usage count never falls to 0 between VMs and EL2 is not brought up and torn
    # down on every CPU per VM, as the brief's kernel (enable_virt_at_load) does not.
    hold_vm: bool = False
    given: tuple[str, ...] = ()  # the parameters the user set (the rest are defaults)

    def explicit(self, name: str) -> bool:
        """Whether a parameter was given, or the scenario's default is not the plain one
        (ScenarioParams()'s, which leaves the guest preset's own value to the VMM)."""
        return name in self.given or getattr(self, name) != getattr(ScenarioParams(), name)

    def single(self, axis: str) -> int | None:
        """A swept parameter's one value outside a sweep (None: none given), or an error."""
        values: tuple[int, ...] = getattr(self, axis)
        if len(values) > 1:
            raise TracekitError(
                f"--{axis.replace('_', '-')} {format_ints(values)}: give one value; only a "
                "scenario that sweeps it (teardown, cache-toggle) takes several"
            )
        return values[0] if values else None

    def merged(self, **given: object) -> ScenarioParams:
        """These defaults with the options the user gave (None: not given)."""
        chosen = {k: v for k, v in given.items() if v is not None and v != ()}
        unknown = set(chosen) - set(self.__dataclass_fields__)
        if unknown:
            raise TracekitError(f"unknown scenario parameter(s): {', '.join(sorted(unknown))}")
        merged = replace(self, **chosen, given=tuple(sorted(chosen)))  # type: ignore[arg-type]
        merged.check()
        return merged

    def check(self) -> None:
        """Reject values the VMM would refuse, with the option's name."""
        if any(not SMALLEST_IPA_BITS <= b <= 52 for b in self.ipa_bits):
            raise TracekitError(
                f"--ipa-bits {format_ints(self.ipa_bits)}: sizes go from {SMALLEST_IPA_BITS} "
                "to 52 bits"
            )
        if any(v < 1 for v in self.vcpus) or any(k < 0 for k in self.touch_kb):
            raise TracekitError("--vcpus must be at least 1 and --touch-kb at least 0")
        if self.repeat < 1 or self.vm_budget_s < 1 or self.tlbi_count < 0:
            raise TracekitError("--repeat and --vm-budget must be at least 1")
        if any(not 1 <= n <= PROBE_MAX_PAGES for n in self.probe_pages):
            raise TracekitError(
                f"--probe-pages {format_ints(self.probe_pages)}: page counts go from 1 to"
                f" {PROBE_MAX_PAGES}"
            )

    def with_ipa_limit(self, limit: int | None) -> ScenarioParams:
        """Fill an empty IPA list with a spread up to the host's limit (40 if unknown)."""
        if self.ipa_bits:
            return self
        return replace(self, ipa_bits=ipa_spread(limit or DEFAULT_IPA_BITS))


def probe_pages_for(mode: str, params: ScenarioParams) -> tuple[int, ...]:
    """The page counts a probe mode's slots use: page mode one page, else the list."""
    if mode == "page":
        return (1,)
    return params.probe_pages or DEFAULT_PROBE_PAGES


def ipa_spread(limit: int) -> tuple[int, ...]:
    """Every 4 bits from 32 up to the host's limit, the limit itself included."""
    sizes = list(range(SMALLEST_IPA_BITS, limit, 4))
    return (*sizes, limit) if limit >= SMALLEST_IPA_BITS else (DEFAULT_IPA_BITS,)


def ram_mb_for(vcpus: int, touch_kb: int) -> int:
    """Guest RAM that holds every vCPU's touched slice (at least the VMM's 16 MiB)."""
    needed_kb = TOUCH_AREA_OFFSET_KB + vcpus * touch_kb
    return max(RAM_MB_DEFAULT, -(-needed_kb // 1024))


def format_ints(values: tuple[int, ...]) -> str:
    """1,2,4: how the command line writes a list of numbers."""
    return ",".join(str(v) for v in values)


@dataclass(frozen=True)
class Scenario:
    """A named experiment: its phases, guest variant, and what a traced run records."""

    name: str
    description: str
    phases: tuple[str, ...]
    guest_variant: str
    events: tuple[str, ...] = TRACED_EVENTS
    kprobes: tuple[str, ...] = KPROBE_CANDIDATES
    # Functions also probed on return, so their duration is in the trace.
    return_probes: tuple[str, ...] = (
        "kvm_free_stage2_pgd",
        "kvm_uninit_stage2_mmu",
        "kvm_arch_destroy_vm",
    )
    probe_modes: tuple[str, ...] = ("page",)
    # Probe slots on every CPU (else: the rt CPU, the guest CPUs and one control stress
    # CPU); a during phase leaves the busy guest CPUs out either way (probe_cpus).
    probe_everywhere: bool = False
    # Parameters a sweep phase varies, one traced VMM run per combination.
    sweep: tuple[str, ...] = ()
    graph_functions: tuple[str, ...] = TLB_FLUSH_PATH + STAGE2_TEARDOWN_PATH
    # A "before" phase assumes no VM has run since boot (the state lasts until reboot).
    needs_fresh_host: bool = True
    defaults: ScenarioParams = ScenarioParams()


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
    "teardown": Scenario(
        name="teardown",
        description=(
            "stage-2 teardown time versus the requested IPA size: VMs created, run and "
            "destroyed for each size, timed by the VMM and traced on the teardown path"
        ),
        phases=("sweep",),
        guest_variant="mmu-off",
        events=("kvm", "sched/sched_switch"),
        kprobes=("kvm_arch_destroy_vm", *STAGE2_TEARDOWN_PATH, "kvm_arm_vmid_update"),
        return_probes=("kvm_arch_destroy_vm", *STAGE2_TEARDOWN_PATH),
        sweep=("ipa_bits",),
        graph_functions=STAGE2_TEARDOWN_PATH,
        needs_fresh_host=False,
        defaults=ScenarioParams(repeat=3),
    ),
    "cache-toggle": Scenario(
        name="cache-toggle",
        description=(
            "full-VM cache flushes when every vCPU turns its caches on: set/way "
            "maintenance then M+C+I on each vCPU, for several vCPU counts and touched sizes"
        ),
        phases=("sweep",),
        guest_variant="cache-toggle",
        events=("kvm", "sched/sched_switch"),
        kprobes=(*CACHE_FLUSH_PATH, "kvm_arm_vmid_update"),
        return_probes=CACHE_FLUSH_PATH,
        sweep=("vcpus", "touch_kb"),
        graph_functions=CACHE_FLUSH_PATH + TLB_FLUSH_PATH,
        needs_fresh_host=False,
        defaults=ScenarioParams(vcpus=(1, 2, 4), touch_kb=(0, 4096), repeat=2),
    ),
    "guest-broadcast": Scenario(
        name="guest-broadcast",
        description=(
            "the load a guest's broadcast TLBIs put on every other CPU: the rt CPU's "
            "wake-ups and the probe cost per CPU before, during and after a TLBI-loop guest"
        ),
        phases=("before", "during", "after"),
        guest_variant="tlbi-loop",
        probe_everywhere=True,
        defaults=ScenarioParams(tlbi_count=ENDLESS_TLBI_COUNT),
    ),
    # The brief's cost of the fix: 500 VMs in turn, 32.1 ms each with it, 33.4 without.
    # Compared across fresh boots, one per teardown_flush state (reproducer/kpatch).
    "vm-churn": Scenario(
        name="vm-churn",
        description=(
            "what the teardown fix costs: VMs that turn their MMU on created, run and "
            "destroyed one after another, each timed by the VMM, with the rt CPU's "
            "cyclictest meanwhile; one bundle per teardown_flush state, each from a fresh boot"
        ),
        phases=("churn",),
        guest_variant="mmu-on",
        events=(),
        kprobes=(),
        return_probes=(),
        graph_functions=(),
        defaults=ScenarioParams(repeat=500, hold_vm=True),
    ),
}


def scenario_named(name: str) -> Scenario:
    """The scenario of that name, or one line listing the scenarios there are."""
    if name not in SCENARIOS:
        raise TracekitError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def with_probe_modes(scenario: Scenario, modes: tuple[str, ...]) -> Scenario:
    """The scenario with the probe modes the user chose (--probe-modes; empty: its own).

    Range and munmap slots run once per --probe-pages count, on both sides of the
    kernel's by-VA limit by default (DEFAULT_PROBE_PAGES); the manifest records the modes.
    """
    if not modes:
        return scenario
    unknown = [m for m in modes if m not in PROBE_MODES]
    if unknown or len(set(modes)) != len(modes):
        raise TracekitError(
            f"--probe-modes {','.join(modes)}: name each of {', '.join(PROBE_MODES)} at most "
            "once, separated by commas (e.g. page,range)"
        )
    return replace(scenario, probe_modes=modes)


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
    kind: RunKind
    index: int
    detail: dict[str, object] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for --dry-run and progress output."""
        extra = " ".join(f"{k}={_shown(v)}" for k, v in self.detail.items())
        return f"{self.run_id:<24} {self.phase:<7} {self.kind:<11} {extra}".rstrip()


def _shown(value: object) -> str:
    """A detail value as the command line writes it (CPU tuples as lists: 1,2)."""
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return str(value)


def plan_runs(
    scenario: Scenario,
    roles: Roles,
    runs: int,
    traced_runs: int,
    after_guest: str,
    params: ScenarioParams | None = None,
    vmid: int | None = None,
) -> list[PlannedRun]:
    """The ordered runs of a collection, phase by phase (see PHASE_KINDS).

    With `vmid` N, N-1 throwaway VMs run first, so the first guest gets VMID N.
    """
    if after_guest not in AFTER_GUEST_ACTIONS:
        raise TracekitError(
            f"unknown --after-guest {after_guest!r}; choose one of {', '.join(AFTER_GUEST_ACTIONS)}"
        )
    if after_guest == "hotplug-other":
        control_cpus(roles)  # fails here, before anything on the host changes
    if after_guest in TLBI_ACTIONS:
        tlbi_cpu(after_guest, roles)  # the CPU it needs, before anything runs
        tlbi_request(after_guest, 0, vmid)  # the VMID it needs, likewise
    if after_guest != "none" and "guest" not in scenario.phases:
        raise TracekitError(
            f"--after-guest {after_guest} follows a guest phase, which scenario "
            f"{scenario.name!r} does not have; leave it out (or use --scenario main)"
        )
    params = (params or scenario.defaults).with_ipa_limit(None)
    if "probe_pages" in params.given and set(scenario.probe_modes) <= {"page"}:
        raise TracekitError(
            "--probe-pages sets the range and munmap probe slots, and this collection probes "
            "in page mode only (one page): add --probe-modes page,range (or munmap), or "
            "leave --probe-pages out"
        )
    planned = vmid_prep_runs(scenario, roles, vmid)
    for phase in scenario.phases:
        kind = PHASE_KINDS.get(phase)
        if kind == "guest":
            planned.append(PlannedRun("guest", phase, RunKind.GUEST, 0, {"cpus": roles.guest_cpus}))
            if after_guest != "none":
                planned.append(
                    PlannedRun(after_guest_run_id(after_guest), phase, RunKind.AFTER_GUEST, 0)
                )
        elif kind == "sweep":
            planned += _sweep_runs(scenario, roles, params)
        elif kind == "during":
            start = {"cpus": roles.guest_cpus, "tlbi_count": params.tlbi_count}
            planned.append(PlannedRun(f"{phase}-guest-start", phase, RunKind.GUEST_START, 0, start))
            planned += _measure_runs(scenario, roles, phase, runs, traced_runs, params)
            planned.append(PlannedRun(f"{phase}-guest-stop", phase, RunKind.GUEST_STOP, 0))
        elif kind == "measure":
            planned += _measure_runs(scenario, roles, phase, runs, traced_runs, params)
        elif kind == "churn":
            detail = {"cpus": roles.guest_cpus, "rt_cpu": roles.rt_cpu, "repeat": params.repeat}
            planned.append(PlannedRun(phase, phase, RunKind.CHURN, 0, detail))
        else:
            raise TracekitError(f"scenario {scenario.name!r} has an unknown phase {phase!r}")
    return planned


# The allocator never hands out VMID 0 (arch/arm64/kvm/vmid.c reserves it), and 16 bits
# is the widest VMID; beyond the host's width the VMs would roll the VMIDs over.
VMID_MAX = (1 << 16) - 1


def vmid_prep_runs(scenario: Scenario, roles: Roles, vmid: int | None) -> list[PlannedRun]:
    """The throwaway VMs before the first phase that make the first guest's VMID `vmid`.

    arch/arm64/kvm/vmid.c hands out VMIDs in order from 1 after boot (new_vmid searches
    the bitmap from the last one given; nothing is freed before a rollover), so after N-1
    VMs have run, the next one gets N.
    """
    if vmid is None:
        return []
    if not 1 <= vmid <= VMID_MAX:
        raise TracekitError(
            f"--vmid {vmid}: KVM gives guests VMIDs 1 to {VMID_MAX} (0 is reserved); choose one"
        )
    if "guest" not in scenario.phases or not scenario.needs_fresh_host:
        raise TracekitError(
            f"--vmid chooses the VMID of the guest phase after a fresh boot; scenario "
            f"{scenario.name!r} has none; leave --vmid out (or use --scenario main)"
        )
    detail: dict[str, object] = {"vms": vmid - 1, "vmid": vmid, "cpus": roles.guest_cpus}
    return [PlannedRun("vmid-prep", "prep", RunKind.VMID_PREP, 0, detail)]


def _measure_runs(
    scenario: Scenario,
    roles: Roles,
    phase: str,
    runs: int,
    traced_runs: int,
    params: ScenarioParams,
) -> list[PlannedRun]:
    """A measure phase: quiet runs, traced runs, then the probe slots (each with its mode)."""
    planned = [PlannedRun(f"{phase}-quiet-{i}", phase, RunKind.QUIET, i) for i in range(runs)]
    planned += [
        PlannedRun(f"{phase}-traced-{i}", phase, RunKind.TRACED, i) for i in range(traced_runs)
    ]
    for mode in scenario.probe_modes:
        for pages in probe_pages_for(mode, params):
            for cpu in probe_cpus(scenario, roles, phase):
                detail: dict[str, object] = {"cpu": cpu, "mode": mode, "pages": pages}
                # Page mode is always one page; the others name their count.
                slot = mode if mode == "page" else f"{mode}-{pages}p"
                run_id = f"{phase}-probe-{slot}-cpu{cpu}"
                planned.append(PlannedRun(run_id, phase, RunKind.PROBE, 0, detail))
    return planned


def after_guest_run_id(action: str) -> str:
    """The after-guest run's id: `tlbi:alle1@guest-cpu` has characters a run id may not."""
    return "after-guest-" + action.replace(":", "-").replace("@", "-")


def action_cpus(after_guest: str, roles: Roles) -> tuple[int, ...]:
    """The CPUs an after-guest action acts on (the manifest records them): hotplug's the
    guest's, hotplug-other's the control's, a tlbi: action's the one it is issued on."""
    if after_guest in TLBI_ACTIONS:
        return (tlbi_cpu(after_guest, roles),)
    if after_guest == "hotplug":
        return roles.guest_cpus
    if after_guest == "hotplug-other":
        return hotplug_control(roles)
    return ()


def control_cpus(roles: Roles) -> tuple[int, ...]:
    """The control CPU (tlbi:alle1@other-cpu, tlbi:vmalls12e1is@vmid): the first stress
    CPU that did not run the guest (hotplug-other takes the last: hotplug_control)."""
    return (other_stress_cpus(roles)[0],)


def other_stress_cpus(roles: Roles) -> list[int]:
    """The stress CPUs that did not run the guest, or one line when there is none."""
    others = [c for c in roles.stress_cpus if c not in roles.guest_cpus]
    if not others:
        raise TracekitError(
            "--after-guest hotplug-other, tlbi:alle1@other-cpu and tlbi:vmalls12e1is@vmid "
            "act on a stress CPU that did not run the guest, and every stress CPU ran it; "
            "give --stress-cpus one the guest does not use"
        )
    return others


def hotplug_control(roles: Roles) -> tuple[int, ...]:
    """hotplug-other's CPU: the last stress CPU that did not run the guest, not the first.

    With nohz_full the kernel keeps the timekeeping duty on a housekeeping CPU, usually
    the boot CPU 0, and refuses to take it offline (6.1 kernel/time/tick-sched.c
    tick_nohz_cpu_hotpluggable: EBUSY); the nvhe-a76 boot's hotplug of CPU 0 failed so.
    """
    return (other_stress_cpus(roles)[-1],)


def tlbi_cpu(action: str, roles: Roles) -> int:
    """The CPU a tlbi: action is issued on: the guest's for @guest-cpu, else a control CPU."""
    _, target = TLBI_ACTIONS[action]
    if target == "guest-cpu":
        return roles.guest_cpus[0]
    # @vmid is a broadcast, so any CPU gives the same invalidation; on 6.1 in nVHE with no
    # VM alive, the interface first brings EL2 up on the CPU it runs on (___kvm_hyp_init:
    # local TLBI ALLE2 and VMALLS12E1 of VMID 0), which on the guest's CPU would confound
    # the result: a control CPU keeps that off the CPU holding the state.
    return control_cpus(roles)[0]


def probe_cpus(scenario: Scenario, roles: Roles, phase: str = "before") -> list[int]:
    """Where the probe runs: the rt CPU, the CPUs that ran the guest, and a control.

    The brief places the state in the CPU that ran the guest, so that CPU is probed, and
    a stress CPU that never ran it beside it; probe_everywhere probes every CPU. In a
    during phase the guest CPUs run the background guest and are left out.
    """
    busy = set(roles.guest_cpus) if PHASE_KINDS.get(phase) == "during" else set()
    if scenario.probe_everywhere:
        chosen = [roles.rt_cpu, *sorted({*roles.stress_cpus, *roles.guest_cpus})]
    else:
        controls = [c for c in roles.stress_cpus if c not in roles.guest_cpus]
        chosen = [roles.rt_cpu, *roles.guest_cpus, *controls[:1]]
    return [cpu for cpu in dict.fromkeys(chosen) if cpu not in busy]


# How a sweep point's parameter appears in its run id.
SWEEP_LABELS = {"ipa_bits": "ipa{}", "vcpus": "vcpus{}", "touch_kb": "touch{}kb"}


def _sweep_runs(scenario: Scenario, roles: Roles, params: ScenarioParams) -> list[PlannedRun]:
    """One traced VMM run per combination of the swept parameters."""
    axes = [(axis, getattr(params, axis)) for axis in scenario.sweep]
    points: list[dict[str, int]] = [{}]
    for axis, values in axes:
        points = [{**point, axis: value} for point in points for value in values]
    planned = []
    for index, point in enumerate(points):
        vcpus = point.get("vcpus", 1)
        detail: dict[str, object] = {
            "vcpus": vcpus,
            "cpus": roles.guest_cpus,
            "ipa_bits": point.get("ipa_bits", DEFAULT_IPA_BITS),
            "touch_kb": point.get("touch_kb", 0),
            "ram_mb": ram_mb_for(vcpus, point.get("touch_kb", 0)),
            "repeat": params.repeat,
        }
        label = "-".join(SWEEP_LABELS[axis].format(point[axis]) for axis, _ in axes)
        planned.append(PlannedRun(f"sweep-{label}", "sweep", RunKind.VMS, index, detail))
    return planned
