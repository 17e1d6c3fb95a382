"""The host side's undo stack: whatever tracekit changes on a host is put back, in reverse.

Every change (a tracefs setting, a kprobe, an instance, a mount, a sysctl, a child
process) goes through `CleanupStack.change`, which pushes its undo action BEFORE making
the change, with the stop signals held across the pair, so no signal can fall between
a change and its undo. With a journal (journal.py) the undo is also written to disk
first, so that the next run can undo what a SIGKILL left. Children get SIGKILL from the
kernel when the run dies (PR_SET_PDEATHSIG), even once they have exec'd a tool.

The stack unwinds on success, on error, on Ctrl-C (SIGINT), on SIGTERM and on SIGHUP (a
board's ssh session going away). A failing undo action does not stop the others, and is
never silent: each failure is printed, and if nothing else went wrong the unwinding ends
in a TracekitError naming what is left to fix by hand.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

from tracekit.errors import TracekitError
from tracekit.host import journal
from tracekit.host.journal import Entry, Journal
from tracekit.host.procs import group_members

# The signals that end a run early; each one unwinds the stack before the process exits.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# How long a child process group gets to exit after SIGTERM before it is killed.
CHILD_GRACE_SECONDS = 5.0

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

T = TypeVar("T")


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal; raised so that every undo action still runs.

    It is a KeyboardInterrupt so that code which handles Ctrl-C handles SIGTERM too.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        # The shell's convention for "killed by signal N".
        self.exit_code = 128 + signum


@dataclass
class UndoAction:
    """One thing to put back: what it is (for messages) and how."""

    description: str
    undo: Callable[[], None]
    journal_id: int | None = None
    process: bool = False  # stops a child (stop_processes runs these early)


class CleanupStack:
    """Undo actions run last-in first-out, exactly once, whatever ends the run.

    Use it as a context manager: `with CleanupStack() as stack: ...`. Inside, the stop
    signals raise Interrupted; while the stack unwinds they are noted and otherwise
    ignored, so a second Ctrl-C cannot leave the host half restored.
    """

    def __init__(self, journal: Journal | None = None) -> None:
        self._actions: list[UndoAction] = []
        self._old_handlers: dict[int, Any] = {}
        self._unwinding = False
        self._late_signal: int | None = None
        self.failures: list[str] = []
        self.journal = journal
        self._owns_journal = True

    @classmethod
    def journaled(cls) -> CleanupStack:
        """A stack whose every recorded undo is also on disk (journal.py) for the next run."""
        return cls(Journal.create())

    def scoped(self) -> CleanupStack:
        """A stack for a step that restores its own changes early, in this run's journal."""
        inner = CleanupStack(self.journal)
        inner._owns_journal = False  # the journal lives as long as this, the outer stack
        return inner

    def push(
        self,
        description: str,
        undo: Callable[[], None],
        record: Entry | None = None,
        process: bool = False,
    ) -> UndoAction:
        """Remember how to undo a change; `record` is written to the journal first."""
        journal_id = self.journal.record(record) if self.journal and record else None
        action = UndoAction(description, undo, journal_id, process)
        self._actions.append(action)
        return action

    def undo_now(self, action: UndoAction) -> None:
        """Undo one change now, out of turn, and mark it done in the journal.

        For a change whose life ends inside a step (a tool's temporary file, read and
        done with): left pending until the run ends, each step would add a record of its
        own for the same change, and a recovery would undo and name it once per step.
        """
        with hold_stop_signals():  # no signal between leaving the stack and the undo
            self._actions.remove(action)
            self._run(action)

    def change(
        self,
        description: str,
        undo: Callable[[], None],
        do: Callable[[], T],
        record: Entry | None = None,
    ) -> T:
        """Make a change whose undo (safe even if the change half failed) exists first.

        The stop signals are held from before the undo is pushed until the change is
        made, so a signal is handled either before both or after both. A change that
        raises is taken as not made: its undo is withdrawn, and the error propagates.
        """
        with hold_stop_signals():
            self.push(description, undo, record)
            try:
                return do()
            except BaseException:
                self._withdraw()
                raise

    def spawn(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start a child in its own process group; unwinding stops the whole group.

        The child dies with this process even after a SIGKILL (PR_SET_PDEATHSIG); what it
        started in its group is killed by the next run, from the journal, by the run's mark
        in its environment (journal.RUN_MARK_ENV). Call it from
        the main thread: the kernel sends the death signal when the spawning THREAD ends.
        """
        with hold_stop_signals():
            if self.journal:
                # The mark lets the next run find what the tool started, once the tool is gone.
                env = popen_kwargs.pop("env", None) or os.environ
                popen_kwargs["env"] = {**env, journal.RUN_MARK_ENV: self.journal.mark}
            try:
                proc = subprocess.Popen(
                    list(argv),
                    start_new_session=True,
                    preexec_fn=_child_setup(os.getpid()),
                    **popen_kwargs,
                )
            except OSError as err:
                raise TracekitError(
                    f"cannot start {argv[0]}: {err.strerror}; check that it is installed and "
                    "executable"
                ) from None
            # The pid exists only now; a SIGKILL before this record kills the child anyway
            # (parent-death signal), and it has had no time to start a group of its own.
            self.push(
                f"stop {argv[0]} (pid {proc.pid})",
                lambda: stop_process_group(proc),
                journal.process(proc.pid, argv[0]),
                process=True,
            )
        return proc

    def stop_processes(self) -> None:
        """Stop every child now, newest first, leaving the other undo actions for later.

        A stopped run's outputs are final only once their writers are gone: a tool still
        running (e.g. cyclictest flushing its buffer on SIGTERM) grows a file after the
        bundle recorded its size. A stop signal meanwhile is noted, as while unwinding.
        """
        was_unwinding, self._unwinding = self._unwinding, True
        try:
            for action in [a for a in reversed(self._actions) if a.process]:
                self._actions.remove(action)
                self._run(action)
        finally:
            self._unwinding = was_unwinding

    def _withdraw(self) -> None:
        """Drop the newest undo action: its change was not made."""
        action = self._actions.pop()
        if self.journal and action.journal_id is not None:
            self.journal.done(action.journal_id)

    def __enter__(self) -> CleanupStack:
        """Start catching the stop signals (main thread only: Python's rule)."""
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._old_handlers[signum] = signal.signal(signum, self._on_stop_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Unwind; a failed undo is an error only when nothing else already failed."""
        self._unwinding = True  # first: from here on a signal must not cut the unwinding
        if tb is not None:
            # The frames the error left hold their locals (open files, descriptors on the
            # tracefs instance) until the traceback dies; release them now, or rmdir of
            # the instance fails with EBUSY.
            traceback.clear_frames(tb)
            gc.collect()
        self.close(raise_on_failure=exc is None)

    def close(self, raise_on_failure: bool = True) -> None:
        """Run every pending undo action, newest first; safe to call more than once."""
        self._unwinding = True
        try:
            while self._actions:
                action = self._actions.pop()
                self._run(action)
        finally:
            if self.journal and self._owns_journal:
                # Kept (for the next run) if an undo failed; removed otherwise.
                self.journal.close()
            self._restore_signal_handlers()
            self._unwinding = False
        if self.failures and raise_on_failure:
            raise TracekitError(
                "the host was NOT fully restored: "
                + "; ".join(self.failures)
                + "; undo these by hand (see the lines above)"
            )
        if self._late_signal is not None and raise_on_failure:
            # Asked to stop while restoring after a success: the run still ends as stopped.
            signum, self._late_signal = self._late_signal, None
            raise Interrupted(signum)

    def _run(self, action: UndoAction) -> None:
        """Run one undo action; a failure is reported and remembered, never raised."""
        try:
            action.undo()
        except Exception as err:
            message = f"could not {action.description}: {err}"
            self.failures.append(message)
            print(f"tracekit: warning: {message}", file=sys.stderr, flush=True)
            return
        if self.journal and action.journal_id is not None:
            self.journal.done(action.journal_id)

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        """Turn a stop signal into Interrupted, except while already unwinding."""
        if self._unwinding:
            self._late_signal = signum
            name = signal.Signals(signum).name
            print(
                f"tracekit: {name} received while restoring the host; finishing first",
                file=sys.stderr,
                flush=True,
            )
            return
        if _Held.depth:
            _Held.pending = signum
            return
        raise Interrupted(signum)

    def _restore_signal_handlers(self) -> None:
        """Give the signals back to whoever handled them before the stack existed."""
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        self._old_handlers.clear()


@contextlib.contextmanager
def hold_stop_signals() -> Iterator[None]:
    """Hold the stop signals back while inside; they are handled on the way out.

    The mask keeps them off this thread (no EINTR, no handler in mid-call). Another
    thread (a library's worker pool) may still take a signal sent to the process, and
    CPython then runs the handler here at the next bytecode: it sees the hold and defers.
    """
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    _Held.depth += 1
    try:
        yield
    finally:
        _Held.depth -= 1
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if _Held.depth == 0 and _Held.pending is not None:
            signum, _Held.pending = _Held.pending, None
            signal.raise_signal(signum)  # handled now, by whoever handles it


class _Held:
    """How deep the stop signals are held in the main thread, and one that came meanwhile."""

    depth = 0
    pending: int | None = None


def die_with_parent() -> None:
    """In a child before exec: the kernel sends it SIGKILL when its parent dies, however."""
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _libc() -> ctypes.CDLL:
    """The C library, for prctl (loaded once, in the parent, not after fork)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


_LIBC: ctypes.CDLL | None = None


def _child_setup(parent: int) -> Callable[[], None]:
    """What a spawned child does between fork and exec (async-signal-safe calls only)."""
    libc = _libc()

    def setup() -> None:
        """Die with the parent, take the signals the parent held, and never outlive it."""
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The mask is inherited across fork and exec: a tool must see SIGTERM.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if os.getppid() != parent:
            os._exit(127)  # the parent died before prctl: no death signal will come

    return setup


@contextlib.contextmanager
def open_fd(path: Path | str, flags: int) -> Iterator[int]:
    """os.open a file whose descriptor a stop signal can never leak.

    A signal's Python handler runs right after the system call it interrupted; if that
    call was os.open, Interrupted would be raised before the descriptor is stored, and a
    leaked descriptor on a tracefs file makes the instance impossible to remove (EBUSY).
    So the stop signals are held back until the descriptor is safely owned here.
    """
    fd = -1
    try:
        with hold_stop_signals():
            fd = os.open(path, flags)
        # A signal held meanwhile is raised as the hold ends: fd is already ours to close.
        yield fd
    finally:
        if fd >= 0:
            os.close(fd)


def stop_process_group(proc: subprocess.Popen[Any], grace: float = CHILD_GRACE_SECONDS) -> None:
    """Stop a child and everything it started: SIGTERM then SIGCONT to its group, SIGKILL
    to what is left `grace` s after the SIGTERM (in all: the leader and the group share it).

    SIGCONT because a stopped (state T) process that handles SIGTERM only acts on it once
    continued: the kernel wakes a stopped task for SIGKILL or a fatal default action, not
    for a handled signal (kernel/signal.c, complete_signal), so without it a SIGSTOPped
    VMM kept its SIGTERM pending for the whole grace and was then killed mid-teardown.
    """
    pgid = proc.pid
    # Reaped, its group empty: the pid may be another's by now, so signal nothing (a
    # group with members left keeps its id, which the kernel then gives no one else).
    if proc.returncode is not None and _wait_group_gone(pgid, 0.0):
        return
    deadline = time.monotonic() + grace
    _signal_group(pgid, signal.SIGTERM)
    _signal_group(pgid, signal.SIGCONT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    # Grandchildren that ignore SIGTERM must not outlive the run either.
    if not _wait_group_gone(pgid, max(0.0, deadline - time.monotonic())):
        _signal_group(pgid, signal.SIGKILL)
        if not _wait_group_gone(pgid, CHILD_GRACE_SECONDS):
            raise OSError(f"processes {group_members(pgid)} of group {pgid} survive SIGKILL")
    # Bounded: the group is gone, so the leader is a zombie to reap at once; an unbounded
    # wait here would hang the unwinding (and leave every later child running) if not.
    try:
        proc.wait(timeout=CHILD_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        raise OSError(f"pid {proc.pid} left its group yet could not be reaped") from None


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    """Wait up to `timeout` s for a group to have no live process; whether it has none."""
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _signal_group(pgid: int, signum: int) -> None:
    """Send a signal to a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)
