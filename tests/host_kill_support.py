"""A setup child to signal, and a count of every kind of leftover it can leave.

Shared by tests/test_host_kills.py (a signal at each phase) and scripts/kill_trials.py
(signals at random moments). The child sets up as collect does, on this machine's real
tracefs, with a journal in $TRACEKIT_JOURNAL_DIR, and prints "PHASE <name>" after each
phase; its child tool carries a marker in its environment so that it and its grandchild
are found in /proc.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tracekit.host import procs
from tracekit.host.tracefs import snapshot

PHASES = ("opened", "instance", "clock", "task_names", "probe", "events", "child", "tracing")

# The child: each phase's changes, then "PHASE <name>"; the child tool carries a marker
# in its environment so that the test finds it and its grandchild in /proc.
CHILD_SETUP = textwrap.dedent(
    """
    import os, subprocess, sys
    from tracekit.host.cleanup import CleanupStack, Interrupted
    from tracekit.host.instance import Instance
    from tracekit.host.probes import ProbeSet, parse_probe
    from tracekit.host.tracefs import Tracefs

    def phase(name):
        print("PHASE", name, flush=True)

    uprobe, marker = sys.argv[1], sys.argv[2]
    try:
        with CleanupStack.journaled() as stack:
            tracefs = Tracefs.open(stack)
            phase("opened")
            instance = Instance.create(tracefs)
            phase("instance")
            instance.set_trace_clock()
            instance.set_buffer_size_kb(256)
            phase("clock")
            instance.record_task_names()
            phase("task_names")
            probe = parse_probe(f"p:tracekit/tk_kill_{os.getpid()} {uprobe}")
            ProbeSet(tracefs, "uprobe_events").define(probe)
            phase("probe")
            instance.enable_events(
                ["sched/sched_switch", probe.group_event], {"sched/sched_switch": "prev_pid >= 0"}
            )
            phase("events")
            env = {**os.environ, "TK_KILL_TEST": marker}
            quiet = subprocess.DEVNULL  # the grandchild must not hold the test's pipes
            stack.spawn(["sh", "-c", "sleep 1000 & wait"], env=env, stdout=quiet, stderr=quiet)
            phase("child")
            instance.start()
            phase("tracing")
            while True:
                instance.write_marker("tracing")
                os.getppid()
    except Interrupted as stop:
        sys.exit(stop.exit_code)
    """
)


def marked_processes(marker: str) -> list[int]:
    """Live processes whose environment carries the test's marker."""
    return procs.marked_processes("TK_KILL_TEST", marker)


def _flat(tree: dict[str, object], prefix: str = "") -> dict[str, object]:
    """A snapshot as "top/saved_cmdlines_size" -> value, one entry per setting."""
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# Counted as instances and probes of the child's own (other runs, e.g. a suite running
# beside this one on the same machine, add and remove theirs meanwhile).
SCOPED = {"instances", "top/kprobe_events", "top/uprobe_events", "top/dynamic_events"}


def _changed(before: dict[str, object], now: dict[str, object]) -> list[str]:
    """The settings whose value differs (or that appeared or went)."""
    keys = (before.keys() | now.keys()) - SCOPED
    return sorted(key for key in keys if before.get(key) != now.get(key))


def leftovers(
    root: Path, before: dict[str, object], pid: int, marker: str, journals: Path
) -> dict[str, list[str]]:
    """Every kind of thing the killed child may have left, by kind (empty lists: none)."""
    now = snapshot(root)
    return {
        "instances": [n for n in os.listdir(root / "instances") if n.startswith(f"tracekit-{pid}")],
        "probes": [
            line
            for line in (root / "uprobe_events").read_text().splitlines()
            if f"tk_kill_{pid}" in line
        ],
        "settings": _changed(_flat(before), _flat(now)),
        "children": [str(p) for p in marked_processes(marker)],
        "journals": sorted(p.name for p in journals.iterdir()) if journals.is_dir() else [],
    }


def run_until(phase: str, signum: int, uprobe: str, marker: str, env: dict[str, str]) -> int:
    """Start the child, signal it when it announces `phase`, wait for it; its pid."""
    child = start(uprobe, marker, env)
    assert child.stdout is not None
    for line in child.stdout:
        if line.strip() == f"PHASE {phase}":
            break
    else:
        _, stderr = child.communicate(timeout=60)
        raise AssertionError(f"the child ended before phase {phase}: {stderr}")
    child.send_signal(signum)
    _, stderr = child.communicate(timeout=120)
    expected = -signum if signum == signal.SIGKILL else 128 + signum
    assert child.returncode == expected, stderr
    return child.pid


NONE: dict[str, list[str]] = {
    "instances": [],
    "probes": [],
    "settings": [],
    "children": [],
    "journals": [],
}


def start(uprobe: str, marker: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start the setup child; it prints a PHASE line after each phase."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD_SETUP, uprobe, marker],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
