"""The vm-churn run: N VMs created, run and destroyed in turn, the rt CPU measured meanwhile.

The cost of the brief's proposed fix (reproducer/kpatch's `teardown_flush`): the VMM's
`--repeat N` times each VM itself (`record=vm`: create start to teardown end, on
CLOCK_BOOTTIME), while cyclictest runs on the rt CPU for the whole churn. The run is not
traced: tracing would add to every VM's time, which is the quantity compared. cyclictest
starts first and is stopped (SIGINT: it then prints and writes its JSON as at the end of
a duration) once the VMM is done, so its samples cover the churn and the moments around
it. No stress-ng: the churn's own teardown invalidations are the load under study, and
the switch state (off, alle1is, last-ran) is the bundle's host fact `kpatch`.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracekit.host.guestruns import BudgetOutcome, wait_within_budget

# cyclictest's first loops are under way before the first VM is created.
LEAD_IN_SECONDS = 1.0
# cyclictest's exit codes once stopped by SIGINT (it ends its loop and writes its files).
STOPPED_CODES = (0, 130, -signal.SIGINT)

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
    """cyclictest, then the VMM's churn under its budget, then cyclictest stopped."""
    cyclic = spawn(commands.cyclictest, cyclic_out)
    time.sleep(LEAD_IN_SECONDS)
    vmm = spawn(commands.vmm, vmm_out)
    try:
        outcome = wait_within_budget(vmm, commands.budget_s, vmm_out, commands.vms)
    finally:
        if cyclic.poll() is None:
            cyclic.send_signal(signal.SIGINT)
    wait(cyclic, "cyclictest", 0, ok_codes=STOPPED_CODES)
    return outcome
