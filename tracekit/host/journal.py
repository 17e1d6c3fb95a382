"""A record on disk of each change a run makes to the host, written BEFORE the change.

The cleanup stack undoes a run's changes on every ending it sees (cleanup.py); SIGKILL,
an out-of-memory kill or a crashed interpreter give it none. So each change is first
appended here as plain data (what to put back, and how), and each undo that ran is
appended as done. The next run, or `tracekit cleanup`, replays newest first what a dead
run left undone, and says what it could not undo and how to do it by hand.

The journal lives under /run (tmpfs): like tracefs settings, probes and mounts it does
not survive a reboot, and a reboot undoes everything it records. A live run holds an
exclusive flock on its journal, which the kernel drops however the run dies: a journal
that can be locked is a dead run's, whatever became of its pid.

A journal kept on disk ($TRACEKIT_JOURNAL_DIR) can outlive a reboot, and then its pids
are other processes' and its kernel state is gone. So each journal first records the
boot it was written in, and each process record the process's start time: a process is
signalled only in the same boot, and only if it is still that process (or, once its
tool is gone, carries the run's mark in its environment). A journal from an earlier boot
gets only its files removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit.errors import TracekitError
from tracekit.host.procs import boot_id, carries, group_members, process_start
from tracekit.host.tracefsio import remove_probe, unmount_tracefs, write_once

DEFAULT_JOURNAL_DIR = Path("/run/tracekit")
# Tests (and a host whose /run is unusable) point the journal elsewhere with this.
JOURNAL_DIR_ENV = "TRACEKIT_JOURNAL_DIR"
SUFFIX = ".journal"
# Every tool a journaled run starts has this in its environment, set to the journal's
# name; the tool's own children inherit it. Nothing else on the host carries it.
RUN_MARK_ENV = "TRACEKIT_RUN"

Entry = dict[str, Any]


def journal_dir() -> Path:
    """Where journals are kept: $TRACEKIT_JOURNAL_DIR, else /run/tracekit."""
    return Path(os.environ.get(JOURNAL_DIR_ENV) or DEFAULT_JOURNAL_DIR)


class Journal:
    """This run's journal: append-only JSON lines, each synced before the change it records."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._next_id = 1
        self._pending: set[int] = set()

    @classmethod
    def create(cls, directory: Path | None = None) -> Journal:
        """Open a new journal for this process and lock it for as long as the process lives."""
        directory = directory or journal_dir()
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            # The time keeps a reused pid from meeting its predecessor's journal.
            path = directory / f"{os.getpid()}-{time.time_ns():x}{SUFFIX}"
            # Locked under another name first: a recoverer must never find it unlocked.
            fresh = path.with_suffix(".new")
            fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            fresh.rename(path)
        except OSError as err:
            raise TracekitError(
                f"cannot write the cleanup journal in {directory}: {err.strerror}; "
                f"make it writable or set {JOURNAL_DIR_ENV} to a directory on tmpfs"
            ) from None
        made = cls(path, fd)
        made._append({"boot": boot_id()})  # before any record: replay trusts none without it
        return made

    @property
    def mark(self) -> str:
        """The value of RUN_MARK_ENV in this run's tools: the journal's name."""
        return self.path.name.removesuffix(SUFFIX)

    def record(self, entry: Entry) -> int:
        """Write one change's undo record and sync it; returns its id for `done`."""
        entry_id = self._next_id
        self._next_id += 1
        self._append({"id": entry_id, **entry})
        self._pending.add(entry_id)
        return entry_id

    def done(self, entry_id: int) -> None:
        """Note that the change `entry_id` has been undone (or was never made)."""
        self._pending.discard(entry_id)
        # Unrecorded, the undo is merely done again by the next run: every undo is
        # idempotent, and a failure here must not stop the unwinding.
        with contextlib.suppress(TracekitError):
            self._append({"done": entry_id})

    def close(self) -> None:
        """Delete the journal if everything in it was undone, else keep it for the next run."""
        if self._fd < 0:
            return
        if not self._pending:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1

    def _append(self, line: Entry) -> None:
        """One write(2) of one line, then fsync: the record is there before the change."""
        try:
            os.write(self._fd, (json.dumps(line, sort_keys=True) + "\n").encode())
            os.fsync(self._fd)
        except OSError as err:
            raise TracekitError(
                f"cannot write the cleanup journal {self.path}: {err.strerror}; the change it "
                "was to record was not made (free space in /run, or set "
                f"{JOURNAL_DIR_ENV})"
            ) from None


# --- what each kind of record is, how to undo it, and how a person would -----------------


def setting(path: Path, value: str) -> Entry:
    """A file (tracefs, /proc/sys, sysfs) to write `value` back into."""
    return {"kind": "setting", "path": str(path), "value": value}


def instance(path: Path) -> Entry:
    """A tracefs instance directory to remove."""
    return {"kind": "instance", "path": str(path)}


def probe(control: Path, name: str) -> Entry:
    """A probe ("group/event") to delete from kprobe_events or uprobe_events."""
    return {"kind": "probe", "control": str(control), "name": name}


def mount(path: Path) -> Entry:
    """A tracefs mount to unmount."""
    return {"kind": "mount", "path": str(path)}


def process(pid: int, argv0: str) -> Entry:
    """A child process group (its pid is its group id) to kill, if it is still that child."""
    return {"kind": "process", "pid": pid, "start": process_start(pid), "argv0": argv0}


def temporary_file(path: Path) -> Entry:
    """A file of the run's own (outside the bundle) to delete."""
    return {"kind": "file", "path": str(path)}


def expand_buffer(path: Path, full: str) -> Entry:
    """The top-level buffer_size_kb to give its full size if it is still the boot size."""
    return {"kind": "expand_buffer", "path": str(path), "value": full}


# Per kind: what undoing a record does, in words, and the shell command that does it.
WORDS = {
    "setting": ("restore {path} to {value!r}", "echo '{value}' > {path}"),
    "instance": ("remove tracefs instance {path}", "rmdir {path}"),
    "probe": ("remove probe {name}", "echo '-:{name}' >> {control}"),
    "mount": ("unmount tracefs from {path}", "umount {path}"),
    "process": ("stop {argv0} (process group {pid})", "kill -KILL -- -{pid}"),
    "expand_buffer": ("give {path} its full size ({value} KB)", "echo '{value}' > {path}"),
    "file": ("remove {path}", "rm -f {path}"),
}


def describe(entry: Entry) -> str:
    """What undoing the record does, in words."""
    return _words(entry, 0, f"understand the record {entry!r}")


def by_hand(entry: Entry) -> str:
    """The shell command that undoes the record, for the user to run."""
    return _words(entry, 1, "inspect the record and undo it by hand")


def _words(entry: Entry, which: int, unknown: str) -> str:
    """One of a kind's WORDS filled in from the record (a damaged record gets `unknown`)."""
    try:
        return WORDS[entry["kind"]][which].format(**entry)
    except (KeyError, TypeError, IndexError, ValueError):
        return unknown


def undo(entry: Entry, mark: str = "") -> None:
    """Undo one record of this boot; a no-op where the change is already gone (or never made).

    `mark` is the journal's RUN_MARK_ENV value, which the run's tools' children carry.
    """
    kind = entry.get("kind")
    if kind == "setting":
        path = Path(entry["path"])
        # A setting of a tracefs instance that is gone (removed by its own record, or by
        # hand) went with it; only a missing file in a directory still there is an error.
        if path.exists() or path.parent.exists():
            write_once(path, entry["value"])
    elif kind == "instance":
        with contextlib.suppress(FileNotFoundError):
            Path(entry["path"]).rmdir()
    elif kind == "probe":
        remove_probe(Path(entry["control"]), entry["name"])
    elif kind == "mount":
        unmount_tracefs(Path(entry["path"]))
    elif kind == "process":
        _kill_group(entry["pid"], entry["start"], mark)
    elif kind == "file":
        Path(entry["path"]).unlink(missing_ok=True)
    elif kind == "expand_buffer":
        path = Path(entry["path"])
        if "expanded" not in path.read_text():
            write_once(path, entry["value"])
    else:
        raise OSError(f"tracekit does not know how to undo {entry!r}")


def _kill_group(pid: int, start: int | None, mark: str) -> None:
    """SIGKILL a dead run's tool group: all of it if its leader is still that tool, else
    the members that carry the run's mark (what the tool started, after it died)."""
    now = process_start(pid)
    if now is not None:
        if now == start:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        # Else the pid is another process's: no group of ours can have that id while it lives.
        return
    # A group's id can be reused once the group is empty; only the mark says it is ours.
    for member in group_members(pid):
        if mark and carries(member, RUN_MARK_ENV, mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)


# --- the next run: find dead runs' journals and replay them -------------------------------


@dataclass
class Recovery:
    """What recovering dead runs' journals did, and what it could not do."""

    undone: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    adopted: list[Path] = field(default_factory=list)


def pending_entries(text: str) -> list[Entry]:
    """The records of a journal not yet marked done, oldest first.

    A SIGKILL in the middle of a write leaves a partial last line: its change was never
    made (the record comes first), so it is skipped.
    """
    entries: dict[int, Entry] = {}
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        if "done" in item:
            entries.pop(item["done"], None)
        elif isinstance(item.get("id"), int):
            entries[item["id"]] = item
    return [entries[key] for key in sorted(entries)]


def recover(
    directory: Path | None = None, keep_mounted: Callable[[Path], bool] | None = None
) -> Recovery:
    """Undo what dead runs left, newest change first; live runs' journals are left alone.

    `keep_mounted(path)` says whether a dead run's tracefs mount is in use by the caller
    (then it is adopted: the caller unmounts it on its way out) instead of unmounted now.
    """
    directory = directory or journal_dir()
    recovery = Recovery()
    if not directory.is_dir():
        return recovery
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        with _locked(path) as fd:
            if fd is not None:
                _recover_one(path, fd, recovery, keep_mounted)
    return recovery


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[int | None]:
    """The journal's descriptor, locked; None if a live run (or a recoverer) holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except FileNotFoundError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)


def _recover_one(
    path: Path, fd: int, recovery: Recovery, keep_mounted: Callable[[Path], bool] | None
) -> None:
    """Replay one dead run's journal; remove it when nothing is left."""
    left_before = len(recovery.left)
    text = path.read_text(errors="replace")
    now = boot_id()
    if now is None or journal_boot(text) != now:
        _recover_earlier_boot(path, fd, pending_entries(text), recovery)
    else:
        mark = path.name.removesuffix(SUFFIX)
        for entry in reversed(pending_entries(text)):
            kind, where = entry.get("kind"), Path(str(entry.get("path")))
            if kind == "mount" and keep_mounted and keep_mounted(where):
                recovery.adopted.append(where)
                _mark_done(fd, entry)
            elif _undo_or_say(entry, fd, recovery, mark):
                recovery.undone.append(describe(entry))
    if len(recovery.left) == left_before:
        path.unlink(missing_ok=True)
    else:
        recovery.left.append(f"then remove the journal {path}")


def _undo_or_say(entry: Entry, fd: int, recovery: Recovery, mark: str) -> bool:
    """Undo one record and mark it done, or add what to do by hand to `recovery.left`."""
    try:
        undo(entry, mark)
    except (OSError, TracekitError, ValueError, KeyError, TypeError) as err:
        recovery.left.append(f"could not {describe(entry)} ({err}); do it with: {by_hand(entry)}")
        return False
    _mark_done(fd, entry)
    return True


def _mark_done(fd: int, entry: Entry) -> None:
    """Append the record's done line to its journal (the recoverer holds the lock)."""
    os.write(fd, (json.dumps({"done": entry["id"]}) + "\n").encode())


def _recover_earlier_boot(path: Path, fd: int, entries: list[Entry], recovery: Recovery) -> None:
    """A journal from another boot: its kernel state died with that boot; remove its files.

    Its pids are other processes' now, its instances, probes and settings were reset, and
    a tracefs mount at its path is this boot's: nothing but its files is touched.
    """
    files = [entry for entry in reversed(entries) if entry.get("kind") == "file"]
    # Named once each: a journal kept on disk from an earlier version holds a record per
    # run for one file (each run's histogram stayed pending until the collect ended).
    removed = dict.fromkeys(
        str(entry["path"]) for entry in files if _undo_or_say(entry, fd, recovery, "")
    )
    recovery.undone.append(
        f"{path.name} is from an earlier boot: kernel state already reset; files it left: "
        + (f"{', '.join(removed)} (removed)" if removed else "none")
    )


def journal_boot(text: str) -> str | None:
    """The boot id a journal says it was written in (its first line), or None if it has none."""
    first = text.partition("\n")[0]
    try:
        head = json.loads(first)
    except ValueError:
        return None
    return head.get("boot") if isinstance(head, dict) else None
