"""`tracekit collect`: run the experiment on the arm64 host and record it into a bundle.

Everything that can be checked is checked before the host is touched (root, tracefs,
/dev/kvm, tools, CPU roles, the guest file). Then, under one cleanup stack, each planned
run (tracekit/host/protocol.py) executes in order; the bundle's manifest is saved after
every run, so Ctrl-C or SIGTERM leaves a bundle marked incomplete and a host as it was.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tracekit.bundle import (
    PROBE_GROUP,
    TRACED_KINDS,
    BundleWriter,
    Manifest,
    RunKind,
    RunRecord,
    files_below,
    run_dir,
    run_path,
)
from tracekit.errors import TracekitError
from tracekit.guests import GuestVariant, read_variant, vmm_guest_argv
from tracekit.host import tools as toolbox
from tracekit.host.board import Board
from tracekit.host.capture import Capture, capture_record, check_capture, new_capture
from tracekit.host.cleanup import CleanupStack, Interrupted
from tracekit.host.facts import (
    check_freshness,
    describe_host,
    host_facts,
    jsonable,
    online_cpus,
)
from tracekit.host.graph import GraphChoice, apply_graph, choose_graph
from tracekit.host.guestruns import BackgroundGuest
from tracekit.host.instance import Instance
from tracekit.host.kvmstate import read_enable_virt_at_load, read_ipa_limit
from tracekit.host.preflight import check_kpatch_for, read_idle_usage, read_kpatch
from tracekit.host.probes import (
    KernelSymbols,
    ProbeDefinition,
    define_kprobes,
    read_misses,
    remove_leftovers,
)
from tracekit.host.protocol import (
    EL2_CALLER_RETURNS,
    PlannedRun,
    Roles,
    Scenario,
    ScenarioParams,
    action_cpus,
    format_ints,
    host_side,
    plan_runs,
    scenario_named,
    user_probes_unseen,
    with_probe_modes,
)
from tracekit.host.runners import RUNNERS, Outcome, RunContext
from tracekit.host.tracefs import Tracefs, require_root

# Runs at whose end no guest runs any more: later runs count their start from it.
GUEST_ENDS = (RunKind.GUEST, RunKind.GUEST_STOP)
# Slack on top of a run's duration before a tool that did not stop is an error.
RUN_GRACE_SECONDS = 60
# The guest that loops on TLBIs, --tlbi-count of them (reproducer/guests/tlbi-loop.S).
TLBI_LOOP_VARIANT = "tlbi-loop"
# Fetch arguments for probes whose argument layout is stable across kernels.
KPROBE_ARGS = {
    "kvm_arm_vmid_update": "vmid_id=+0($arg1):u64",
    # (pgt, addr, size, phys, prot, mc[, flags]) in 6.1 and 6.12: the stage-2 mapping
    # sizes the kernel used (4 KiB pages or 2 MiB blocks, by backing and alignment).
    "kvm_pgtable_stage2_map": "ipa=$arg2:x64 size=$arg3:u64",
}
# The same fetches read at the function's return, where the kernel can (6.10+, "Support
# $argN in return probe"): the VMID after kvm_arm_vmid_update gave one. Needed on 6.12,
# whose kvm_arch_vcpu_load makes the call once per vCPU load (upstream fa808ed4e199,
# "Ensure a VMID is allocated before programming VTTBR_EL2", backported to 6.12.y): a
# new VM's only call there reads 0 at entry, so only the return shows its VMID. 6.1
# calls it before every guest entry, so entries after the first show it there.
KRETPROBE_ARGS = {"kvm_arm_vmid_update": "vmid_id=+0($arg1):u64"}
RETURN_ARGS_SINCE = (6, 10)


@dataclass
class CollectOptions:
    """Everything `tracekit collect` was asked to do (recorded in the manifest)."""

    rt_cpu: int
    stress_cpus: list[int]
    guest_cpus: list[int]
    output: Path
    guest: Path | None = None
    runs: int = 8
    traced_runs: int = 2
    duration_s: int = 20
    interval_us: int = 1000
    after_guest: str = "none"
    scenario: str = "main"
    events: list[str] = field(default_factory=list)
    kprobes: list[str] = field(default_factory=list)
    perf_counters: bool = False
    buffer_kb: int = 16384
    allow_dirty: bool = False
    dry_run: bool = False
    vmm: str | None = None
    probe: str | None = None
    probe_args: Path | None = None  # `tracekit symbols probe-args` output
    rollover_max_vms: int = 70000  # 16-bit VMIDs roll over after 65535 VMs
    function_graph: bool = False
    capture: str = "raw"  # one of CAPTURES
    # Scenario parameters; empty or None: the scenario's default.
    ipa_bits: list[int] = field(default_factory=list)
    vcpus: list[int] = field(default_factory=list)
    touch_kb: list[int] = field(default_factory=list)
    repeat: int | None = None
    tlbi_count: int | None = None
    vm_budget_s: int | None = None
    hold_vm: bool | None = None  # vm-churn: None is the scenario's default (held)
    probe_pages: list[int] = field(default_factory=list)  # range/munmap slots' page counts
    probe_modes: list[str] = field(default_factory=list)  # empty: the scenario's own
    knobs: list[str] = field(default_factory=list)  # NAME=VALUE over the guest's preset
    backing: str = "4k"  # guest RAM: 4k, thp, hugetlb or default (reproducer/README.md)
    vmid: int | None = None  # the guest's VMID: vmid-1 throwaway VMs run first
    board: Board | None = None  # --dry-run for another machine: its CPUs and IPA limit


def boottime_ns() -> int:
    """Now on the trace clock (ftrace 'boot' == CLOCK_BOOTTIME)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def resolve_guest(options: CollectOptions, scenario: Scenario) -> tuple[Path, GuestVariant | None]:
    """The guest ELF to run: given, or the scenario's variant from reproducer/build; a
    dry run plans without it (None: not built here)."""
    path = options.guest or toolbox.REPRODUCER_BUILD / "guests" / f"{scenario.guest_variant}.elf"
    if not path.is_file() and options.dry_run:
        return path, None
    if not path.is_file():
        raise TracekitError(
            f"guest {path} not found; build the reproducer (`make -C reproducer`) or give --guest"
        )
    return path, read_variant(path)


def check_options(options: CollectOptions) -> tuple[Scenario, Roles, ScenarioParams]:
    """Validate options before anything on the host changes."""
    scenario = with_probe_modes(scenario_named(options.scenario), tuple(options.probe_modes))
    if options.runs < 1 or options.traced_runs < 0 or options.duration_s < 1:
        raise TracekitError("--runs and --duration must be at least 1, --traced-runs at least 0")
    check_capture(options.capture, options.after_guest)
    check_kpatch_for(options.after_guest, read_kpatch(), read_enable_virt_at_load())
    roles = Roles(options.rt_cpu, tuple(options.stress_cpus), tuple(options.guest_cpus))
    if options.board is not None and not options.dry_run:
        raise TracekitError(
            "--board-cpus/--board-ipa-bits/--board-facts plan for another machine: add --dry-run"
        )
    roles.check(options.board.online if options.board else online_cpus())
    params = scenario.defaults.merged(
        ipa_bits=tuple(options.ipa_bits),
        vcpus=tuple(options.vcpus),
        touch_kb=tuple(options.touch_kb),
        repeat=options.repeat,
        tlbi_count=options.tlbi_count,
        vm_budget_s=options.vm_budget_s,
        probe_pages=tuple(options.probe_pages),
        hold_vm=options.hold_vm,
    )
    if params.hold_vm and scenario.name != "vm-churn":
        raise TracekitError("--hold-vm is for the vm-churn scenario only")
    for axis in ("ipa_bits", "vcpus", "touch_kb"):
        if axis not in scenario.sweep:
            params.single(axis)  # one value where the scenario does not sweep it
    return scenario, roles, params


def check_guest(variant: GuestVariant, params: ScenarioParams, knobs: Sequence[str] = ()) -> None:
    """A guest whose knobs say it issues TLBIs must get a count of them (no silent 0)."""
    if variant.knob_layout:
        tlbi, count = effective_tlbi(variant, params, knobs)
        if tlbi != "none" and _is_zero(count):
            raise TracekitError(
                f"guest {variant.variant} runs with tlbi={tlbi} but a TLBI count of 0, so it "
                "issues none; give --tlbi-count N or --knob tlbi_count=N (or --knob tlbi=none)"
            )
    elif variant.variant == TLBI_LOOP_VARIANT and params.tlbi_count == 0:
        # An old guest without a knob block: its TLBIs come from --tlbi-count alone.
        raise TracekitError(
            f"guest {variant.variant} issues --tlbi-count TLBIs, and that is 0 here; "
            "give --tlbi-count N"
        )


def _is_zero(count: str) -> bool:
    """Whether a knob's count text is 0 (a malformed one is the VMM's to refuse)."""
    try:
        return int(count, 0) == 0
    except ValueError:
        return False


def effective_tlbi(
    variant: GuestVariant, params: ScenarioParams, knobs: Sequence[str]
) -> tuple[str, str]:
    """The TLBI and count a knob guest runs with, in the VMM's order: preset, flag, --knob."""
    values = variant.knob_values
    if params.explicit("tlbi_count"):
        values["tlbi_count"] = str(params.tlbi_count)
    values |= parse_knobs(knobs)
    return values.get("tlbi", "none"), values.get("tlbi_count", "0")


def parse_knobs(knobs: Sequence[str]) -> dict[str, str]:
    """--knob NAME=VALUE settings as a dict, or one line for a malformed one."""
    parsed = {}
    for text in knobs:
        name, sep, value = text.partition("=")
        if not sep or not name:
            raise TracekitError(f"--knob {text!r}: write NAME=VALUE, e.g. --knob pages=64")
        parsed[name] = value
    return parsed


def guest_options(options: CollectOptions) -> list[str]:
    """The VMM options for the guest's knobs and RAM backing, checked before anything runs."""
    return vmm_guest_argv(None, parse_knobs(options.knobs), options.backing)


def require_arm64() -> None:
    """A real collection runs on the arm64 host; --dry-run and the library run anywhere."""
    machine = platform.machine()
    if machine not in ("aarch64", "arm64"):
        raise TracekitError(
            f"this machine is {machine}, not arm64: collect runs on the arm64 host (a board "
            "or `tracekit vhost run`); --dry-run plans a collection anywhere"
        )


def resolve_ipa_sizes(
    scenario: Scenario, params: ScenarioParams, board: Board | None = None
) -> ScenarioParams:
    """IPA sizes within what the host's KVM accepts (this host's, or the board's planned
    for); the default spread reaches its limit."""
    if "ipa_bits" not in scenario.sweep:
        return params
    limit = board.ipa_limit if board is not None else read_ipa_limit()
    too_large = [bits for bits in params.ipa_bits if limit and bits > limit]
    if too_large:
        raise TracekitError(
            f"--ipa-bits {format_ints(tuple(too_large))}: this host's KVM accepts at most "
            f"{limit} bits (KVM_CAP_ARM_VM_IPA_SIZE); the cortex CPU models stop at 40, "
            "QEMU's `max` goes to 48 (52 with LPA2)"
        )
    return params.with_ipa_limit(limit)


def kprobe_fetch_args(probe_args: Path | None) -> dict[str, str]:
    """Fetch arguments per probed function: stable defaults, then the --probe-args file."""
    fetch = dict(KPROBE_ARGS)
    if probe_args is not None:
        from tracekit.symbols.probeargs import read_probe_args

        fetch.update({f: " ".join(args) for f, args in read_probe_args(probe_args).items()})
    return fetch


def kprobe_lines(
    functions: Sequence[str],
    returns: set[str],
    fetch: dict[str, str],
    symbols: KernelSymbols,
    release: str,
) -> list[str]:
    """kprobe_events lines: an entry probe per function the kernel has, a return probe where
    asked or where KRETPROBE_ARGS reads something at return and the kernel can fetch it."""
    ret_fetch = KRETPROBE_ARGS if return_args_supported(release) else {}
    lines = []
    for function in dict.fromkeys(functions):
        if not symbols.has(function):
            continue
        lines.append(f"p:{PROBE_GROUP}/{function} {function} {fetch.get(function, '')}".strip())
        if function in returns or function in ret_fetch:
            ret_args = ret_fetch.get(function, "")
            lines.append(f"r:{PROBE_GROUP}/{function}_ret {function} {ret_args}".strip())
    return lines


def return_args_supported(release: str) -> bool:
    """Whether this kernel's return probes fetch entry arguments ($argN): 6.10 and later."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return bool(match) and (int(match[1]), int(match[2])) >= RETURN_ARGS_SINCE


def require_kvm() -> None:
    """/dev/kvm must exist: the experiment runs a guest."""
    if not Path("/dev/kvm").exists():
        raise TracekitError(
            "/dev/kvm does not exist: KVM is not available on this host (kernel without "
            "KVM, such as Debian's rt flavour, or not booted at EL2); the guest cannot run"
        )


def collect(options: CollectOptions, echo: Callable[[str], None] = print) -> Path | None:
    """Run the whole collection; returns the bundle path (None for --dry-run)."""
    scenario, roles, params = check_options(options)
    guest_path, variant = resolve_guest(options, scenario)
    if variant is not None:
        check_guest(variant, params, options.knobs)
    vmm_options = guest_options(options)  # bad knobs fail here
    params = resolve_ipa_sizes(scenario, params, options.board)
    plan = plan_runs(
        scenario,
        roles,
        options.runs,
        options.traced_runs,
        options.after_guest,
        params,
        options.vmid,
    )
    kprobe_fetch_args(options.probe_args)  # a bad file fails here, before any change
    if options.dry_run:
        echo(f"scenario {scenario.name}: {scenario.description}")
        echo(f"parameters: {describe_params(scenario, params)}")
        if variant is None:
            echo(
                f"guest {guest_path}: not built here, so its knobs are not checked"
                " (`tracekit board-pack` builds it into the board's archive)"
            )
        else:
            echo(f"guest {guest_path} (variant {variant.variant}): {' '.join(vmm_options)}")
        for planned in plan:
            echo("  " + planned.describe())
        return None
    assert variant is not None  # only a dry run goes without the guest
    require_arm64()
    require_root()
    require_kvm()
    tools = toolbox.find_tools(
        options.vmm, options.probe, options.perf_counters, options.capture == "trace-cmd"
    )
    with CleanupStack.journaled() as stack:
        tracefs = Tracefs.open(stack)
        for leftover in remove_leftovers(tracefs):
            echo(f"removed a leftover of a killed run: {leftover}")
        facts = host_facts(tools, options.rt_cpu, tracefs)
        for line in describe_host(facts):
            echo(line)
        check_freshness(facts, scenario.needs_fresh_host, options.allow_dirty)
        manifest = Manifest(
            host=facts,
            options=jsonable(asdict(options)),
            scenario={
                **jsonable(asdict(scenario)),
                # The variant that ran, from the guest's own note (--guest may differ
                # from the scenario's default).
                "guest_variant": variant.variant,
                "guest_revision": variant.revision,
                "guest_preset": variant.preset,
                "backing": options.backing,
                # The CPUs the after-guest action acts on (its signatures' "target").
                "action_cpus": list(action_cpus(options.after_guest, roles)),
                "guest": str(guest_path),
                "parameters": jsonable(asdict(params)),
                "capture": capture_record(options.capture, tools.trace_cmd),
            },
        )
        writer = BundleWriter.create(options.output, manifest)
        try:
            session = Session(
                options, scenario, roles, tools, variant, guest_path, stack, tracefs, echo, params
            )
            session.setup(writer)
            started = time.monotonic()
            for index, planned in enumerate(plan, 1):
                elapsed = time.monotonic() - started
                echo(f"[{index}/{len(plan)} +{elapsed:.0f}s] {planned.describe()}")
                session.execute(planned, writer)
        except Interrupted as stop:
            stack.stop_processes()  # their files are final only then: checksummed next
            writer.mark_incomplete(f"interrupted ({stop})")
            raise
        except BaseException as err:
            stack.stop_processes()
            writer.mark_incomplete(f"failed: {err}")
            raise
        writer.finish(runs_listed=True)  # each run's files were listed at its end
    return options.output


def describe_params(scenario: Scenario, params: ScenarioParams) -> str:
    """The parameters that matter to this scenario, as the command line writes them."""
    shown = {"repeat": params.repeat, "vm-budget": f"{params.vm_budget_s}s"}
    for axis in scenario.sweep:
        shown[axis.replace("_", "-")] = format_ints(getattr(params, axis))
    if "during" in scenario.phases:
        shown = {"tlbi-count": params.tlbi_count}
    elif not scenario.sweep and "churn" not in scenario.phases:
        return "none beyond the runs"
    if "churn" in scenario.phases:
        shown["hold-vm" if params.hold_vm else "no-hold-vm"] = ""
    return " ".join(f"--{name} {value}".rstrip() for name, value in shown.items())


class Session:
    """One collection in progress: the instance, the probes, and each run's frame.

    A run's own work is its kind's runner (tracekit/host/runners.py); the Session starts
    and ends its capture, writes its markers and records it in the manifest.
    """

    def __init__(
        self,
        options: CollectOptions,
        scenario: Scenario,
        roles: Roles,
        tools: toolbox.ToolPaths,
        variant: GuestVariant,
        guest_path: Path,
        stack: CleanupStack,
        tracefs: Tracefs,
        echo: Callable[[str], None] = print,
        params: ScenarioParams | None = None,
    ) -> None:
        self.options = options
        self.params = params or scenario.defaults
        self.background: BackgroundGuest | None = None  # a during phase's guest
        self.scenario = scenario
        self.roles = roles
        self.tools = tools
        self.variant = variant
        self.guest_path = guest_path
        self.stack = stack
        self.tracefs = tracefs
        self.instance: Instance | None = None
        self.tracing = False  # trace_marker refuses writes (EBADF) while tracing is off
        self.capture: Capture | None = None
        self.echo = echo
        self.now = boottime_ns
        self.guest_options = guest_options(options)  # knobs and backing of every guest run
        self.kprobes_defined: list[ProbeDefinition] = []
        self.misses_so_far: dict[str, int] = {}  # kprobe_profile's counts at capture start
        self.guest_end_ns: int | None = None  # when the last guest run ended
        self.idle_at_guest_end: dict[str, int] = {}  # the guest CPUs' cpuidle usage then

    def setup(self, writer: BundleWriter) -> None:
        """Create the instance: clock, buffers, task names, kprobes and events."""
        instance = Instance.create(self.tracefs)
        instance.set_trace_clock("boot")
        instance.set_buffer_size_kb(self.options.buffer_kb)
        instance.record_task_names()
        symbols = KernelSymbols.load(self.tracefs)
        mode = str(writer.manifest.host.get("kvm", {}).get("mode", "unknown"))
        kprobed, unseen = host_side(self.scenario.kprobes, mode, symbols.kallsyms)
        graph = GraphChoice("none", [], reason="--function-graph not given")
        if self.options.function_graph:
            graphed, unseen_graph = host_side(self.scenario.graph_functions, mode, symbols.kallsyms)
            unseen |= unseen_graph
            graph = choose_graph(instance, symbols, graphed)
            self.echo(f"function graph: {graph.method} on {', '.join(graph.functions) or '-'}")
        unseen |= user_probes_unseen(self.options.kprobes, mode, symbols.kallsyms)
        for function, why in unseen.items():
            self.echo(f"{function}: {why}")
        probes = self._kprobe_definitions(symbols, graph, kprobed)
        defined = define_kprobes(self.tracefs, probes, symbols).defined
        self.kprobes_defined = defined
        events = [e for e in self.scenario.events if instance.has_event(e)]
        missing = sorted(set(self.scenario.events) - set(events))
        events += self.options.events
        events += [probe.group_event for probe in defined]
        instance.enable_events(events)
        apply_graph(instance, graph)
        self.instance = instance
        writer.manifest.scenario["function_graph"] = jsonable(asdict(graph))
        writer.manifest.scenario["events_enabled"] = list(instance.events)
        writer.manifest.scenario["events_missing"] = missing
        writer.manifest.scenario["kprobes"] = probes
        # What the probes cannot see in this KVM mode (the hypervisor's own side).
        writer.manifest.scenario["el2_unseen"] = unseen
        writer.manifest.scenario["trace_marker"] = str(instance.trace_marker)
        writer.save()

    def _kprobe_definitions(
        self, symbols: KernelSymbols, graph: GraphChoice, kprobed: list[str]
    ) -> list[str]:
        """Entry (and return) probes on the functions the kernel offers (host-side ones)."""
        # The function-graph fallback adds entry and return probes on its functions.
        functions = [*kprobed, *graph.kprobe_functions()]
        returns = {*self.scenario.return_probes, *graph.kprobe_functions(), *EL2_CALLER_RETURNS}
        fetch = kprobe_fetch_args(self.options.probe_args)
        lines = kprobe_lines(functions, returns, fetch, symbols, platform.release())
        return [*self.options.kprobes, *lines]

    def execute(self, planned: PlannedRun, writer: BundleWriter) -> None:
        """Run one planned step, recording its files and times in the bundle."""
        runner = RUNNERS.get(RunKind(planned.kind))
        if runner is None:
            raise TracekitError(f"run {planned.run_id}: no runner for kind {planned.kind!r}")
        run = writer.start_run(
            RunRecord(
                planned.run_id,
                planned.phase,
                planned.kind,
                planned.index,
                params=jsonable(planned.detail),
            )
        )
        ctx = RunContext(writer, planned)
        capture = self._start_capture(writer, planned) if planned.kind in TRACED_KINDS else None
        self.capture = capture
        run.start_ns = boottime_ns()
        if self.guest_end_ns is not None:
            # Later slots are later: how long after the guest each run started, and what
            # idle states the guest CPUs entered meanwhile.
            run.since_guest_ns = run.start_ns - self.guest_end_ns
            run.idle_since_guest = self._idle_since_guest()
        self.marker(f"tracekit: run={planned.run_id} begin")
        outcome: Outcome | None = None
        try:
            outcome = runner(self, ctx)
        finally:
            self.marker(f"tracekit: run={planned.run_id} end")
            run.end_ns = boottime_ns()
            if capture is not None:
                self._finish_capture(capture, run)
            # Listed even when the run is interrupted: an incomplete bundle shows its files.
            run.files = _files_under(writer.root, run_path(writer.root, planned.run_id))
            if planned.kind in GUEST_ENDS:
                self.guest_end_ns = run.end_ns
                self.idle_at_guest_end = read_idle_usage(list(self.roles.guest_cpus))
        outcome = outcome or Outcome("ok")
        writer.end_run(run, outcome.status, outcome.note)

    def guest_vcpus(self) -> int | None:
        """vCPUs of a guest run outside a sweep: --vcpus if given, else one per guest CPU."""
        return self.params.single("vcpus") if self.options.vcpus else None

    def marker(self, text: str) -> None:
        """A marker in the instance's buffer, while tracing is on (the kernel refuses it else)."""
        if self.instance is not None and self.tracing:
            self.instance.write_marker(text)

    def _start_capture(self, writer: BundleWriter, planned: PlannedRun) -> Capture:
        """Start recording this run, read out by the chosen capture when it ends."""
        assert self.instance is not None
        capture = new_capture(
            self.options.capture,
            self.instance,
            writer.path(run_dir(planned.run_id)),
            self.tools.trace_cmd,
        )
        capture.start()
        # The probes stay armed between traced runs: count this run's misses from here.
        self.misses_so_far = read_misses(self.tracefs, self.kprobes_defined)
        self.instance.start()
        self.tracing = True
        return capture

    def _finish_capture(self, capture: Capture, run: RunRecord) -> None:
        """Stop recording, drain the buffers, and count what was lost per CPU."""
        assert self.instance is not None
        self.instance.stop()
        self.tracing = False
        capture.finish()
        for cpu in capture.cpus:
            stats = self.instance.cpu_stats(cpu)
            lost = int(stats.get("overrun", 0) + stats.get("dropped events", 0))
            run.lost_events[str(cpu)] = lost
        run.probe_misses = self._misses_since_last()
        # Clear the instance's counters so the next run starts at zero.
        self.tracefs.write(self.instance.rel("trace"), "")

    def _idle_since_guest(self) -> dict[str, int]:
        """Each guest CPU idle state's entries since the guest ended (cpuidle usage)."""
        now = read_idle_usage(list(self.roles.guest_cpus))
        return {name: count - self.idle_at_guest_end.get(name, 0) for name, count in now.items()}

    def _misses_since_last(self) -> dict[str, int]:
        """Each kprobe's misses since the capture started (the counts only ever grow)."""
        now = read_misses(self.tracefs, self.kprobes_defined)
        since = {name: count - self.misses_so_far.get(name, 0) for name, count in now.items()}
        self.misses_so_far = now
        return since

    def trace_marker(self) -> Path | None:
        """The instance's trace_marker for the VMM and the probe, while tracing is on."""
        return self.instance.trace_marker if self.instance and self.tracing else None

    def spawn(self, argv: list[str], stdout: Path) -> subprocess.Popen[bytes]:
        """Start a tool with its output in the bundle; the cleanup stack stops it."""
        writer_argv = stdout.with_suffix(stdout.suffix + ".argv")
        writer_argv.write_text(json.dumps(argv) + "\n")
        with stdout.open("wb") as out:
            return self.stack.spawn(argv, stdout=out, stderr=subprocess.STDOUT)

    def wait(
        self,
        proc: subprocess.Popen[bytes],
        name: str,
        duration_s: int,
        ok_codes: tuple[int, ...] = (0,),
    ) -> None:
        """Wait for a tool; a non-zero exit or a hang is an error naming the tool."""
        try:
            code = proc.wait(timeout=duration_s + RUN_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            raise TracekitError(
                f"{name} did not finish within {duration_s + RUN_GRACE_SECONDS} s; it was stopped"
            ) from None
        if code not in ok_codes:
            raise TracekitError(
                f"{name} failed with exit status {code}; see its output in the bundle"
            )


def _files_under(root: Path, directory: Path) -> list[str]:
    """The files below a directory of the bundle, relative to the bundle, sorted."""
    return sorted(p.relative_to(root).as_posix() for p in files_below(directory))
