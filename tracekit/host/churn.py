"""The vm-churn run: N VMs created, run and destroyed in turn, the rt CPU measured meanwhile.

The cost of the brief's proposed fix (reproducer/kpatch's `teardown_flush`): the VMM's
`--repeat N` times each VM itself (`record=vm`: create start to teardown end, on
CLOCK_BOOTTIME), while cyclictest runs on the rt CPU for the whole churn. The run is not
traced: tracing would add to every VM's time, which is the quantity compared. cyclictest
starts first and is stopped (SIGINT: it then prints and writes its JSON as at the end of
a duration) once the VMM is done, so its samples cover the churn and the moments around
it. No stress-ng: the churn's own teardown invalidations are the load under study, and
the switch state (off, alle1is, last-ran) is the bundle's host fact `kpatch`.

The VMM is watched, not just waited for: a churn that ends early, whatever ends it (a
stop signal from anyone, a crash, a VMM that printed its summary but does not exit, one
stopped by SIGSTOP or stuck with no new VM, cyclictest gone), ends the run within
seconds with one line saying how far it got, the VMM's process state and, for a stop
signal, who sent it (the VMM's summary names the sender). Waiting for the budget alone
hung for the whole budget (600 s) in the stuck cases (issue 20).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracekit.bundle import RunFile
from tracekit.errors import TracekitError
from tracekit.host.cleanup import stop_process_group
from tracekit.host.guestruns import BudgetOutcome, stop_over_budget, summary_fields, vms_recorded
from tracekit.host.procs import describe_state, process_dump, process_state

# cyclictest's first loops are under way before the first VM is created.
LEAD_IN_SECONDS = 1.0
# cyclictest's exit codes once stopped by SIGINT (it ends its loop and writes its files).
STOPPED_CODES = (0, 130, -signal.SIGINT)
# cyclictest ends its loop within one interval of SIGINT and writes its files.
CYCLIC_STOP_SECONDS = 10.0
# How often the watch looks at the VMM, its output and cyclictest (each look reads only
# the output's new bytes: the bundle may be on 9p or NFS, and the churn is being timed).
POLL_SECONDS = 0.25
# A VMM that printed its summary has torn its last VM down: it exits at once. One still
# there this long after, or stopped (state T) this long, never ends by itself.
STUCK_SECONDS = 5.0
# A churn VM (MMU-on, 16 MiB, 40-bit IPA) takes well under 1 s in the emulated host:
# this long with no new VM recorded is a stuck VMM.
STALL_SECONDS = 60.0
# A stuck VMM's teardown is already over or will never come: a short grace (SIGTERM and
# SIGCONT to SIGKILL) in all.
KILL_GRACE_SECONDS = 2.0

Spawn = Callable[[list[str], Path], subprocess.Popen[bytes]]
Wait = Callable[..., None]


@dataclass(frozen=True)
class ChurnCommands:
    """What a churn run starts: the VMM with --repeat N, cyclictest on the rt CPU."""

    vmm: list[str]
    cyclictest: list[str]
    vms: int
    budget_s: int


def churn(
    commands: ChurnCommands, spawn: Spawn, wait: Wait, vmm_out: Path, cyclic_out: Path
) -> BudgetOutcome:
    """cyclictest, then the VMM's churn watched under its budget, then cyclictest stopped."""
    cyclic = spawn(commands.cyclictest, cyclic_out)
    time.sleep(LEAD_IN_SECONDS)
    if cyclic.poll() is not None:  # it failed to start: no VMM to start and kill
        raise TracekitError(
            f"cyclictest ended (status {cyclic.returncode}) before the churn began; see "
            f"its output in the bundle ({cyclic_out.name})"
        )
    vmm = spawn(commands.vmm, vmm_out)
    try:
        outcome = watch_churn(vmm, cyclic, commands, vmm_out)
    except BaseException:
        # The error in flight is the one to report (an Interrupted keeps its exit status
        # and the manifest's "interrupted"): cyclictest not ending only warns here, and
        # the cleanup stack stops it later.
        if (problem := stop_cyclictest(cyclic)) is not None:
            print(f"tracekit: warning: {problem}", file=sys.stderr, flush=True)
        raise
    if (problem := stop_cyclictest(cyclic)) is not None:
        raise TracekitError(f"{problem}; it is stopped with the run")
    wait(cyclic, "cyclictest", 0, ok_codes=STOPPED_CODES)
    return outcome


def stop_cyclictest(cyclic: subprocess.Popen[bytes]) -> str | None:
    """SIGINT (it then writes its JSON); what went wrong if it has not ended within seconds."""
    if cyclic.poll() is None:
        cyclic.send_signal(signal.SIGINT)
    try:
        cyclic.wait(timeout=CYCLIC_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        return (
            f"cyclictest did not end within {CYCLIC_STOP_SECONDS:.0f} s of SIGINT "
            f"({describe_state(cyclic.pid)})"
        )
    return None


def watch_churn(
    vmm: subprocess.Popen[bytes],
    cyclic: subprocess.Popen[bytes],
    commands: ChurnCommands,
    output: Path,
) -> BudgetOutcome:
    """Wait for the VMM's churn; past the budget stop it; any early end is an error."""
    started = time.monotonic()
    tail = OutputTail(output)
    stuck_since: float | None = None
    while (code := vmm.poll()) is None:
        now = time.monotonic()
        tail.read(now)
        # Before the budget: a VMM stopped (state T) at its budget is stuck, not slow, and
        # stopping it as over budget would hide why.
        stopped = process_state(vmm.pid) in ("T", "t")
        stuck_since = (stuck_since or now) if stopped or tail.summary else None
        if now - started >= commands.budget_s:
            if stopped:
                raise _stuck(vmm, commands, output, now - (stuck_since or now), at_budget=True)
            return stop_over_budget(vmm, commands.budget_s, output, commands.vms)
        if cyclic.poll() is not None:
            stop_process_group(vmm)
            raise TracekitError(
                f"cyclictest ended during the churn (status {cyclic.returncode}) after "
                f"{vms_recorded(output)} of {commands.vms} VMs; the VMM was stopped"
            )
        if stuck_since is not None and now - stuck_since >= STUCK_SECONDS:
            raise _stuck(vmm, commands, output, now - stuck_since)
        if stuck_since is None and now - tail.progress_at >= STALL_SECONDS:
            raise _stuck(vmm, commands, output, now - tail.progress_at)
        time.sleep(POLL_SECONDS)
    done = vms_recorded(output)
    if code == 0 and done == commands.vms:
        return BudgetOutcome("ok", code, done)
    raise TracekitError(ended_early(code, done, commands.vms, summary_fields(output)))


class OutputTail:
    """The VMM's output as it grows, each byte read once: VM records seen, the summary."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.offset = 0
        self.partial = b""  # the last, unfinished line
        self.vm_lines = 0
        self.progress_at = time.monotonic()  # when the last VM record (or the start) came
        self.summary = False

    def read(self, now: float) -> None:
        """Take in what the VMM wrote since the last call."""
        try:
            with self.output.open("rb") as handle:
                handle.seek(self.offset)
                new = handle.read()
        except OSError:
            return
        self.offset += len(new)
        *lines, self.partial = (self.partial + new).split(b"\n")
        vms = sum(line.startswith(b"record=vm ") for line in lines)
        if vms:
            self.vm_lines += vms
            self.progress_at = now
        self.summary = self.summary or any(line.startswith(b"record=summary ") for line in lines)


def _stuck(
    vmm: subprocess.Popen[bytes],
    commands: ChurnCommands,
    output: Path,
    for_s: float,
    at_budget: bool = False,
) -> TracekitError:
    """Kill a VMM that will not end by itself (seen so for `for_s` s); the error says what
    it was doing."""
    state = describe_state(vmm.pid)
    by = stopped_by(vmm.pid)
    fields = summary_fields(output)
    # Before any signal: what it was doing, for whoever looks for the cause.
    dump = output.parent / RunFile.VMM_STUCK
    with contextlib.suppress(OSError):
        dump.write_text(process_dump(vmm.pid))
    # stop_process_group continues a stopped VMM: it then acts on the SIGTERM (its
    # teardown in order), and one that ignores it gets SIGKILL after the short grace.
    try:
        stop_process_group(vmm, grace=KILL_GRACE_SECONDS)
        killed = "it was killed"
    except OSError as err:  # e.g. in state D, blocked in do_exit
        killed = f"it could not be killed ({err})"
    done = vms_recorded(output)
    span = f" {for_s:.0f} s"
    if fields:
        what = f"printed its summary ({describe_stop(fields)}) but did not exit within"
    elif state.startswith(("state T", "state t")) and at_budget and for_s < 1:
        # Stopped within the last poll: how long it stayed so is not known (review s17 N4).
        what, span = (
            f"was found stopped ({state}, {by}) at the time budget of {commands.budget_s} s",
            "",
        )
    elif state.startswith(("state T", "state t")):
        when = f"at the time budget of {commands.budget_s} s, " if at_budget else ""
        what = f"was stopped ({state}, {by}) {when}and did not go on for"
    else:
        what = f"recorded no new VM ({state}) within"
    return TracekitError(
        f"vmm {what}{span}, after {done} of {commands.vms} VMs; {killed} and the "
        f"churn is incomplete (its state before: {dump.name})"
    )


def stopped_by(pid: int) -> str:
    """Which signal stopped a child, as waitid(WSTOPPED | WNOWAIT) reports it without
    reaping, or "e.g. by SIGSTOP" if it cannot. (A VMM tracekit starts leads its own
    session, an orphaned process group, so the kernel discards SIGTSTP, SIGTTIN and
    SIGTTOU for it: only SIGSTOP, or a tracer's stop, state t, can stop it.)"""
    try:
        found = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    except OSError:
        found = None
    if found is None or found.si_code != os.CLD_STOPPED:
        return "e.g. by SIGSTOP"
    return f"by {_signal_name(found.si_status)}"


def ended_early(code: int, done: int, vms: int, fields: dict[str, str]) -> str:
    """One line for a VMM that exited before its churn was done."""
    how = f"was ended by {_signal_name(-code)}" if code < 0 else f"ended with status {code}"
    stop = f" ({describe_stop(fields)})" if fields.get("stopped") == "1" else ""
    return (
        f"vmm {how}{stop} after {done} of {vms} VMs; the churn is incomplete: see its "
        "output in the bundle (vmm.txt)"
    )


# si_code values a stop signal can carry (include/uapi/asm-generic/siginfo.h); the VMM
# gives si_pid only for the first four, whose sender is a process.
SI_CODES = {0: "SI_USER", -1: "SI_QUEUE", -3: "SI_MESGQ", -6: "SI_TKILL", 0x80: "SI_KERNEL"}


def describe_stop(fields: dict[str, str]) -> str:
    """Who stopped the VMM, from its summary's stop_* fields (values unescaped).

    An older VMM printed no stop_code, and stop_pid 0 for a signal that no process sent:
    its pid 0 is "the kernel, or a sender outside the VMM's pid namespace". A damaged
    field reads as not reported, never as an error.
    """
    if fields.get("stopped") != "1":
        return "not stopped by a signal"
    signum, code, pid = (_int(fields.get(k)) for k in ("stop_signal", "stop_code", "stop_pid"))
    if signum is None:
        return "a stop signal from a sender this VMM does not report"
    name = _signal_name(signum)
    if code is not None and "stop_pid" not in fields:
        return f"{name} with si_code {SI_CODES.get(code, code)}, sent by no process"
    if pid is None:
        return f"{name} from a sender this VMM does not report"
    if pid == 0:
        where = "a sender outside the VMM's pid namespace"
        return f"{name} from pid 0 ({where if code is not None else 'the kernel, or ' + where})"
    sender = f"{name} from pid {pid} ({fields.get('stop_comm') or '-'}"
    if fields.get("stop_from_parent") == "1":
        sender += ", the VMM's parent"
    elif (ppid := _int(fields.get("stop_ppid"))) is not None and ppid >= 0:
        sender += f", child of pid {ppid}"
    return sender + ")"


def _int(text: str | None) -> int | None:
    """A summary field as an integer, None when absent or damaged."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _signal_name(signum: int) -> str:
    """SIGTERM for 15; the number for what Python does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
