"""`tracekit collect`: run the experiment on the arm64 host and record it into a bundle.

Everything that can be checked is checked before the host is touched (root, tracefs,
/dev/kvm, tools, CPU roles, the guest file). Then, under one cleanup stack, each planned
run (tracekit/host/protocol.py) executes in order; the bundle's manifest is saved after
every run, so Ctrl-C or SIGTERM leaves a bundle marked incomplete and a host as it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tracekit.bundle import BundleWriter, Manifest, RunRecord
from tracekit.errors import TracekitError
from tracekit.guests import GuestVariant, read_variant
from tracekit.host import tools as toolbox
from tracekit.host.afterguest import hotplug, open_vmid_watch, rollover
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
from tracekit.host.guestruns import (
    BackgroundGuest,
    BudgetOutcome,
    stopped_in_order,
    wait_within_budget,
)
from tracekit.host.instance import Instance
from tracekit.host.kvmstate import read_ipa_limit
from tracekit.host.probes import KernelSymbols, define_kprobes, remove_leftovers
from tracekit.host.protocol import (
    PlannedRun,
    Roles,
    Scenario,
    ScenarioParams,
    format_ints,
    plan_runs,
    scenario_named,
)
from tracekit.host.tracefs import Tracefs, require_root

# Slack on top of a run's duration before a tool that did not stop is an error.
RUN_GRACE_SECONDS = 60
# The VMM's own watchdog for one guest run (teardown is never cut short by it).
GUEST_TIMEOUT_SECONDS = 600

# PMU events for --perf-counters: generic names perf maps to each core's own events;
# those a PMU lacks are recorded as <not supported> (an emulated PMU has few).
PERF_EVENTS = ("cycles", "instructions", "dTLB-load-misses", "iTLB-load-misses")
# Runs recorded into a raw capture of their own.
TRACED_KINDS = ("traced", "guest", "after-guest", "vms", "guest-start", "guest-stop")
# Fetch arguments for probes whose argument layout is stable across kernels.
KPROBE_ARGS = {"kvm_arm_vmid_update": "vmid_id=+0($arg1):u64"}


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


def boottime_ns() -> int:
    """Now on the trace clock (ftrace 'boot' == CLOCK_BOOTTIME)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def resolve_guest(options: CollectOptions, scenario: Scenario) -> tuple[Path, GuestVariant]:
    """The guest ELF to run: given, or the scenario's variant from reproducer/build."""
    path = options.guest or toolbox.REPRODUCER_BUILD / "guests" / f"{scenario.guest_variant}.elf"
    if not path.is_file():
        raise TracekitError(
            f"guest {path} not found; build the reproducer (`make -C reproducer`) or give --guest"
        )
    return path, read_variant(path)


def check_options(options: CollectOptions) -> tuple[Scenario, Roles, ScenarioParams]:
    """Validate options before anything on the host changes."""
    scenario = scenario_named(options.scenario)
    if options.runs < 1 or options.traced_runs < 0 or options.duration_s < 1:
        raise TracekitError("--runs and --duration must be at least 1, --traced-runs at least 0")
    check_capture(options.capture, options.after_guest)
    roles = Roles(options.rt_cpu, tuple(options.stress_cpus), tuple(options.guest_cpus))
    roles.check(online_cpus())
    params = scenario.defaults.merged(
        ipa_bits=tuple(options.ipa_bits),
        vcpus=tuple(options.vcpus),
        touch_kb=tuple(options.touch_kb),
        repeat=options.repeat,
        tlbi_count=options.tlbi_count,
        vm_budget_s=options.vm_budget_s,
    )
    return scenario, roles, params


def resolve_ipa_sizes(scenario: Scenario, params: ScenarioParams) -> ScenarioParams:
    """IPA sizes within what this host's KVM accepts; the default spread reaches its limit."""
    if "ipa_bits" not in scenario.sweep:
        return params
    limit = read_ipa_limit()
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
    params = resolve_ipa_sizes(scenario, params)
    plan = plan_runs(
        scenario, roles, options.runs, options.traced_runs, options.after_guest, params
    )
    kprobe_fetch_args(options.probe_args)  # a bad file fails here, before any change
    if options.dry_run:
        echo(f"scenario {scenario.name}: {scenario.description}")
        echo(f"parameters: {describe_params(scenario, params)}")
        echo(f"guest {guest_path} (variant {variant.variant})")
        for planned in plan:
            echo("  " + planned.describe())
        return None
    require_root()
    require_kvm()
    tools = toolbox.find_tools(
        options.vmm, options.probe, options.perf_counters, options.capture == "trace-cmd"
    )
    with CleanupStack() as stack:
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
            writer.mark_incomplete(f"interrupted ({stop})")
            raise
        except BaseException as err:
            writer.mark_incomplete(f"failed: {err}")
            raise
        writer.finish()
    return options.output


def describe_params(scenario: Scenario, params: ScenarioParams) -> str:
    """The parameters that matter to this scenario, as the command line writes them."""
    shown = {"repeat": params.repeat, "vm-budget": f"{params.vm_budget_s}s"}
    for axis in scenario.sweep:
        shown[axis.replace("_", "-")] = format_ints(getattr(params, axis))
    if "during" in scenario.phases:
        shown = {"tlbi-count": params.tlbi_count}
    elif not scenario.sweep:
        return "none beyond the runs"
    return " ".join(f"--{name} {value}" for name, value in shown.items())


class Session:
    """One collection in progress: the instance, the probes, and how each run executes."""

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

    def setup(self, writer: BundleWriter) -> None:
        """Create the instance: clock, buffers, task names, kprobes and events."""
        instance = Instance.create(self.tracefs)
        instance.set_trace_clock("boot")
        instance.set_buffer_size_kb(self.options.buffer_kb)
        instance.record_task_names()
        symbols = KernelSymbols.load(self.tracefs)
        graph = GraphChoice("none", [], reason="--function-graph not given")
        if self.options.function_graph:
            graph = choose_graph(instance, symbols, list(self.scenario.graph_functions))
            self.echo(f"function graph: {graph.method} on {', '.join(graph.functions) or '-'}")
        probes = self._kprobe_definitions(symbols, graph)
        defined = define_kprobes(self.tracefs, probes).defined
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
        writer.manifest.scenario["trace_marker"] = str(instance.trace_marker)
        writer.save()

    def _kprobe_definitions(self, symbols: KernelSymbols, graph: GraphChoice) -> list[str]:
        """Entry (and return) probes on the scenario's functions the kernel offers."""
        lines = list(self.options.kprobes)
        fetch = kprobe_fetch_args(self.options.probe_args)
        # The function-graph fallback adds entry and return probes on its functions.
        functions = dict.fromkeys([*self.scenario.kprobes, *graph.kprobe_functions()])
        returns = {*self.scenario.return_probes, *graph.kprobe_functions()}
        for function in functions:
            if not symbols.has(function):
                continue
            args = fetch.get(function, "")
            lines.append(f"p:tracekit/{function} {function} {args}".strip())
            if function in returns:
                lines.append(f"r:tracekit/{function}_ret {function}")
        return lines

    def execute(self, planned: PlannedRun, writer: BundleWriter) -> None:
        """Run one planned step, recording its files and times in the bundle."""
        run = writer.start_run(
            RunRecord(
                planned.run_id,
                planned.phase,
                planned.kind,
                planned.index,
                params=jsonable(planned.detail),
            )
        )
        rundir = Path("runs") / planned.run_id
        traced = planned.kind in TRACED_KINDS
        status, note = "ok", ""
        capture = self._start_capture(writer, rundir) if traced else None
        self.capture = capture
        run.start_ns = boottime_ns()
        self._marker(f"tracekit: run={planned.run_id} begin")
        try:
            if planned.kind in ("quiet", "traced"):
                self._measure(writer, rundir)
            elif planned.kind == "probe":
                self._probe(writer, rundir, int(str(planned.detail["cpu"])))
            elif planned.kind == "guest":
                self._guest(writer, rundir)
            elif planned.kind == "after-guest":
                self._after_guest(writer, rundir)
            elif planned.kind == "vms":
                outcome = self._sweep_point(writer, rundir, planned.detail)
                status, note = outcome.status, outcome.note
            elif planned.kind == "guest-start":
                self._guest_start(writer, rundir)
            elif planned.kind == "guest-stop":
                self._guest_stop(writer, rundir)
        finally:
            self._marker(f"tracekit: run={planned.run_id} end")
            run.end_ns = boottime_ns()
            if capture is not None:
                self._finish_capture(capture, run)
        run.files = sorted(
            p.relative_to(writer.root).as_posix()
            for p in (writer.root / rundir).rglob("*")
            if p.is_file()
        )
        writer.end_run(run, status, note)

    def _marker(self, text: str) -> None:
        """A marker in the instance's buffer, while tracing is on (the kernel refuses it else)."""
        if self.instance is not None and self.tracing:
            self.instance.write_marker(text)

    def _start_capture(self, writer: BundleWriter, rundir: Path) -> Capture:
        """Start recording this run, read out by the chosen capture when it ends."""
        assert self.instance is not None
        capture = new_capture(
            self.options.capture, self.instance, writer.path(str(rundir)), self.tools.trace_cmd
        )
        capture.start()
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
        # Clear the instance's counters so the next run starts at zero.
        self.tracefs.write(self.instance.rel("trace"), "")

    def _measure(self, writer: BundleWriter, rundir: Path) -> None:
        """stress-ng on the stress CPUs and cyclictest on the rt CPU, for one duration."""
        opts = self.options
        perf = self._start_perf(writer, rundir) if self.tools.perf else None
        stress = self._spawn(
            toolbox.stress_argv(
                self.tools,
                list(self.roles.stress_cpus),
                opts.duration_s,
                writer.path(str(rundir / "stress-ng.yaml")),
            ),
            writer.path(str(rundir / "stress-ng.txt")),
        )
        # The histogram file has a line per bucket: written locally, kept compacted.
        histogram = Path(tempfile.gettempdir()) / f"tracekit-{os.getpid()}-cyclictest-hist.txt"
        self.stack.push(f"remove {histogram}", lambda: histogram.unlink(missing_ok=True))
        cyclic = self._spawn(
            toolbox.cyclictest_argv(
                self.tools,
                self.roles.rt_cpu,
                opts.interval_us,
                opts.duration_s,
                writer.path(str(rundir / "cyclictest.json")),
                histogram,
            ),
            writer.path(str(rundir / "cyclictest.txt")),
        )
        self._wait(cyclic, "cyclictest", opts.duration_s)
        writer.path(str(rundir / "cyclictest-hist.txt")).write_text(
            toolbox.compact_histogram(histogram.read_text())
        )
        histogram.unlink()
        self._wait(stress, "stress-ng", opts.duration_s)
        if perf is not None:
            # perf stat prints its last interval and exits on SIGINT, like Ctrl-C.
            perf.send_signal(signal.SIGINT)
            self._wait(perf, "perf stat", 0, ok_codes=(0, 130, -signal.SIGINT))

    def _start_perf(self, writer: BundleWriter, rundir: Path) -> subprocess.Popen[bytes]:
        """perf stat per CPU over every role's CPUs, in CSV, one line per second."""
        cpus = sorted({self.roles.rt_cpu, *self.roles.stress_cpus, *self.roles.guest_cpus})
        argv = toolbox.perf_stat_argv(
            self.tools, cpus, list(PERF_EVENTS), 1000, writer.path(str(rundir / "perf-stat.csv"))
        )
        return self._spawn(argv, writer.path(str(rundir / "perf-stat.txt")))

    def _probe(self, writer: BundleWriter, rundir: Path, cpu: int) -> None:
        """The broadcast-TLBI probe on one CPU, helpers on the other non-rt CPUs."""
        helpers = [c for c in self.roles.stress_cpus if c != cpu]
        mode = self.scenario.probe_modes[0]
        argv = toolbox.probe_argv(
            self.tools,
            cpu,
            helpers,
            mode,
            min(self.options.duration_s, 10),
            writer.path(str(rundir / "probe.bin")),
            self._trace_marker(),
        )
        proc = self._spawn(argv, writer.path(str(rundir / "probe.json")))
        self._wait(proc, "tlbiprobe", self.options.duration_s)

    def _guest(self, writer: BundleWriter, rundir: Path) -> None:
        """Run the guest once on the guest CPUs; its markers go into the trace."""
        argv = toolbox.vmm_argv(
            self.tools,
            self.guest_path,
            list(self.roles.guest_cpus),
            self._trace_marker(),
            extra=["--timeout", str(GUEST_TIMEOUT_SECONDS)],
        )
        proc = self._spawn(argv, writer.path(str(rundir / "vmm.txt")))
        self._wait(proc, "vmm", GUEST_TIMEOUT_SECONDS)

    def _sweep_point(
        self, writer: BundleWriter, rundir: Path, detail: dict[str, object]
    ) -> BudgetOutcome:
        """`repeat` VMs of one sweep point, timed by the VMM, within the time budget."""
        settings = toolbox.vmm_settings(
            ipa_bits=int(str(detail["ipa_bits"])),
            ram_mb=int(str(detail["ram_mb"])),
            touch_kb=int(str(detail["touch_kb"])),
            timeout=0,  # the VMM's watchdog off: the budget decides, and says so
        )
        argv = toolbox.vmm_argv(
            self.tools,
            self.guest_path,
            list(self.roles.guest_cpus),
            self._trace_marker(),
            repeat=self.params.repeat,
            extra=settings,
            vcpus=int(str(detail["vcpus"])),
        )
        output = writer.path(str(rundir / "vmm.txt"))
        proc = self._spawn(argv, output)
        outcome = wait_within_budget(proc, self.params.vm_budget_s, output, self.params.repeat)
        if outcome.status != "ok":
            self.echo(f"  OVER BUDGET: {outcome.note}")
        return outcome

    def _guest_start(self, writer: BundleWriter, rundir: Path) -> None:
        """Start the during phase's guest; it runs until _guest_stop (its markers traced)."""
        settings = toolbox.vmm_settings(tlbi_count=self.params.tlbi_count, timeout=0)
        argv = toolbox.vmm_argv(
            self.tools,
            self.guest_path,
            list(self.roles.guest_cpus),
            self._trace_marker(),
            extra=settings,
        )
        output = writer.path(str(rundir / "vmm.txt"))
        self.background = BackgroundGuest(
            self._spawn(argv, output), len(self.roles.guest_cpus), output
        )
        took = self.background.wait_running()
        self._marker(f"tracekit: background guest running after {took:.3f} s")

    def _guest_stop(self, writer: BundleWriter, rundir: Path) -> None:
        """Stop the during phase's guest; the kernel's teardown of it is in this run's trace."""
        if self.background is None:
            raise TracekitError("guest-stop without a running background guest (plan error)")
        self._marker("tracekit: stopping the background guest")
        code = self.background.stop()
        in_order = stopped_in_order(self.background.output)
        self.background = None
        writer.path(str(rundir / "guest-stop.json")).write_text(
            json.dumps(
                {
                    "vmm_exit_status": code,
                    "stopped_by": "SIGTERM",
                    # False: the VMM had to be killed, so its teardown markers are missing.
                    "torn_down_by_vmm": in_order,
                }
            )
            + "\n"
        )

    def _after_guest(self, writer: BundleWriter, rundir: Path) -> None:
        """The after-guest action: CPU hotplug, or a VMID rollover with throwaway VMs."""
        if self.options.after_guest == "hotplug":
            log = hotplug(self.roles.guest_cpus, self.stack, boottime_ns)
            writer.path(str(rundir / "hotplug.txt")).write_text("\n".join(log) + "\n")
            return
        watch = open_vmid_watch(self.tracefs)
        guest = self.guest_path.parent / "mmu-off.elf"
        if read_variant(guest).stage1 != "off":
            raise TracekitError(f"{guest} is not the MMU-off guest the rollover needs")
        output = writer.path(str(rundir / "vmm.txt"))

        def run_batch(count: int) -> None:
            """Create, run and destroy `count` MMU-off VMs, draining the trace after."""
            argv = toolbox.vmm_argv(
                self.tools, guest, list(self.roles.guest_cpus), None, repeat=count
            )
            batch = output.with_suffix(".batch")
            proc = self._spawn(argv, batch)
            self._wait(proc, "vmm (rollover)", GUEST_TIMEOUT_SECONDS)
            with output.open("ab") as log:
                log.write(batch.read_bytes())
            batch.unlink()
            # The last batch's command line stands for all of them (only --repeat varies).
            Path(f"{batch}.argv").replace(f"{output}.argv")
            if self.capture is not None:
                self.capture.drain()

        vmids, vms = rollover(run_batch, watch, self.options.rollover_max_vms, self.echo)
        writer.path(str(rundir / "rollover.json")).write_text(
            json.dumps({"vms": vms, "vmid_bits": vmids.bits, "vmid_ids": vmids.seen}) + "\n"
        )

    def _trace_marker(self) -> Path | None:
        """The instance's trace_marker for the VMM and the probe, while tracing is on."""
        return self.instance.trace_marker if self.instance and self.tracing else None

    def _spawn(self, argv: list[str], stdout: Path) -> subprocess.Popen[bytes]:
        """Start a tool with its output in the bundle; the cleanup stack stops it."""
        writer_argv = stdout.with_suffix(stdout.suffix + ".argv")
        writer_argv.write_text(json.dumps(argv) + "\n")
        with stdout.open("wb") as out:
            return self.stack.spawn(argv, stdout=out, stderr=subprocess.STDOUT)

    def _wait(
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
