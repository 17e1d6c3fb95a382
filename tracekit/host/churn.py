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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.host.cleanup import stop_process_group
from tracekit.host.guestruns import BudgetOutcome, stop_over_budget, summary_fields, vms_recorded
from tracekit.host.procs import describe_state, process_state

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
# A stuck VMM's teardown is already over or will never come: a short grace before SIGKILL.
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
    vmm = spawn(commands.vmm, vmm_out)
    try:
        outcome = watch_churn(vmm, cyclic, commands, vmm_out)
    finally:
        stop_cyclictest(cyclic)
    wait(cyclic, "cyclictest", 0, ok_codes=STOPPED_CODES)
    return outcome


def stop_cyclictest(cyclic: subprocess.Popen[bytes]) -> None:
    """SIGINT (it then writes its JSON); an error if it has not ended within seconds."""
    if cyclic.poll() is None:
        cyclic.send_signal(signal.SIGINT)
    try:
        cyclic.wait(timeout=CYCLIC_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        raise TracekitError(
            f"cyclictest did not end within {CYCLIC_STOP_SECONDS:.0f} s of SIGINT "
            f"({describe_state(cyclic.pid)}); it is stopped"
        ) from None


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
        if now - started >= commands.budget_s:
            return stop_over_budget(vmm, commands.budget_s, output, commands.vms)
        tail.read(now)
        if cyclic.poll() is not None:
            stop_process_group(vmm)
            raise TracekitError(
                f"cyclictest ended during the churn (status {cyclic.returncode}) after "
                f"{vms_recorded(output)} of {commands.vms} VMs; the VMM was stopped"
            )
        stopped = process_state(vmm.pid) in ("T", "t")
        if stopped or tail.summary:
            stuck_since = stuck_since or now
            if now - stuck_since >= STUCK_SECONDS:
                raise _stuck(vmm, commands, output, tail)
        else:
            stuck_since = None
            if now - tail.progress_at >= STALL_SECONDS:
                raise _stuck(vmm, commands, output, tail)
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
    vmm: subprocess.Popen[bytes], commands: ChurnCommands, output: Path, tail: OutputTail
) -> TracekitError:
    """Kill a VMM that will not end by itself; the error says what it was doing."""
    state = describe_state(vmm.pid)
    fields = summary_fields(output)
    # SIGCONT first: a stopped VMM then acts on the SIGTERM (its teardown in order), and
    # one that ignores it gets SIGKILL after the short grace.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(vmm.pid, signal.SIGCONT)
    stop_process_group(vmm, grace=KILL_GRACE_SECONDS)
    done = vms_recorded(output)
    if fields:
        what = f"printed its summary ({describe_stop(fields)}) but did not exit"
        within = STUCK_SECONDS
    elif state.startswith(("state T", "state t")):
        what = f"was stopped ({state}, e.g. by SIGSTOP) and did not go on"
        within = STUCK_SECONDS
    else:
        what = f"recorded no new VM ({state})"
        within = STALL_SECONDS
    return TracekitError(
        f"vmm {what} within {within:.0f} s, after {done} of {commands.vms} VMs; it was "
        "killed and the churn is incomplete"
    )


def ended_early(code: int, done: int, vms: int, fields: dict[str, str]) -> str:
    """One line for a VMM that exited before its churn was done."""
    how = f"was ended by {_signal_name(-code)}" if code < 0 else f"ended with status {code}"
    stop = f" ({describe_stop(fields)})" if fields.get("stopped") == "1" else ""
    return (
        f"vmm {how}{stop} after {done} of {vms} VMs; the churn is incomplete: see its "
        "output in the bundle (vmm.txt)"
    )


def describe_stop(fields: dict[str, str]) -> str:
    """Who stopped the VMM, from its summary's stop_* fields (an older VMM has none)."""
    if fields.get("stopped") != "1":
        return "not stopped by a signal"
    signum, pid = fields.get("stop_signal"), fields.get("stop_pid")
    if signum is None or pid is None:
        return "a stop signal from a sender this VMM does not report"
    sender = "the kernel or a terminal" if pid == "0" else f"pid {pid} ({fields['stop_comm']})"
    return f"{_signal_name(int(signum))} from {sender}"


def _signal_name(signum: int) -> str:
    """SIGTERM for 15; the number for what Python does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
