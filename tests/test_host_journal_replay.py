"""Replaying a dead run's journal signals only that run's own processes, in its own boot.

A journal on disk ($TRACEKIT_JOURNAL_DIR) can outlive a reboot, and a pid can be handed
out again: the processes here are real (sleep, in process groups of their own), and the
journals say another boot, another start time, or a tool gone with its children left.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracekit.host import journal
from tracekit.host.cleanup import CleanupStack
from tracekit.host.journal import RUN_MARK_ENV, Journal, journal_boot, recover
from tracekit.host.procs import boot_id, carries, group_members, process_start

MARK = "4242-dead"  # the dead run's journal name, and so its tools' mark


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process leading a group of its own, killed at the end whatever happened."""
    proc = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def dead_journal(directory: Path, boot: str | None, *entries: journal.Entry) -> Path:
    """A journal as a SIGKILLed run leaves it: its boot, then records never marked done."""
    directory.mkdir(exist_ok=True)
    path = directory / f"{MARK}{journal.SUFFIX}"
    lines = [{"boot": boot}] + [{"id": n, **e} for n, e in enumerate(entries, 1)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def gone(pgid: int, timeout: float = 10.0) -> bool:
    """Wait for a group to have no live process; whether it has none."""
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not group_members(pgid)


def test_a_journal_from_an_earlier_boot_signals_nothing_and_removes_only_files(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    setting, instance, hist = tmp_path / "setting", tmp_path / "tracekit-1", tmp_path / "hist"
    setting.write_text("new\n")
    instance.mkdir()
    hist.write_text("000000 1\n")
    path = dead_journal(
        tmp_path / "j",
        "00000000-0000-0000-0000-000000000000",
        journal.setting(setting, "old"),
        journal.instance(instance),
        journal.temporary_file(hist),
        journal.process(sleeper.pid, "sleep"),  # this very process, its start time right
    )
    recovery = recover(tmp_path / "j")
    assert recovery.undone == [
        f"{path.name} is from an earlier boot: kernel state already reset; "
        f"files it left: {hist} (removed)"
    ]
    assert recovery.left == [] and not path.exists()
    assert sleeper.poll() is None  # the pid is another boot's: not signalled
    assert setting.read_text() == "new\n" and instance.is_dir()  # kernel state: not touched
    assert not hist.exists()


def test_a_file_recorded_by_every_run_in_an_earlier_boot_is_named_once(tmp_path: Path) -> None:
    # Journals on disk written before runs undid their histogram out of turn hold a
    # record per run for one file; after a reboot the recovery names it once.
    hist = tmp_path / "tracekit-1-cyclictest-hist.txt"
    hist.write_text("000000 1\n")
    twice = [journal.temporary_file(hist), journal.temporary_file(hist)]
    path = dead_journal(tmp_path / "j", "00000000-0000-0000-0000-000000000000", *twice)
    assert recover(tmp_path / "j").undone == [
        f"{path.name} is from an earlier boot: kernel state already reset; "
        f"files it left: {hist} (removed)"
    ]
    assert not hist.exists() and not path.exists()


def test_a_journal_that_names_no_boot_is_taken_as_an_earlier_one(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    dead_journal(tmp_path / "j", None, journal.process(sleeper.pid, "sleep"))
    recovery = recover(tmp_path / "j")
    assert recovery.undone[0].endswith(
        "from an earlier boot: kernel state already reset; files it left: none"
    )
    assert sleeper.poll() is None


def test_a_pid_with_another_start_time_is_not_signalled(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    record = journal.process(sleeper.pid, "sleep")
    record["start"] -= 1  # the run's tool started earlier: this pid was handed out again
    dead_journal(tmp_path / "j", boot_id(), record)
    recover(tmp_path / "j")
    assert sleeper.poll() is None


def test_this_boots_tool_still_running_is_killed_with_its_group(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    dead_journal(tmp_path / "j", boot_id(), journal.process(sleeper.pid, "sleep"))
    recovery = recover(tmp_path / "j")
    assert recovery.undone == [f"stop sleep (process group {sleeper.pid})"]
    assert sleeper.wait(timeout=10) == -signal.SIGKILL


def _group_left_by(mark: str | None) -> tuple[int, int]:
    """A group whose leader (sh) has exited, leaving its child (sleep): (group id, child)."""
    env = {"PATH": "/usr/bin:/bin", **({RUN_MARK_ENV: mark} if mark else {})}
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!"],
        start_new_session=True,
        stdout=subprocess.PIPE,
        env=env,
    )
    out, _ = shell.communicate(timeout=10)
    return shell.pid, int(out)


def test_a_gone_tools_children_are_killed_only_if_they_carry_the_runs_mark(
    tmp_path: Path,
) -> None:
    ours, ours_child = _group_left_by(MARK)
    other, other_child = _group_left_by(None)  # the id reused by a group not of ours
    try:
        dead_journal(
            tmp_path / "j",
            boot_id(),
            {"kind": "process", "pid": ours, "start": 1, "argv0": "sh"},
            {"kind": "process", "pid": other, "start": 1, "argv0": "sh"},
        )
        recover(tmp_path / "j")
        assert gone(ours)
        assert group_members(other) == [other_child]
    finally:
        for pid in (ours_child, other_child):
            subprocess.run(["kill", "-KILL", str(pid)], check=False, capture_output=True)


def test_a_journal_records_its_boot_and_marks_its_tools(tmp_path: Path) -> None:
    with CleanupStack(Journal.create(tmp_path)) as stack:
        assert stack.journal is not None
        assert journal_boot(stack.journal.path.read_text()) == boot_id() is not None
        tool = stack.spawn(["sleep", "1000"])
        assert carries(tool.pid, RUN_MARK_ENV, stack.journal.mark)
        record = json.loads(stack.journal.path.read_text().splitlines()[-1])
        assert record["start"] == process_start(tool.pid) is not None
    assert tool.returncode is not None


def test_a_setting_of_an_instance_already_gone_is_undone_with_it(tmp_path: Path) -> None:
    """An instance's setting whose instance no longer exists (a run's own record removed it,
    or someone by hand) changed nothing left to restore: undone, not left for the user; a
    missing setting in a directory still there is still named."""
    gone_instance = tmp_path / "instances" / "tracekit-9" / "buffer_size_kb"
    here = tmp_path / "instances"
    here.mkdir()
    path = dead_journal(tmp_path / "j", boot_id(), journal.setting(gone_instance, "1408"))
    recovery = recover(tmp_path / "j")
    assert recovery.left == [] and not path.exists(), recovery
    dead_journal(tmp_path / "j", boot_id(), journal.setting(here / "missing_kb", "1"))
    assert recover(tmp_path / "j").left[0].startswith(f"could not restore {here / 'missing_kb'}")
