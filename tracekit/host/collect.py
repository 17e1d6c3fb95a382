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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracekit.bundle import BundleWriter, Manifest, RunRecord
from tracekit.cpus import format_cpu_list, parse_cpu_list
from tracekit.errors import TracekitError
from tracekit.guests import GuestVariant, read_variant
from tracekit.host import tools as toolbox
from tracekit.host.afterguest import hotplug, open_vmid_watch, rollover
from tracekit.host.cleanup import CleanupStack, Interrupted
from tracekit.host.instance import Instance
from tracekit.host.preflight import read_host_facts
from tracekit.host.probes import KernelSymbols, define_kprobes, remove_leftovers
from tracekit.host.protocol import SCENARIOS, PlannedRun, Roles, Scenario, plan_runs
from tracekit.host.rawcapture import RawCapture
from tracekit.host.tracefs import Tracefs, require_root

# Slack on top of a run's duration before a tool that did not stop is an error.
RUN_GRACE_SECONDS = 60
# The VMM's own watchdog for one guest run (teardown is never cut short by it).
GUEST_TIMEOUT_SECONDS = 600

# PMU events for --perf-counters: generic names perf maps to each core's own events;
# those a PMU lacks are recorded as <not supported> (an emulated PMU has few).
PERF_EVENTS = ("cycles", "instructions", "dTLB-load-misses", "iTLB-load-misses")
# Fetch arguments for probes whose argument layout is stable across kernels.
KPROBE_ARGS = {"kvm_arm_vmid_update": "vmid_id=+0($arg1):u64"}
# Functions whose duration matters: probed on return as well.
KRETPROBES = ("kvm_free_stage2_pgd", "kvm_uninit_stage2_mmu", "kvm_arch_destroy_vm")


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


def online_cpus() -> list[int]:
    """The CPUs online now, from sysfs."""
    return parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text())


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


def check_options(options: CollectOptions) -> tuple[Scenario, Roles]:
    """Validate options before anything on the host changes."""
    if options.scenario not in SCENARIOS:
        raise TracekitError(
            f"unknown scenario {options.scenario!r}; choose one of {', '.join(SCENARIOS)}"
        )
    if options.runs < 1 or options.traced_runs < 0 or options.duration_s < 1:
        raise TracekitError("--runs and --duration must be at least 1, --traced-runs at least 0")
    roles = Roles(options.rt_cpu, tuple(options.stress_cpus), tuple(options.guest_cpus))
    roles.check(online_cpus())
    return SCENARIOS[options.scenario], roles


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
    scenario, roles = check_options(options)
    guest_path, variant = resolve_guest(options, scenario)
    plan = plan_runs(scenario, roles, options.runs, options.traced_runs, options.after_guest)
    kprobe_fetch_args(options.probe_args)  # a bad file fails here, before any change
    if options.dry_run:
        echo(f"scenario {scenario.name}: {scenario.description}")
        echo(f"guest {guest_path} (variant {variant.variant})")
        for planned in plan:
            echo("  " + planned.describe())
        return None
    require_root()
    require_kvm()
    tools = toolbox.find_tools(options.vmm, options.probe, options.perf_counters)
    with CleanupStack() as stack:
        tracefs = Tracefs.open(stack)
        for leftover in remove_leftovers(tracefs):
            echo(f"removed a leftover of a killed run: {leftover}")
        facts = host_facts(tools, options.rt_cpu)
        for line in describe_host(facts):
            echo(line)
        manifest = Manifest(
            host=facts,
            options=_jsonable(asdict(options)),
            scenario={**_jsonable(asdict(scenario)), "guest": str(guest_path)},
        )
        writer = BundleWriter.create(options.output, manifest)
        try:
            session = Session(
                options, scenario, roles, tools, variant, guest_path, stack, tracefs, echo
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


def host_facts(tools: toolbox.ToolPaths, rt_cpu: int) -> dict[str, Any]:
    """Preflight facts (kernel, KVM mode, cores, isolation, emulation) and tool versions."""
    facts = _jsonable(asdict(read_host_facts([rt_cpu])))
    uname = os.uname()
    facts["kernel_release"] = uname.release
    facts["machine"] = uname.machine
    facts["online_cpus"] = format_cpu_list(online_cpus())
    facts["emulated"] = facts["emulation"]["emulated"]
    facts["tools"] = {
        "cyclictest": toolbox.tool_version([tools.cyclictest, "--help"]),
        "stress-ng": toolbox.tool_version([tools.stress_ng, "--version"]),
    }
    return facts


def describe_host(facts: dict[str, Any]) -> list[str]:
    """The preflight lines printed before a collection starts."""
    cores = sorted({core["name"] for core in facts["cpus"]})
    isolation = facts["isolation"][0]
    isolated = [k for k in ("isolcpus", "nohz_full", "rcu_nocbs") if isolation.get(k)]
    lines = [
        f"host: {facts['kernel_release']} ({facts['machine']}), cores: {', '.join(cores)}",
        f"host: KVM mode {facts['kvm']['mode']} ({facts['kvm']['evidence']})",
        f"host: rt CPU {isolation['cpu']} isolation: {', '.join(isolated) or 'NONE'}",
    ]
    if facts["emulated"]:
        lines.append(
            f"host: EMULATED ({facts['emulation']['kind']}): timings are not hardware timings"
        )
    return lines


def _jsonable(value: Any) -> Any:
    """Paths and tuples as JSON-friendly strings and lists."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


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
    ) -> None:
        self.options = options
        self.scenario = scenario
        self.roles = roles
        self.tools = tools
        self.variant = variant
        self.guest_path = guest_path
        self.stack = stack
        self.tracefs = tracefs
        self.instance: Instance | None = None
        self.tracing = False  # trace_marker refuses writes (EBADF) while tracing is off
        self.capture: RawCapture | None = None
        self.echo = echo

    def setup(self, writer: BundleWriter) -> None:
        """Create the instance: clock, buffers, task names, kprobes and events."""
        instance = Instance.create(self.tracefs)
        instance.set_trace_clock("boot")
        instance.set_buffer_size_kb(self.options.buffer_kb)
        instance.record_task_names()
        probes = self._kprobe_definitions()
        defined = define_kprobes(self.tracefs, probes).defined
        events = [e for e in self.scenario.events if instance.has_event(e)]
        missing = sorted(set(self.scenario.events) - set(events))
        events += self.options.events
        events += [probe.group_event for probe in defined]
        instance.enable_events(events)
        self.instance = instance
        writer.manifest.scenario["events_enabled"] = list(instance.events)
        writer.manifest.scenario["events_missing"] = missing
        writer.manifest.scenario["kprobes"] = probes
        writer.manifest.scenario["trace_marker"] = str(instance.trace_marker)
        writer.save()

    def _kprobe_definitions(self) -> list[str]:
        """Entry (and return) probes on the scenario's functions the kernel offers."""
        symbols = KernelSymbols.load(self.tracefs)
        lines = list(self.options.kprobes)
        fetch = kprobe_fetch_args(self.options.probe_args)
        for function in self.scenario.kprobes:
            if not symbols.has(function):
                continue
            args = fetch.get(function, "")
            lines.append(f"p:tracekit/{function} {function} {args}".strip())
            if function in KRETPROBES:
                lines.append(f"r:tracekit/{function}_ret {function}")
        return lines

    def execute(self, planned: PlannedRun, writer: BundleWriter) -> None:
        """Run one planned step, recording its files and times in the bundle."""
        run = writer.start_run(
            RunRecord(planned.run_id, planned.phase, planned.kind, planned.index)
        )
        rundir = Path("runs") / planned.run_id
        traced = planned.kind in ("traced", "guest", "after-guest")
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
        writer.end_run(run, "ok")

    def _marker(self, text: str) -> None:
        """A marker in the instance's buffer, while tracing is on (the kernel refuses it else)."""
        if self.instance is not None and self.tracing:
            self.instance.write_marker(text)

    def _start_capture(self, writer: BundleWriter, rundir: Path) -> RawCapture:
        """Start recording this run into its own raw capture directory."""
        assert self.instance is not None
        capture = RawCapture(self.instance, writer.path(str(rundir / "trace")))
        capture.start()
        self.instance.start()
        self.tracing = True
        return capture

    def _finish_capture(self, capture: RawCapture, run: RunRecord) -> None:
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
        cyclic = self._spawn(
            toolbox.cyclictest_argv(
                self.tools,
                self.roles.rt_cpu,
                opts.interval_us,
                opts.duration_s,
                writer.path(str(rundir / "cyclictest.json")),
            ),
            writer.path(str(rundir / "cyclictest.txt")),
        )
        self._wait(cyclic, "cyclictest", opts.duration_s)
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
