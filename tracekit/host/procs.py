"""Processes as /proc shows them: which boot, when each started, groups, inherited marks.

A pid says nothing once its process is gone: the kernel hands the number out again, and
after a reboot it means nothing at all. What a later run needs to tell its own dead run's
tools from strangers is here: the boot's id, a process's start time, and a mark in the
environment that every tool tracekit starts (and whatever the tool starts) inherits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PROC = Path("/proc")


def boot_id(path: Path = BOOT_ID) -> str | None:
    """This boot's id (a random UUID the kernel draws at boot); None where the kernel
    gives none (no /proc, an empty file)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields count from the last ')'.
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def live_processes() -> Iterator[tuple[int, str, list[str]]]:
    """Every live (not zombie) process in /proc: pid, command name, the stat fields after it.

    The fields start with state, ppid, pgrp (proc(5)); a process gone meanwhile is skipped.
    """
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            yield int(entry.name), stat[stat.index("(") + 1 : stat.rindex(")")], fields


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group, found in /proc."""
    return [pid for pid, _, fields in live_processes() if int(fields[2]) == pgid]


def carries(pid: int, name: str, value: str) -> bool:
    """Whether a process's environment (as it was exec'd) has `name=value`."""
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{name}={value}".encode() in environ.split(b"\0")


def marked_processes(name: str, value: str) -> list[int]:
    """Live processes whose environment has `name=value`."""
    return [pid for pid, _, _ in live_processes() if carries(pid, name, value)]


def process_state(pid: int) -> str:
    """A process's state letter (/proc/PID/stat field 3: R, S, D, T, ...), "" once gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2 :].split()[0]


def describe_state(pid: int) -> str:
    """A process's state as an error line names it: `state D in WCHAN` (proc(5)), or `gone`."""
    state = process_state(pid)
    try:
        wchan = (PROC / str(pid) / "wchan").read_text().strip()
    except OSError:
        wchan = ""
    if not state:
        return "gone"
    # wchan reads "0" for a running process, and "0" too where the kernel hides it.
    return f"state {state} in {wchan}" if wchan not in ("", "0") else f"state {state}"


# What process_dump keeps of /proc/PID/status: the state and the signal masks.
DUMP_STATUS_KEYS = ("State", "SigQ", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")


def process_dump(pid: int) -> str:
    """A process's state as text, for the record of one that will not end: its status
    lines (state, pending, blocked and caught signals), its kernel stack (root only) and
    each thread's stat and wchan. What cannot be read says so; never raises."""

    def read(path: Path) -> str:
        try:
            return path.read_text(errors="replace").strip()
        except OSError as err:
            return f"(not read: {err.strerror})"

    base = PROC / str(pid)
    status = read(base / "status").splitlines()
    lines = [f"pid {pid}"]
    lines += [line for line in status if line.split(":", 1)[0] in DUMP_STATUS_KEYS] or status
    lines += ["stack:", read(base / "stack")]
    try:
        tasks = sorted(int(t.name) for t in (base / "task").iterdir() if t.name.isdigit())
    except OSError:
        tasks = []
    for tid in tasks:
        task = base / "task" / str(tid)
        lines += [f"task {tid}: {read(task / 'stat')}", f"task {tid} wchan: {read(task / 'wchan')}"]
    return "\n".join(lines) + "\n"
