"""tracefs below the undo stack: where it is mounted, one-write writes, probe removal, umount.

The one owner of these for tracefs.py (a run, with its cleanup stack) and journal.py (the
undo of a dead run's records, which has no stack and is imported by cleanup.py, so it
cannot use tracefs.py). Nothing here records or undoes anything.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from tracekit.errors import TracekitError

PROC_MOUNTS = Path("/proc/self/mounts")  # this mount namespace's (/proc/mounts links here)

Opener = Callable[[Path, int], AbstractContextManager[int]]


def parse_tracefs_mounts(mounts_text: str) -> list[Path]:
    """Every tracefs mount point in a /proc/mounts text, in its order."""
    found = []
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "tracefs":
            # /proc/mounts escapes spaces and such as octal, e.g. \040.
            found.append(Path(re.sub(r"\\(\d{3})", lambda m: chr(int(m[1], 8)), fields[1])))
    return found


def tracefs_mounts() -> list[Path]:
    """Where tracefs is mounted in this mount namespace now."""
    return parse_tracefs_mounts(PROC_MOUNTS.read_text())


@contextlib.contextmanager
def plain_fd(path: Path, flags: int) -> Iterator[int]:
    """os.open and close, for callers with no stop signals to hold (see cleanup.open_fd)."""
    fd = os.open(path, flags)
    try:
        yield fd
    finally:
        os.close(fd)


def write_once(path: Path, value: str, append: bool = False, opener: Opener = plain_fd) -> None:
    """One write(2) of a whole value, newline-ended: tracefs parses each write as a command.

    Appending never truncates (kprobe_events opened without O_APPEND loses every probe).
    """
    flags = os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC)
    data = (value if value.endswith("\n") or not value else value + "\n").encode()
    with opener(path, flags) as fd:
        os.write(fd, data)


def remove_probe(control: Path, name: str) -> None:
    """Delete one "group/event" probe by name, a no-op when it is not defined."""
    if not control.exists():
        return
    defined = re.findall(r"^[pr]\d*:(\S+)\s", control.read_text(), re.MULTILINE)
    if name in defined:
        write_once(control, f"-:{name}", append=True)


def mount_tracefs(mount_point: Path) -> None:
    """Mount tracefs there, as the kernel's docs do."""
    run_mount_tool(["mount", "-t", "tracefs", "nodev", str(mount_point)])


def unmount_tracefs(mount_point: Path) -> None:
    """Unmount tracefs from there, if it is still mounted there."""
    if mount_point in tracefs_mounts():
        run_mount_tool(["umount", str(mount_point)])


def run_mount_tool(argv: list[str]) -> None:
    """Run mount/umount; a failure is one clear line."""
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as err:
        raise TracekitError(f"cannot run {argv[0]}: {err.strerror}; install util-linux") from None
    if result.returncode != 0:
        raise TracekitError(
            f"{' '.join(argv)} failed: {result.stderr.strip() or result.returncode}; "
            "is tracefs built into this kernel (CONFIG_FTRACE)?"
        )
