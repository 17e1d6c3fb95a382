"""Guest runs that are not one short VM: sweeps under a time budget, guests in the background.

- A sweep point runs the VMM for `repeat` VMs with its own watchdog off (`--timeout 0`:
  a 52-bit teardown under TCG takes tens of seconds and must not be cut short). What
  stops a run that takes too long is the collector's budget, explicit and reported: the
  VMM is stopped, the run is marked over-budget in the bundle with how many VMs it
  finished, and a line says so.
- A during phase starts its guest before the phase's runs and stops it after them. The
  guest counts as running once the VMM has its vCPU threads (one per vCPU, beside the
  main thread). It is stopped with SIGTERM: the VMM kicks its vCPUs out of KVM_RUN, tears
  the VM down in full with its usual markers (`stop`, `teardown-start`, `teardown-end`),
  prints its `vm` record (result=stopped) and ends by that signal, all inside the traced
  stop run.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracekit.errors import TracekitError
from tracekit.guests import vmm_unescape
from tracekit.host.cleanup import stop_process_group

# A VMM stopped in the middle of a teardown exits only when the kernel is done with it.
STOP_GRACE_SECONDS = 300
# How long a background guest may take to start its vCPUs (TCG is slow to create VMs).
START_TIMEOUT_SECONDS = 120
# A VM that ran to its power-off; one stopped by a signal (result=stopped) is not counted.
# (The guest's own report follows `result` on knob guests' lines.)
VM_RECORD = re.compile(rb"^record=vm .* result=ok( .*)?$", re.MULTILINE)


@dataclass
class BudgetOutcome:
    """How a budgeted VMM run ended."""

    status: str  # ok, over-budget
    exit_code: int | None
    vms_done: int
    note: str = ""


def vms_recorded(output: Path) -> int:
    """How many VMs the VMM has run to completion and torn down so far (record=vm, ok)."""
    try:
        return len(VM_RECORD.findall(output.read_bytes()))
    except OSError:
        return 0


def wait_within_budget(
    proc: subprocess.Popen[Any], budget_s: int, output: Path, expected_vms: int
) -> BudgetOutcome:
    """Wait for a VMM run; past the budget, stop it and say how far it got."""
    try:
        code = proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        return stop_over_budget(proc, budget_s, output, expected_vms)
    if code != 0:
        raise TracekitError(
            f"vmm failed with exit status {code} after {vms_recorded(output)} of "
            f"{expected_vms} VMs; see its output in the bundle ({output.name})"
        )
    return BudgetOutcome("ok", code, vms_recorded(output))


def stop_over_budget(
    proc: subprocess.Popen[Any], budget_s: int, output: Path, expected_vms: int
) -> BudgetOutcome:
    """Past the budget: stop the VMM (it tears its VM down first) and say how far it got."""
    stop_process_group(proc, grace=STOP_GRACE_SECONDS)
    done = vms_recorded(output)
    note = (
        f"stopped by the time budget of {budget_s} s after {done} of {expected_vms} "
        "VMs (raise --vm-budget to let it finish)"
    )
    return BudgetOutcome("over-budget", proc.returncode, done, note)


def stopped_in_order(output: Path) -> bool:
    """Whether the VMM answered its stop signal itself: a summary line with stopped=1."""
    return summary_fields(output).get("stopped") == "1"


def summary_fields(output: Path) -> dict[str, str]:
    """The VMM's record=summary line as key=value fields ({} while there is none)."""
    try:
        match = re.search(rb"^record=summary (.*)$", output.read_bytes(), re.MULTILINE)
    except OSError:
        return {}
    if match is None:
        return {}
    words = match[1].decode(errors="replace").split()
    pairs = (word.split("=", 1) for word in words if "=" in word)
    return {key: vmm_unescape(value) for key, value in pairs}


class BackgroundGuest:
    """A VMM left running while other runs measure; started and stopped explicitly."""

    def __init__(self, proc: subprocess.Popen[Any], vcpus: int, output: Path) -> None:
        self.proc = proc
        self.vcpus = vcpus
        self.output = output

    def wait_running(self, timeout_s: float = START_TIMEOUT_SECONDS) -> float:
        """Wait until every vCPU thread exists; returns the seconds it took."""
        started = time.monotonic()
        tasks = Path(f"/proc/{self.proc.pid}/task")
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise TracekitError(
                    f"the background guest exited ({self.proc.returncode}) before its phase "
                    f"began; see {self.output}"
                )
            try:
                if len(list(tasks.iterdir())) > self.vcpus:
                    return time.monotonic() - started
            except OSError:
                pass
            time.sleep(0.05)
        raise TracekitError(
            f"the background guest did not start its vCPUs within {timeout_s:.0f} s; "
            f"see {self.output}"
        )

    def stop(self) -> int | None:
        """Stop the guest (SIGTERM to the VMM); returns the VMM's exit status."""
        if self.proc.poll() is not None:
            raise TracekitError(
                f"the background guest ended during its phase (status {self.proc.returncode}), "
                "so part of the phase ran without it; raise --tlbi-count or see "
                f"{self.output}"
            )
        stop_process_group(self.proc, grace=STOP_GRACE_SECONDS)
        return self.proc.returncode
