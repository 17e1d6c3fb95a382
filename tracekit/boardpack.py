"""`tracekit board-pack`: one archive a board needs to collect, built on any machine.

The archive's top directory, tracekit-board/, holds the host-side package (tracekit/,
every module: the board imports only the standard-library, click and pyelftools ones),
the reproducer cross-built static (reproducer/build/: vmm, tlbiprobe, gtmark and every
guest preset, where tracekit/host/tools.py looks for them) and run.sh, which checks the
board's python3 and runs `python3 -m tracekit` from the archive. A board needs only
Debian's python3 (3.11 or newer), python3-click and python3-pyelftools.
"""

from __future__ import annotations

import io
import platform
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tracekit.errors import TracekitError

TOP = "tracekit-board"
PACKAGE = Path(__file__).resolve().parent
CHECKOUT = PACKAGE.parent
SHIPPED = (".py", ".sh", ".json", "py.typed")
BINARIES = ("vmm", "tlbiprobe", "gtmark")
RUN_SH = """\
#!/bin/sh
# tracekit on the board: python3 -m tracekit from this archive (the reproducer beside it).
#   sudo ./run.sh collect --rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1 -o bundle
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "tracekit: needs python3 3.11 or newer (Debian bookworm or later): apt install python3" >&2
    exit 1
fi
if ! python3 -c 'import click, elftools' 2>/dev/null; then
    echo "tracekit: needs click and pyelftools: apt install python3-click python3-pyelftools" >&2
    exit 1
fi
# -P: the archive's tracekit, never one in the current directory.
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" exec python3 -P -m tracekit "$@"
"""
README = """\
tracekit for an arm64 board (made by `tracekit board-pack`)

Needs: Debian's python3 (3.11 or newer: bookworm or later), python3-click,
python3-pyelftools, and for a collection rt-tests and stress-ng:

    sudo apt install python3 python3-click python3-pyelftools rt-tests stress-ng

Then, as root, from anywhere:

    ./run.sh collect --rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1 -o bundle --dry-run
    sudo ./run.sh collect --rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1 -o bundle
    sudo ./run.sh cleanup        # after a killed run

Copy the bundle back and analyse it where tracekit is pip-installed
(`tracekit report bundle --format email`).
"""


def default_cross() -> str:
    """The cross compiler prefix: none on arm64 (a native static build), else Debian's."""
    return "" if platform.machine() in ("aarch64", "arm64") else "aarch64-linux-gnu-"


def board_pack(out: Path, cross: str, echo: Callable[[str], None] = print) -> Path:
    """Build the reproducer static and write the board's archive to `out` (.tar.gz)."""
    source = CHECKOUT / "reproducer"
    if not (source / "Makefile").is_file():
        raise TracekitError(
            "board-pack builds the reproducer from its sources, which this installation does"
            " not have: run it from a tracekit checkout (git clone, then pip install -e .)"
        )
    if shutil.which(f"{cross}gcc") is None:
        raise TracekitError(
            f"{cross}gcc not found; install Debian's gcc-aarch64-linux-gnu and"
            " libc6-dev-arm64-cross (or run board-pack on an arm64 machine)"
        )
    with tempfile.TemporaryDirectory(prefix="tracekit-board-") as tmp:
        build = Path(tmp) / "build"
        echo(f"board-pack: building the reproducer ({cross or 'native'}gcc, static)")
        _make(source, build, cross)
        echo(f"board-pack: writing {out}")
        _write_archive(out, build)
    return out


def _make(source: Path, build: Path, cross: str) -> None:
    """make -C reproducer into `build`, static; its output only when it fails."""
    done = subprocess.run(
        ["make", "-s", "-C", str(source), f"CROSS_COMPILE={cross}", "STATIC=1", f"O={build}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise TracekitError(f"board-pack: the reproducer's build failed: {tail[0]}")


def _write_archive(out: Path, build: Path) -> None:
    """The archive: package modules, binaries and guests, run.sh and README, sorted."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for path in sorted(PACKAGE.rglob("*")):
            if path.is_file() and path.name.endswith(SHIPPED) and "__pycache__" not in path.parts:
                tar.add(path, f"{TOP}/tracekit/{path.relative_to(PACKAGE)}", filter=_plain)
        binaries = [build / name for name in BINARIES]
        for path in [*binaries, *sorted((build / "guests").glob("*.elf"))]:
            tar.add(path, f"{TOP}/reproducer/build/{path.relative_to(build)}", filter=_plain)
        _add_text(tar, "run.sh", RUN_SH, executable=True)
        _add_text(tar, "README.txt", README, executable=False)


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """An entry owned by root, without the building machine's names."""
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _add_text(tar: tarfile.TarFile, name: str, text: str, executable: bool) -> None:
    """A file written from text, with its mode."""
    data = text.encode()
    info = tarfile.TarInfo(f"{TOP}/{name}")
    info.size = len(data)
    info.mode = 0o755 if executable else 0o644
    info.mtime = int(time.time())
    tar.addfile(_plain(info), io.BytesIO(data))
