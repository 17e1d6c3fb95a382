"""The host side's undo stack: order, failures, signals and child process groups.

Signals are tested on real child Python processes: the child says when it is ready (or
unwinding) on a pipe, so nothing here depends on timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tracekit.errors import TracekitError
from tracekit.host import journal
from tracekit.host.cleanup import CleanupStack, Interrupted, stop_process_group
from tracekit.host.journal import Journal, pending_entries, recover
from tracekit.host.procs import group_members


def test_undo_runs_newest_first_on_success() -> None:
    done: list[str] = []
    with CleanupStack() as stack:
        stack.push("first", lambda: done.append("first"))
        stack.push("second", lambda: done.append("second"))
        assert done == []
    assert done == ["second", "first"]


def test_undo_runs_on_error_and_the_error_propagates() -> None:
    done: list[str] = []
    with pytest.raises(ValueError, match="boom"), CleanupStack() as stack:
        stack.push("undo", lambda: done.append("undo"))
        raise ValueError("boom")
    assert done == ["undo"]


def test_failed_undo_does_not_stop_the_others_and_is_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    done: list[str] = []

    def broken() -> None:
        raise OSError("device busy")

    expected = "NOT fully restored: could not put X back"
    with pytest.raises(TracekitError, match=expected), CleanupStack() as stack:
        stack.push("remove Y", lambda: done.append("Y"))
        stack.push("put X back", broken)
        stack.push("remove Z", lambda: done.append("Z"))
    assert done == ["Z", "Y"]
    assert "tracekit: warning: could not put X back: device busy" in capsys.readouterr().err


def test_failed_undo_under_another_error_keeps_that_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken() -> None:
        raise OSError("device busy")

    with pytest.raises(ValueError, match="original"), CleanupStack() as stack:
        stack.push("put X back", broken)
        raise ValueError("original")
    assert "could not put X back" in capsys.readouterr().err


def test_close_is_idempotent() -> None:
    done: list[str] = []
    stack = CleanupStack()
    stack.push("once", lambda: done.append("once"))
    stack.close()
    stack.close()
    assert done == ["once"]


def test_signal_handlers_are_given_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with CleanupStack():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


# A child that pushes an undo writing a file, says READY, then waits for a signal.
CHILD_WAITS_FOR_SIGNAL = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tracekit.host.cleanup import CleanupStack, Interrupted
    out = Path(sys.argv[1])
    try:
        with CleanupStack() as stack:
            stack.push("write the file", lambda: out.write_text("restored"))
            print("READY", flush=True)
            while True:
                time.sleep(3600)
    except Interrupted as stop:
        print(f"interrupted {stop.signum}", flush=True)
        sys.exit(stop.exit_code)
    """
)


def _child(script: str, *args: str) -> subprocess.Popen[str]:
    """Start a Python child running `script`, with pipes for its standard streams."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_stop_signal_unwinds_the_stack(tmp_path: Path, signum: int) -> None:
    out = tmp_path / "undone"
    child = _child(CHILD_WAITS_FOR_SIGNAL, str(out))
    assert child.stdout is not None
    assert child.stdout.readline() == "READY\n"
    child.send_signal(signum)
    stdout, stderr = child.communicate(timeout=60)
    assert stdout == f"interrupted {signum}\n", stderr
    assert child.returncode == 128 + signum
    assert out.read_text() == "restored"


# A child whose undo action waits for the parent, so a second signal lands mid-unwind.
CHILD_SLOW_UNDO = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tracekit.host.cleanup import CleanupStack, Interrupted
    out = Path(sys.argv[1])

    def slow_undo():
        print("UNDOING", flush=True)
        sys.stdin.readline()
        out.write_text("restored")

    try:
        with CleanupStack() as stack:
            stack.push("second undo", lambda: out.with_suffix(".2").write_text("ok"))
            stack.push("slow undo", slow_undo)
            print("READY", flush=True)
            while True:
                time.sleep(3600)
    except Interrupted:
        sys.exit(130)
    """
)


def test_second_signal_during_unwinding_does_not_cut_it_short(tmp_path: Path) -> None:
    out = tmp_path / "undone"
    child = _child(CHILD_SLOW_UNDO, str(out))
    assert child.stdout is not None and child.stderr is not None and child.stdin is not None
    assert child.stdout.readline() == "READY\n"
    child.send_signal(signal.SIGINT)
    assert child.stdout.readline() == "UNDOING\n"
    child.send_signal(signal.SIGINT)
    assert "SIGINT received while restoring the host" in child.stderr.readline()
    child.stdin.write("go on\n")
    child.stdin.flush()
    child.communicate(timeout=60)
    assert child.returncode == 130
    assert out.read_text() == "restored"
    assert out.with_suffix(".2").read_text() == "ok"


def _group_exists(pgid: int) -> bool:
    """Whether any live process of the group is left (zombies are dead, awaiting reaping)."""
    return bool(group_members(pgid))


def test_spawned_process_group_is_stopped_with_its_children() -> None:
    with CleanupStack() as stack:
        # The shell starts a grandchild in the same group; both must go.
        proc = stack.spawn(["sh", "-c", "sleep 1000 & echo started; wait"], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"
        assert os.getpgid(proc.pid) == proc.pid
    proc.stdout.close()
    assert proc.returncode is not None
    assert not _group_exists(proc.pid)


def _started(argv: list[str]) -> subprocess.Popen[bytes]:
    """A child in its own session, once it has printed "started"."""
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"
    proc.stdout.close()
    return proc


IGNORES_SIGTERM = ["sh", "-c", "trap '' TERM; echo started; sleep 1000"]


def test_a_child_ignoring_sigterm_is_killed() -> None:
    proc = _started(IGNORES_SIGTERM)
    stop_process_group(proc, grace=0.2)
    assert proc.returncode == -signal.SIGKILL
    assert not _group_exists(proc.pid)


def test_a_stopped_child_that_handles_sigterm_ends_in_order() -> None:
    # A handled SIGTERM does not wake a SIGSTOPped task: without the SIGCONT it stayed
    # pending for 2 x grace and the child was SIGKILLed (review 20, M3).
    handler = "import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"
    proc = _started(
        [sys.executable, "-c", handler + "print('started', flush=True)\ntime.sleep(60)"]
    )
    os.kill(proc.pid, signal.SIGSTOP)
    began = time.monotonic()
    stop_process_group(proc, grace=10)
    assert proc.returncode == 3
    assert time.monotonic() - began < 5


def test_the_grace_is_the_whole_wait_before_sigkill() -> None:
    proc = _started(IGNORES_SIGTERM)
    began = time.monotonic()
    stop_process_group(proc, grace=1.0)
    took = time.monotonic() - began
    assert proc.returncode == -signal.SIGKILL
    assert 1.0 <= took < 1.8, took  # was 2 x grace


def test_spawn_of_a_missing_tool_is_one_clear_line() -> None:
    expected = "cannot start no-such-tool-xyz"
    with pytest.raises(TracekitError, match=expected) as err, CleanupStack() as stack:
        stack.spawn(["no-such-tool-xyz"])
    assert "\n" not in str(err.value)


def test_interrupted_is_a_keyboard_interrupt_with_the_shell_exit_code() -> None:
    stop = Interrupted(signal.SIGTERM)
    assert isinstance(stop, KeyboardInterrupt)
    assert stop.exit_code == 143


def test_the_host_side_never_imports_polars() -> None:
    modules = "cleanup, journal, tracefs, instance, probes, rawcapture"
    script = f"import sys; from tracekit.host import {modules}; print('polars' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout == "False\n", result.stderr


# A child that finishes its work, then gets SIGTERM while its undo action runs.
CHILD_STOPPED_WHILE_RESTORING = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tracekit.host.cleanup import CleanupStack, Interrupted
    out = Path(sys.argv[1])

    def slow_undo():
        print("UNDOING", flush=True)
        sys.stdin.readline()
        out.write_text("restored")

    try:
        with CleanupStack() as stack:
            stack.push("slow undo", slow_undo)
    except Interrupted as stop:
        sys.exit(stop.exit_code)
    """
)


def test_signal_while_restoring_after_success_still_ends_as_stopped(tmp_path: Path) -> None:
    out = tmp_path / "undone"
    child = _child(CHILD_STOPPED_WHILE_RESTORING, str(out))
    assert child.stdout is not None and child.stderr is not None and child.stdin is not None
    assert child.stdout.readline() == "UNDOING\n"
    child.send_signal(signal.SIGTERM)
    assert "SIGTERM received while restoring the host" in child.stderr.readline()
    child.stdin.write("go on\n")
    child.stdin.flush()
    child.communicate(timeout=60)
    assert child.returncode == 128 + signal.SIGTERM
    assert out.read_text() == "restored"


@pytest.mark.parametrize("other_thread", [False, True], ids=["alone", "with-a-thread"])
def test_a_signal_during_a_change_is_handled_after_it_with_the_undo_in_place(
    tmp_path: Path, other_thread: bool
) -> None:
    # With another thread (polars' pool, say) the kernel gives it the signal, which the
    # main thread masks; CPython still runs the handler in the main thread.
    setting = tmp_path / "setting"
    setting.write_text("old")
    made: list[str] = []
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    if other_thread:
        helper.start()

    def change_and_get_signalled() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # held: handled once the change is made
        time.sleep(0.05)  # time for another thread to take it
        setting.write_text("new")
        made.append(setting.read_text())

    try:
        with pytest.raises(Interrupted), CleanupStack() as stack:
            stack.change("restore", lambda: setting.write_text("old"), change_and_get_signalled)
            raise AssertionError("the signal should have been handled right after the change")
    finally:
        stop.set()
    assert made == ["new"]
    assert setting.read_text() == "old"


def test_a_change_that_fails_has_its_undo_withdrawn(tmp_path: Path) -> None:
    done: list[str] = []

    def fails() -> None:
        raise OSError("refused")

    with CleanupStack(Journal.create(tmp_path)) as stack, pytest.raises(OSError, match="refused"):
        stack.change("undo it", lambda: done.append("undone"), fails, {"kind": "x"})
    assert done == []
    assert list(tmp_path.iterdir()) == []  # nothing pending: the journal is gone


def test_the_journal_holds_each_record_until_its_undo_ran(tmp_path: Path) -> None:
    setting = tmp_path / "setting"
    setting.write_text("old\n")
    stack = CleanupStack(Journal.create(tmp_path / "j"))
    stack.change(
        "restore",
        lambda: setting.write_text("old\n"),
        lambda: setting.write_text("new\n"),
        journal.setting(setting, "old"),
    )
    assert stack.journal is not None
    assert pending_entries(stack.journal.path.read_text()) == [
        {"id": 1, "kind": "setting", "path": str(setting), "value": "old"}
    ]
    # A live run's journal is locked: recovery leaves it alone.
    assert recover(tmp_path / "j").undone == []
    assert setting.read_text() == "new\n"
    stack.close()
    assert list((tmp_path / "j").iterdir()) == []


def test_a_dead_runs_temporary_file_is_removed_by_the_next_start(tmp_path: Path) -> None:
    # The cyclictest histogram in $TMPDIR: a board's /tmp may be on disk, kept by reboots.
    left = tmp_path / "tracekit-1-cyclictest-hist.txt"
    dead = Journal.create(tmp_path / "j")
    dead.record(journal.temporary_file(left))
    left.write_text("000000 1\n")
    dead.close()  # unlocked with a record pending: what a SIGKILLed run leaves
    recovery = recover(tmp_path / "j")
    assert recovery.undone == [f"remove {left}"] and recovery.left == []
    assert not left.exists() and list((tmp_path / "j").iterdir()) == []
    assert journal.by_hand(journal.temporary_file(left)) == f"rm -f {left}"


def test_a_partial_last_line_is_a_change_never_made() -> None:
    text = '{"id": 1, "kind": "setting"}\n{"id": 2, "kind": "instance"}\n{"done": 2}\n{"id": 3, "ki'
    assert pending_entries(text) == [{"id": 1, "kind": "setting"}]


# A child that spawns a tool through the stack, prints the tool's pid, and waits.
CHILD_WITH_A_TOOL = textwrap.dedent(
    """
    import subprocess, time
    from tracekit.host.cleanup import CleanupStack
    with CleanupStack() as stack:
        quiet = subprocess.DEVNULL
        tool = stack.spawn(["sleep", "1000"], stdout=quiet, stderr=quiet)
        print(tool.pid, flush=True)
        time.sleep(1000)
    """
)


def test_a_spawned_tool_dies_with_a_sigkilled_parent() -> None:
    child = _child(CHILD_WITH_A_TOOL)
    assert child.stdout is not None
    tool = int(child.stdout.readline())
    child.kill()
    child.communicate(timeout=60)
    deadline = time.monotonic() + 10  # the kernel's SIGKILL is on its way, not yet handled
    while _group_exists(tool) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _group_exists(tool)


def test_a_scoped_stack_records_in_the_outer_journal_and_leaves_it_open(tmp_path: Path) -> None:
    setting = tmp_path / "setting"
    setting.write_text("old\n")
    outer = CleanupStack(Journal.create(tmp_path / "j"))
    with outer.scoped() as inner:
        inner.change(
            "restore",
            lambda: setting.write_text("old\n"),
            lambda: setting.write_text("new\n"),
            journal.setting(setting, "old"),
        )
    assert setting.read_text() == "old\n"
    assert outer.journal is not None
    assert pending_entries(outer.journal.path.read_text()) == []
    outer.push("later", lambda: None, {"kind": "x"})  # still open for the outer stack's changes
    outer.close()
    assert list((tmp_path / "j").iterdir()) == []


def test_stop_processes_stops_children_first_and_keeps_the_other_undos(tmp_path: Path) -> None:
    # A tool that writes its last output when stopped (cyclictest flushing its buffer on
    # SIGTERM): a stopped run's files are final only after stop_processes.
    out = tmp_path / "tool.out"
    undone: list[str] = []
    with CleanupStack() as stack:
        stack.push("restore a setting", lambda: undone.append("setting"))
        script = (
            f"trap 'echo flushed >> {out}; exit 0' TERM; echo started; while :; do sleep 0.05; done"
        )
        proc = stack.spawn(["sh", "-c", script], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
        stack.stop_processes()
        assert out.read_text() == "flushed\n" and proc.returncode is not None
        assert undone == []  # only the children were stopped
        proc.stdout.close()
    assert undone == ["setting"]


def test_a_file_undone_out_of_turn_leaves_one_record_however_many_runs_made_it(
    tmp_path: Path,
) -> None:
    # Each quiet or traced run makes and removes the same cyclictest histogram (runners.
    # run_measure); pending until the run's end, each one added a record of it, and a
    # recovery after a power cut named the file once per run (the 2026-12-02 matrix).
    hist = tmp_path / "tracekit-1-cyclictest-hist.txt"
    stack = CleanupStack(Journal.create(tmp_path / "j"))
    assert stack.journal is not None
    for _ in range(3):
        removal = stack.push(
            f"remove {hist}", lambda: hist.unlink(missing_ok=True), journal.temporary_file(hist)
        )
        hist.write_text("000000 1\n")
        stack.undo_now(removal)
        assert not hist.exists()
        assert pending_entries(stack.journal.path.read_text()) == []
    stack.push(f"remove {hist}", lambda: hist.unlink(missing_ok=True), journal.temporary_file(hist))
    hist.write_text("000000 1\n")
    stack.journal.close()  # killed during the fourth run: its record alone is pending
    assert [e["path"] for e in pending_entries(stack.journal.path.read_text())] == [str(hist)]
    assert recover(tmp_path / "j").undone == [f"remove {hist}"]
    assert not hist.exists()
