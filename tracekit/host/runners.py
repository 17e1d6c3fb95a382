"""What each kind of run does: one runner per RunKind, in a table (rtla's tool_ops).

A runner gets the collection in progress (the Session: tools, roles, instance, cleanup
stack) and the run's context (its planned step, where its files go), starts the tools
the run needs with their outputs in the run's directory, and waits for them. The
Session around it (tracekit/host/collect.py) starts and ends the run's capture, writes
its markers and records it in the manifest; a runner knows nothing of that.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.bundle import BundleWriter, RunFile, RunKind, run_file
from tracekit.errors import TracekitError
from tracekit.guests import read_variant, vmm_guest_argv
from tracekit.host import journal
from tracekit.host import tools as toolbox
from tracekit.host.afterguest import (
    TLBI_ACTIONS,
    VmidWatch,
    fill_generation,
    hotplug,
    issue_maint,
    open_vmid_watch,
    read_vmids,
    rollover,
    tlbi_request,
)
from tracekit.host.churn import ChurnCommands, churn
from tracekit.host.guestruns import (
    STOP_GRACE_SECONDS,
    BackgroundGuest,
    stopped_in_order,
    wait_within_budget,
)
from tracekit.host.instance import Instance
from tracekit.host.preflight import Kpatch, read_kpatch
from tracekit.host.protocol import (
    PlannedRun,
    ScenarioParams,
    action_cpus,
    tlbi_cpu,
)

if TYPE_CHECKING:
    from tracekit.host.collect import Session

# The VMM's own watchdog for one guest run (teardown is never cut short by it).
GUEST_TIMEOUT_SECONDS = 600
# PMU events for --perf-counters: generic names perf maps to each core's own events;
# those a PMU lacks are recorded as <not supported> (an emulated PMU has few).
PERF_EVENTS = ("cycles", "instructions", "dTLB-load-misses", "iTLB-load-misses")
# The longest a probe slot runs, whatever --duration says.
PROBE_MAX_SECONDS = 10


@dataclass(frozen=True)
class Outcome:
    """How a run ended, when not simply ok."""

    status: str  # ok, over-budget
    note: str = ""


@dataclass(frozen=True)
class RunContext:
    """One run being executed: its planned step and where its files go."""

    writer: BundleWriter
    planned: PlannedRun

    def path(self, name: str) -> Path:
        """A file of this run inside the bundle (its directory is created)."""
        return self.writer.path(run_file(self.planned.run_id, name))

    def detail_int(self, key: str) -> int:
        """An integer the plan gave this run (sweep point values, the probe's CPU)."""
        return int(str(self.planned.detail[key]))


Runner = Callable[["Session", RunContext], Outcome | None]


def run_measure(session: Session, ctx: RunContext) -> None:
    """stress-ng on the stress CPUs and cyclictest on the rt CPU, for one duration."""
    opts, roles = session.options, session.roles
    perf = _start_perf(session, ctx) if session.tools.perf else None
    stress_argv = toolbox.stress_argv(
        session.tools, list(roles.stress_cpus), opts.duration_s, ctx.path(RunFile.STRESS_YAML)
    )
    stress = session.spawn(stress_argv, ctx.path(RunFile.STRESS))
    # The histogram file has a line per bucket: written locally, kept compacted.
    histogram = Path(tempfile.gettempdir()) / f"tracekit-{os.getpid()}-cyclictest-hist.txt"
    # Journaled: a SIGKILLed run's histogram is removed by the next start (a board's /tmp
    # may be on disk, where even a reboot keeps it). Undone once read, so that the
    # journal holds one record of it at most, not one per run.
    removal = session.stack.push(
        f"remove {histogram}",
        lambda: histogram.unlink(missing_ok=True),
        journal.temporary_file(histogram),
    )
    cyclic_argv = toolbox.cyclictest_argv(
        session.tools,
        roles.rt_cpu,
        opts.interval_us,
        opts.duration_s,
        ctx.path(RunFile.CYCLICTEST_JSON),
        histogram,
    )
    cyclic = session.spawn(cyclic_argv, ctx.path(RunFile.CYCLICTEST))
    session.wait(cyclic, "cyclictest", opts.duration_s)
    ctx.path(RunFile.CYCLICTEST_HIST).write_text(toolbox.compact_histogram(histogram.read_text()))
    session.stack.undo_now(removal)
    session.wait(stress, "stress-ng", opts.duration_s)
    if perf is not None:
        # perf stat prints its last interval and exits on SIGINT, like Ctrl-C.
        perf.send_signal(signal.SIGINT)
        session.wait(perf, "perf stat", 0, ok_codes=(0, 130, -signal.SIGINT))


def _start_perf(session: Session, ctx: RunContext) -> subprocess.Popen[bytes]:
    """perf stat per CPU over every role's CPUs, in CSV, one line per second."""
    roles = session.roles
    cpus = sorted({roles.rt_cpu, *roles.stress_cpus, *roles.guest_cpus})
    argv = toolbox.perf_stat_argv(
        session.tools, cpus, list(PERF_EVENTS), 1000, ctx.path(RunFile.PERF_STAT)
    )
    return session.spawn(argv, ctx.path(RunFile.PERF_STAT_LOG))


def run_probe(session: Session, ctx: RunContext) -> None:
    """The broadcast-TLBI probe on one CPU, in the slot's mode and page count; helpers elsewhere."""
    cpu = ctx.detail_int("cpu")
    helpers = [c for c in session.roles.stress_cpus if c != cpu]
    argv = toolbox.probe_argv(
        session.tools,
        cpu,
        helpers,
        str(ctx.planned.detail["mode"]),
        min(session.options.duration_s, PROBE_MAX_SECONDS),
        ctx.path(RunFile.PROBE),
        session.trace_marker(),
        ctx.detail_int("pages"),
    )
    proc = session.spawn(argv, ctx.path(RunFile.PROBE_SUMMARY))
    session.wait(proc, "tlbiprobe", session.options.duration_s)


def guest_settings(params: ScenarioParams, **point: int) -> list[str]:
    """The VMM options of the guest parameters: the sweep point's, else the scenario's.

    A parameter reaches the VMM in every scenario once it was given (or the scenario's
    default is not the VMM's); otherwise the guest preset's own value stands (the VMM
    prints every knob it ran with, so the run's vmm.txt says what ran).
    """
    values: dict[str, int | None] = {}
    for name in ("ipa_bits", "touch_kb"):
        if name in point:  # a sweep point's own value (the scenario sweeps this one)
            values[name] = point[name]
        elif params.explicit(name):
            values[name] = params.single(name)
    values["tlbi_count"] = params.tlbi_count if params.explicit("tlbi_count") else None
    values |= {k: v for k, v in point.items() if k not in values}
    return toolbox.vmm_settings(**{k: v for k, v in values.items() if v is not None})


def guest_argv(
    session: Session, settings: list[str], vcpus: int | None, repeat: int = 1
) -> list[str]:
    """The VMM running the session's guest on the guest CPUs, with its knobs and backing."""
    return toolbox.vmm_argv(
        session.tools,
        session.guest_path,
        list(session.roles.guest_cpus),
        session.trace_marker(),
        repeat=repeat,
        extra=[*settings, *session.guest_options],
        vcpus=vcpus,
    )


def run_guest(session: Session, ctx: RunContext) -> None:
    """Run the guest once on the guest CPUs; its markers go into the trace."""
    settings = guest_settings(session.params, timeout=GUEST_TIMEOUT_SECONDS)
    argv = guest_argv(session, settings, session.guest_vcpus())
    proc = session.spawn(argv, ctx.path(RunFile.VMM))
    session.wait(proc, "vmm", GUEST_TIMEOUT_SECONDS)


def run_sweep_point(session: Session, ctx: RunContext) -> Outcome:
    """`repeat` VMs of one sweep point, timed by the VMM, within the time budget."""
    settings = guest_settings(
        session.params,
        ipa_bits=ctx.detail_int("ipa_bits"),
        ram_mb=ctx.detail_int("ram_mb"),
        touch_kb=ctx.detail_int("touch_kb"),
        timeout=0,  # the VMM's watchdog off: the budget decides, and says so
    )
    argv = guest_argv(session, settings, ctx.detail_int("vcpus"), session.params.repeat)
    output = ctx.path(RunFile.VMM)
    proc = session.spawn(argv, output)
    outcome = wait_within_budget(proc, session.params.vm_budget_s, output, session.params.repeat)
    if outcome.status != "ok":
        session.echo(f"  OVER BUDGET: {outcome.note}")
    return Outcome(outcome.status, outcome.note)


def run_churn(session: Session, ctx: RunContext) -> Outcome:
    """`repeat` MMU-on VMs in turn, each timed by the VMM, cyclictest on the rt CPU meanwhile."""
    params = session.params
    settings = guest_settings(params, timeout=GUEST_TIMEOUT_SECONDS)
    cyclic_argv = toolbox.cyclictest_argv(
        session.tools,
        session.roles.rt_cpu,
        session.options.interval_us,
        params.vm_budget_s + STOP_GRACE_SECONDS,  # outlasts the churn: stopped after it
        ctx.path(RunFile.CYCLICTEST_JSON),
    )
    hold = ["--hold-vm"] if params.hold_vm else []
    commands = ChurnCommands(
        vmm=guest_argv(session, [*settings, *hold], session.guest_vcpus(), params.repeat),
        cyclictest=cyclic_argv,
        vms=params.repeat,
        budget_s=params.vm_budget_s,
    )
    before = read_kpatch()
    ended = "raised"  # what the record says if the churn raises (stuck, interrupted, ...)
    try:
        outcome = churn(
            commands,
            session.spawn,
            session.wait,
            ctx.path(RunFile.VMM),
            ctx.path(RunFile.CYCLICTEST),
        )
        ended = outcome.status
    finally:  # every way out: the runs that did not end ok are the ones whose switch matters
        if before is not None:
            write_switch_record(ctx.path(RunFile.TEARDOWN_FLUSH), before, ended)
    if outcome.status != "ok":
        session.echo(f"  OVER BUDGET: {outcome.note}")
    return Outcome(outcome.status, outcome.note)


def write_switch_record(path: Path, before: Kpatch, ended: str) -> None:
    """The debug series' switch and flush count before the churn and now, and how the
    churn ended ("raised": it did not return)."""
    after = read_kpatch()
    record = {
        "before": switch_record(before),
        "after": switch_record(after) if after is not None else None,
        "churn": ended,
    }
    path.write_text(json.dumps(record) + "\n")


def switch_record(kpatch: Kpatch) -> dict[str, object]:
    """The teardown switch's state and its counts, as a churn records them."""
    return {
        "teardown_flush": kpatch.teardown_flush,
        "teardown_flushes": kpatch.teardown_flushes,
        "teardown_failures": kpatch.teardown_failures,
    }


def run_guest_start(session: Session, ctx: RunContext) -> None:
    """Start the during phase's guest; it runs until the guest-stop run (markers traced)."""
    argv = guest_argv(session, guest_settings(session.params, timeout=0), session.guest_vcpus())
    output = ctx.path(RunFile.VMM)
    background = BackgroundGuest(session.spawn(argv, output), len(session.roles.guest_cpus), output)
    session.background = background
    took = background.wait_running()
    session.marker(f"tracekit: background guest running after {took:.3f} s")


def run_guest_stop(session: Session, ctx: RunContext) -> None:
    """Stop the during phase's guest; the kernel's teardown of it is in this run's trace."""
    background = session.background
    if background is None:
        raise TracekitError("guest-stop without a running background guest (plan error)")
    session.marker("tracekit: stopping the background guest")
    code = background.stop()
    in_order = stopped_in_order(background.output)
    session.background = None
    record = {
        "vmm_exit_status": code,
        "stopped_by": "SIGTERM",
        # False: the VMM had to be killed, so its teardown markers are missing.
        "torn_down_by_vmm": in_order,
    }
    ctx.path(RunFile.GUEST_STOP).write_text(json.dumps(record) + "\n")


def rollover_argv(
    tools: toolbox.ToolPaths, guest: Path, cpus: tuple[int, ...], backing: str, count: int
) -> list[str]:
    """The VMM for `count` throwaway VMs: the guest's RAM backing, none of its knobs."""
    # The backing decides stage 2's mapping sizes, so the throwaway VMs use the guest's;
    # its knobs would make them something other than the MMU-off guest.
    extra = vmm_guest_argv(backing=backing)
    return toolbox.vmm_argv(tools, guest, list(cpus), None, repeat=count, extra=extra)


def run_after_guest(session: Session, ctx: RunContext) -> None:
    """The after-guest action: CPU hotplug, or a VMID rollover (or one VM short of it)."""
    action = session.options.after_guest
    if action in TLBI_ACTIONS:
        request = tlbi_request(action, tlbi_cpu(action, session.roles), session.options.vmid)
        ctx.path(RunFile.MAINT).write_text("\n".join(issue_maint(request, session.now)) + "\n")
        return
    if action in ("hotplug", "hotplug-other"):
        log = hotplug(action_cpus(action, session.roles), session.stack, session.now)
        ctx.path(RunFile.HOTPLUG).write_text("\n".join(log) + "\n")
        return
    watch = open_vmid_watch(session.tracefs)
    guest = mmu_off_guest(session, "the rollover")
    output = ctx.path(RunFile.VMM)

    def run_batch(count: int) -> None:
        """Create, run and destroy `count` MMU-off VMs, draining the trace after."""
        argv = rollover_argv(
            session.tools, guest, session.roles.guest_cpus, session.options.backing, count
        )
        batch = output.with_suffix(".batch")
        proc = session.spawn(argv, batch)
        session.wait(proc, "vmm (rollover)", GUEST_TIMEOUT_SECONDS)
        with output.open("ab") as log:
            log.write(batch.read_bytes())
        batch.unlink()
        # The last batch's command line stands for all of them (only --repeat varies).
        Path(f"{batch}.argv").replace(f"{output}.argv")
        if session.capture is not None:
            session.capture.drain()

    max_vms = session.options.rollover_max_vms
    read = partial(read_vmids, watch)
    known = ctx.writer.manifest.host.get("vmid_bits")  # kallsyms' kvm_arm_vmid_bits
    if action == "rollover-minus-one":
        vmids, vms = fill_generation(run_batch, read, known, max_vms, session.echo)
    else:
        vmids, vms = rollover(run_batch, read, max_vms, session.echo, known)
    record = {"vms": vms, "vmid_bits": vmids.bits, "vmid_ids": vmids.seen}
    record["rolled_over"] = vmids.rolled_over()
    ctx.path(RunFile.ROLLOVER).write_text(json.dumps(record) + "\n")


def mmu_off_guest(session: Session, purpose: str) -> Path:
    """The MMU-off guest beside the collection's guest: throwaway VMs that touch no stage 1."""
    guest = session.guest_path.parent / "mmu-off.elf"
    if read_variant(guest).stage1 != "off":
        raise TracekitError(f"{guest} is not the MMU-off guest {purpose} needs")
    return guest


def run_vmid_prep(session: Session, ctx: RunContext) -> None:
    """N-1 throwaway MMU-off VMs before the before phase, so the guest gets VMID N."""
    vms = ctx.detail_int("vms")
    record: dict[str, object] = {"vms": vms, "vmid": ctx.detail_int("vmid")}
    if vms:
        try:
            watch: Instance | None = open_vmid_watch(session.tracefs, "prep")
        except TracekitError as err:
            watch, record["vmids_unread"] = None, str(err)  # the count still stands
        guest = mmu_off_guest(session, "--vmid")
        argv = rollover_argv(
            session.tools, guest, session.roles.guest_cpus, session.options.backing, vms
        )
        proc = session.spawn(argv, ctx.path(RunFile.VMM))
        session.wait(proc, "vmm (vmid prep)", GUEST_TIMEOUT_SECONDS)
        if watch is not None:
            seen = VmidWatch(bits=ctx.writer.manifest.host.get("vmid_bits"))
            seen.add(read_vmids(watch))
            record |= {"vmid_bits": seen.bits, "vmid_ids": seen.seen}
    ctx.path(RunFile.VMID_PREP).write_text(json.dumps(record) + "\n")
    bits = record.get("vmid_bits")
    if isinstance(bits, int) and ctx.detail_int("vmid") >= 1 << bits:
        raise TracekitError(
            f"--vmid {ctx.detail_int('vmid')}: this host's VMIDs are {bits} bits wide, so the "
            f"throwaway VMs rolled them over; choose a VMID below {1 << bits}"
        )


# Every run kind and its runner; whether a run is traced is bundle.TRACED_KINDS.
RUNNERS: dict[RunKind, Runner] = {
    RunKind.QUIET: run_measure,
    RunKind.TRACED: run_measure,
    RunKind.PROBE: run_probe,
    RunKind.GUEST: run_guest,
    RunKind.AFTER_GUEST: run_after_guest,
    RunKind.VMS: run_sweep_point,
    RunKind.GUEST_START: run_guest_start,
    RunKind.GUEST_STOP: run_guest_stop,
    RunKind.VMID_PREP: run_vmid_prep,
    RunKind.CHURN: run_churn,
}
