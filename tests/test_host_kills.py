"""SIGINT, SIGTERM and SIGKILL at every setup phase, on this machine's REAL tracefs.

A child Python process sets up as collect does (instance, clock and buffer, task names
with the top-level saved_cmdlines_size, a uprobe, events and a filter, a child tool with
a grandchild, tracing) with a journal in a directory of the test's own, and says when
each phase is done. The signal is sent as soon as the phase is announced, so it lands
while the next phase's changes are being made. Then every kind of leftover is counted:
instances, probes, tracefs settings (top level, with the instance list and probe
lists), child processes, journals. SIGINT and SIGTERM must leave none; after SIGKILL
the next start (`remove_leftovers`, what collect calls) must leave none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_kill_support import NONE, PHASES, leftovers, run_until
from host_uprobes import libc_uprobe_target

from tracekit.errors import TracekitError
from tracekit.host.cleanup import CleanupStack
from tracekit.host.journal import JOURNAL_DIR_ENV
from tracekit.host.probes import remove_leftovers
from tracekit.host.tracefs import Tracefs, snapshot

# `root` (skips without root or tracefs).
pytest_plugins = ["host_tracefs_support"]


@pytest.fixture
def journals() -> Iterator[Path]:
    """A journal directory of the test's own, outside pytest's tmp (which other runs prune).

    It is removed only if the test left it empty; otherwise it is kept, so that the
    failure can be looked at and `tracekit cleanup` run on it.
    """
    directory = Path(tempfile.mkdtemp(prefix="tracekit-test-journals-"))
    yield directory
    with contextlib.suppress(OSError):
        directory.rmdir()


@pytest.fixture
def uprobe(root: Path) -> str:
    """The uprobe target the child defines (this kernel has uprobe_events, not kprobes)."""
    if not (root / "uprobe_events").exists():
        pytest.skip("this kernel has no uprobe_events (CONFIG_UPROBE_EVENTS not set)")
    if not (root / "saved_cmdlines_size").exists():
        pytest.skip("this kernel has no saved_cmdlines_size")
    return libc_uprobe_target("getppid")


@pytest.fixture
def small_saved_cmdlines(root: Path) -> None:
    """saved_cmdlines_size below what tracekit wants, so the child has to change it."""
    path = root / "saved_cmdlines_size"
    if int(path.read_text()) >= 8192:
        pytest.skip("saved_cmdlines_size is already as large as tracekit asks")


@pytest.mark.usefixtures("small_saved_cmdlines")
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["INT", "TERM", "KILL"]
)
def test_a_signal_at_each_setup_phase_leaves_nothing_after_the_next_start(
    root: Path,
    uprobe: str,
    journals: Path,
    monkeypatch: pytest.MonkeyPatch,
    phase: str,
    signum: int,
) -> None:
    monkeypatch.setenv(JOURNAL_DIR_ENV, str(journals))
    marker = f"{os.getpid()}-{phase}-{signum}"
    before = snapshot(root)
    pid = run_until(phase, signum, uprobe, marker, dict(os.environ))
    left = leftovers(root, before, pid, marker, journals)
    if signum != signal.SIGKILL:
        assert left == NONE
        return
    # The kernel killed the child tool (parent-death signal), but not its grandchild.
    assert len(left["children"]) <= 1
    with CleanupStack() as stack:
        remove_leftovers(Tracefs.open(stack))
    assert leftovers(root, before, pid, marker, journals) == NONE


@pytest.mark.usefixtures("small_saved_cmdlines")
def test_sigkill_leftovers_are_counted_and_tracekit_cleanup_removes_them(
    root: Path, uprobe: str, journals: Path
) -> None:
    env = {**os.environ, JOURNAL_DIR_ENV: str(journals)}
    marker = f"{os.getpid()}-cli"
    before = snapshot(root)
    pid = run_until("tracing", signal.SIGKILL, uprobe, marker, env)
    left = leftovers(root, before, pid, marker, journals)
    # Everything but the child tool itself, which died with its parent.
    assert len(left["instances"]) == 1 and len(left["probes"]) == 1
    assert left["settings"] == ["top/saved_cmdlines_size"]
    assert len(left["children"]) == 1 and len(left["journals"]) == 1
    result = subprocess.run(
        [sys.executable, "-m", "tracekit", "cleanup"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"remove tracefs instance {root}/instances/tracekit-{pid}" in result.stdout
    assert f"remove probe tracekit/tk_kill_{pid}" in result.stdout
    assert f"restore {root}/saved_cmdlines_size" in result.stdout
    assert leftovers(root, before, pid, marker, journals) == NONE
    again = subprocess.run(
        [sys.executable, "-m", "tracekit", "cleanup"], capture_output=True, text=True, env=env
    )
    assert again.stdout == "nothing left behind by killed tracekit runs\n", again.stderr


@pytest.mark.usefixtures("small_saved_cmdlines")
def test_what_cannot_be_undone_is_named_with_the_command(
    root: Path, uprobe: str, journals: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(JOURNAL_DIR_ENV, str(journals))
    before = snapshot(root)
    pid = run_until("tracing", signal.SIGKILL, uprobe, "cannot", dict(os.environ))
    # Somebody holds the dead run's instance open: rmdir gets EBUSY.
    busy = open(root / "instances" / f"tracekit-{pid}" / "trace_pipe", "rb")  # noqa: SIM115
    with (
        busy,
        pytest.raises(TracekitError, match="could not be undone") as err,
        CleanupStack() as stack,
    ):
        remove_leftovers(Tracefs.open(stack))
    message = str(err.value)
    assert f"rmdir {root}/instances/tracekit-{pid}" in message
    assert "then remove the journal" in message and "\n" not in message
    # Once it is free, the next start finishes the job.
    with CleanupStack() as stack:
        remove_leftovers(Tracefs.open(stack))
    assert leftovers(root, before, pid, "cannot", journals) == NONE


# Inside a private mount namespace: unmount tracefs, let the child mount it, SIGKILL the
# child, count the mount, run `tracekit cleanup`, count again.
MOUNT_DRIVER = textwrap.dedent(
    """
    import signal, subprocess, sys
    from tracekit.host.tracefsio import tracefs_mounts
    for point in tracefs_mounts():
        subprocess.run(["umount", str(point)], check=True)
    child = subprocess.Popen(
        [sys.executable, "-c",
         "from tracekit.host.cleanup import CleanupStack\\n"
         "from tracekit.host.tracefs import Tracefs\\n"
         "import time\\n"
         "with CleanupStack.journaled() as stack:\\n"
         "    Tracefs.open(stack)\\n"
         "    print('READY', flush=True)\\n"
         "    time.sleep(1000)\\n"],
        stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout.readline() == "READY\\n"
    child.send_signal(signal.SIGKILL)
    child.wait()
    print("killed", len(tracefs_mounts()))
    done = subprocess.run([sys.executable, "-m", "tracekit", "cleanup"],
                          capture_output=True, text=True)
    print("cleanup", done.returncode)
    print(done.stdout.strip())
    print(done.stderr, file=sys.stderr)
    print("after", len(tracefs_mounts()))
    """
)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
@pytest.mark.usefixtures("root")
def test_a_tracefs_mount_left_by_sigkill_is_unmounted_by_the_next_start(journals: Path) -> None:
    env = {**os.environ, JOURNAL_DIR_ENV: str(journals)}
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", MOUNT_DRIVER],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if result.returncode != 0 and "unshare failed" in result.stderr:
        pytest.skip(f"cannot make a mount namespace here: {result.stderr.strip()}")
    lines = result.stdout.splitlines()
    assert lines[0] == "killed 1", result.stderr
    assert lines[1] == "cleanup 0", result.stderr
    assert "undone: adopted the tracefs mount at /sys/kernel/tracing" in lines[1:-1]
    assert lines[-1] == "after 0"
    assert not any(journals.iterdir())
