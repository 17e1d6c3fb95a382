"""Signals at random moments of the host setup, on this machine's real tracefs: leftovers.

Run as root from the repository root:

    python scripts/kill_trials.py --trials 20 --seed 1

For each of SIGINT, SIGTERM and SIGKILL, `--trials` times: start the setup child of
tests/host_kill_support.py (instance, clock, buffer, saved_cmdlines_size, a uprobe,
events and a filter, a child tool with a grandchild, tracing), send the signal after a
random delay (seeded) within the time the setup takes, and count what is left of each
kind right after the child ended, then again after the next start (`remove_leftovers`,
what collect calls first). Prints one table; the last column's target is 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

# This tree's tracekit and its tests' helpers, whatever tracekit is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from host_kill_support import leftovers, start
from host_uprobes import libc_uprobe_target

from tracekit.host.cleanup import CleanupStack
from tracekit.host.journal import JOURNAL_DIR_ENV
from tracekit.host.probes import remove_leftovers
from tracekit.host.tracefs import Tracefs, snapshot

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


def setup_seconds(uprobe: str, journals: Path) -> float:
    """How long the child takes from its first phase to tracing (one calibration run)."""
    child = start(uprobe, "calibrate", {**os.environ, JOURNAL_DIR_ENV: str(journals)})
    assert child.stdout is not None
    child.stdout.readline()
    began = time.monotonic()
    for line in child.stdout:
        if line.strip() == "PHASE tracing":
            break
    took = time.monotonic() - began
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=120)
    return took


def trial(
    root: Path, uprobe: str, signum: int, delay: float, journals: Path, marker: str
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """One signalled setup: leftovers after the child ended, and after the next start."""
    before = snapshot(root)
    child = start(uprobe, marker, {**os.environ, JOURNAL_DIR_ENV: str(journals)})
    assert child.stdout is not None
    child.stdout.readline()  # "PHASE opened": the stack and its journal exist
    time.sleep(delay)
    child.send_signal(signum)
    child.stdout.close()  # a grandchild may hold the pipes: do not wait for their end
    child.wait(timeout=120)
    time.sleep(0.2)  # the parent-death SIGKILL of the child tool is on its way
    after_run = leftovers(root, before, child.pid, marker, journals)
    with CleanupStack() as stack:
        remove_leftovers(Tracefs.open(stack))
    return after_run, leftovers(root, before, child.pid, marker, journals)


def main() -> None:
    """Run the trials and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="trials per signal")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    journals = Path(tempfile.mkdtemp(prefix="tracekit-kill-trials-"))
    os.environ[JOURNAL_DIR_ENV] = str(journals)  # the next start reads the trials' journals
    with CleanupStack() as stack:
        root = Tracefs.open(stack).root
        uprobe = libc_uprobe_target("getppid")
        window = setup_seconds(uprobe, journals) * 1.2
        print(f"setup takes {window / 1.2 * 1000:.0f} ms; signals land uniformly in 0-120% of it")
        print("signal  trials  left after the run (by kind)".ljust(86) + "after next start")
        for signum in SIGNALS:
            dirty, kinds, still = 0, Counter[str](), 0
            for n in range(args.trials):
                marker = f"trial-{signum}-{n}"
                left, after = trial(root, uprobe, signum, rng.uniform(0, window), journals, marker)
                found = [kind for kind, items in left.items() if items]
                dirty += bool(found)
                kinds.update(found)
                still += any(after.values())
            by_kind = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "-"
            name = signal.Signals(signum).name
            print(f"{name:7} {args.trials:6}  {dirty:3} ({by_kind})".ljust(86) + f"{still:3}")
    with contextlib.suppress(OSError):  # kept if a journal is left: run `tracekit cleanup`
        journals.rmdir()


if __name__ == "__main__":
    main()
