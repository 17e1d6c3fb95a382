"""System info and the process/thread tree, from what the trace itself recorded.

The kernel release goes into SystemInfo because trace_processor decodes sched_switch's
prev_state by kernel version. Tasks come from the events (common_pid, comm, tgid) and
from the fields of sched events that name other tasks. A task is listed as a process
only when the trace shows it is one (its tgid is known, or it called exec, which the
kernel reports with the thread-group leader's pid); a task whose tgid is unknown is not
given a made-up one: the UI still names its thread from the sched events.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracekit.perfetto.protos import TracePacket
from tracekit.perfetto.writer import FTRACE_SEQUENCE

# (event, pid column, name column) of sched events that name a task other than current.
_NAMING_FIELDS = (
    ("sched_switch", "prev_pid", "prev_comm"),
    ("sched_switch", "next_pid", "next_comm"),
    ("sched_waking", "pid", "comm"),
    ("sched_wakeup", "pid", "comm"),
    ("sched_wakeup_new", "pid", "comm"),
    ("sched_process_fork", "child_pid", "child_comm"),
    ("sched_process_fork", "parent_pid", "parent_comm"),
    ("sched_process_exit", "pid", "comm"),
)


@dataclass
class Tasks:
    """What the trace tells about tasks: names, thread groups, parents, exec'd files."""

    names: dict[int, str] = field(default_factory=dict)
    tgids: dict[int, int] = field(default_factory=dict)
    parents: dict[int, int] = field(default_factory=dict)
    executed: dict[int, str] = field(default_factory=dict)


def system_info_packet(
    meta: Mapping[str, Any], first_ts: int | None, host: Mapping[str, Any] | None = None
) -> TracePacket:
    """SystemInfo with the kernel's uname (release decides task-state decoding, machine
    the syscall table); HOST (a bundle manifest's host facts) fills what META lacks."""
    packet = TracePacket(trusted_packet_sequence_id=FTRACE_SEQUENCE)
    if first_ts is not None:
        packet.timestamp = first_ts
    info = packet.system_info
    uname = str(meta.get("uname") or "").split()
    release = kernel_release(meta, host)
    machine = uname[-1] if len(uname) >= 3 else (host or {}).get("machine") or meta.get("machine")
    if release:
        info.utsname.sysname = uname[0] if len(uname) >= 3 else "Linux"
        info.utsname.release = release
    if machine:
        info.utsname.machine = str(machine)
    if meta.get("page_size"):
        info.page_size = int(meta["page_size"])
    if meta.get("cpus"):
        info.num_cpus = len(meta["cpus"])
    return packet


def kernel_release(meta: Mapping[str, Any], host: Mapping[str, Any] | None = None) -> str | None:
    """The kernel release a trace states (uname, its capture's record, the bundle's host)."""
    uname = str(meta.get("uname") or "").split()
    if len(uname) >= 3:
        return uname[2]
    release = meta.get("kernel_release") or (host or {}).get("kernel_release")
    return str(release) if release else None


def collect_tasks(events: pl.DataFrame, tables: Mapping[str, pl.DataFrame]) -> Tasks:
    """Gather every task the trace mentions, with its latest name."""
    tasks = Tasks()
    for pid, tgid, comm in _last_per_pid(events, "common_pid", "tgid", "comm"):
        if comm is not None:
            tasks.names[pid] = comm
        if tgid is not None:
            tasks.tgids[pid] = tgid
    for event, pid_col, name_col in _NAMING_FIELDS:
        table = tables.get(event)
        if table is None or pid_col not in table.columns or name_col not in table.columns:
            continue
        for pid, name in _last_per_pid(table, pid_col, name_col):
            if pid is not None and name:
                tasks.names[pid] = name
    fork = tables.get("sched_process_fork")
    if fork is not None and {"child_pid", "parent_pid"} <= set(fork.columns):
        tasks.parents.update(_last_per_pid(fork, "child_pid", "parent_pid"))
    exe = tables.get("sched_process_exec")
    if exe is not None and {"pid", "filename"} <= set(exe.columns):
        tasks.executed.update(_last_per_pid(exe, "pid", "filename"))
    tasks.names.pop(0, None)  # the idle task is not a process or thread to list
    return tasks


def _last_per_pid(frame: pl.DataFrame, pid: str, *columns: str) -> Iterator[tuple[Any, ...]]:
    """(pid, columns...) of each pid's last row, in one hashed pass (its memory is the
    number of distinct pids, not of rows)."""
    last = frame.lazy().group_by(pid).agg(pl.col(*columns).last()).collect()
    yield from last.select(pid, *columns).iter_rows()


def _leaders(tasks: Tasks) -> set[int]:
    """The processes the tree lists: thread-group leaders seen, and those that exec'd."""
    leaders = {tgid for tgid in tasks.tgids.values() if tgid} | set(tasks.executed)
    leaders.discard(0)
    return leaders


def tree_names(tasks: Tasks) -> dict[int, str]:
    """The thread names the process tree gives (process_tree_packet's): trace_processor
    holds them above any sched event's comm, so a compact switch's prev_comm is that."""
    leaders = _leaders(tasks)
    if not leaders:
        return {}
    names = {
        pid: tasks.names.get(pid) or f"<pid {pid}>" for pid in leaders if pid not in tasks.executed
    }
    for tid, tgid in tasks.tgids.items():
        if tid and tgid and tid != tgid and tid in tasks.names:
            names[tid] = tasks.names[tid]
    return names


def process_tree_packet(tasks: Tasks, first_ts: int | None) -> TracePacket | None:
    """ProcessTree with every process (with a cmdline) and thread the trace shows."""
    leaders = _leaders(tasks)
    if not leaders:
        return None
    packet = TracePacket(trusted_packet_sequence_id=FTRACE_SEQUENCE)
    if first_ts is not None:
        packet.timestamp = first_ts
    tree = packet.process_tree
    for pid in sorted(leaders):
        process = tree.processes.add(pid=pid)
        parent = tasks.parents.get(pid)
        if parent is not None:
            process.ppid = tasks.tgids.get(parent, parent)
        if pid in tasks.executed:
            process.cmdline.append(tasks.executed[pid])
        else:
            process.cmdline.append(tasks.names.get(pid) or f"<pid {pid}>")
            process.cmdline_is_comm = True
    for tid, tgid in sorted(tasks.tgids.items()):
        if tid and tgid and tid != tgid:
            thread = tree.threads.add(tid=tid, tgid=tgid)
            if tid in tasks.names:
                thread.name = tasks.names[tid]
    return packet
