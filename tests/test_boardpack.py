"""`tracekit board-pack`: one archive, run on a python3 with only click and pyelftools.

Built for real (the cross compiler, make), unpacked, and run with Debian's own python3
(/usr/bin/python3 plus python3-click and python3-pyelftools, no polars: what a board has;
scripts/setup.sh installs them)."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from elftools.elf.elffile import ELFFile

from tracekit.cli import main

DEBIAN_PYTHON = Path("/usr/bin/python3")
EM_AARCH64 = "EM_AARCH64"


def _board_python() -> bool:
    """Debian's python3 with click and pyelftools and without polars, as on a board."""
    if not DEBIAN_PYTHON.is_file():
        return False
    check = "import click, elftools, importlib.util as u; assert u.find_spec('polars') is None"
    return subprocess.run([DEBIAN_PYTHON, "-c", check], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.skipif(
        shutil.which("aarch64-linux-gnu-gcc") is None,
        reason="no aarch64-linux-gnu-gcc (scripts/setup.sh installs it)",
    ),
    pytest.mark.skipif(
        not _board_python(),
        reason="no Debian python3 with python3-click and python3-pyelftools and without"
        " polars (scripts/setup.sh installs them)",
    ),
]


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive, built once and unpacked: its tracekit-board/ directory."""
    root = tmp_path_factory.mktemp("board")
    archive = root / "tracekit-board.tar.gz"
    result = CliRunner().invoke(main, ["board-pack", "-o", str(archive)])
    assert result.exit_code == 0, result.output
    with tarfile.open(archive) as tar:
        assert all(m.name.startswith("tracekit-board/") for m in tar.getmembers())
        tar.extractall(root / "unpacked", filter="data")
    return root / "unpacked" / "tracekit-board"


def _run(board: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """run.sh with only /usr/bin and /bin on PATH: python3 is Debian's."""
    return subprocess.run(
        [str(board / "run.sh"), *args],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_archive_holds_static_arm64_binaries_and_every_guest(board: Path) -> None:
    for name in ("vmm", "tlbiprobe", "gtmark"):
        with (board / "reproducer" / "build" / name).open("rb") as f:
            elf = ELFFile(f)
            assert elf["e_machine"] == EM_AARCH64
            assert not [s for s in elf.iter_segments() if s["p_type"] == "PT_INTERP"]  # static
    guests = {p.stem for p in (board / "reproducer" / "build" / "guests").glob("*.elf")}
    assert {"mmu-on", "mmu-off", "tlbi-loop", "cache-toggle"} <= guests
    assert (board / "run.sh").stat().st_mode & 0o111
    assert (board / "tracekit" / "host" / "collect.py").is_file()
    assert not list(board.rglob("__pycache__")) and not list(board.rglob("*.o"))


def test_the_board_plans_with_its_own_guests_on_debian_python(board: Path, tmp_path: Path) -> None:
    roles = ["--rt-cpu", "3", "--stress-cpus", "0-2", "--guest-cpu", "1"]
    out = tmp_path / "bundle"
    done = _run(board, "collect", *roles, "-o", str(out), "--dry-run", "--board-cpus", "0-3")
    assert done.returncode == 0, done.stderr
    guest = board / "reproducer" / "build" / "guests" / "mmu-on.elf"
    assert f"guest {guest} (variant mmu-on)" in done.stdout  # read and checked, not skipped
    assert not out.exists()


def test_analysis_on_the_board_says_in_one_line_what_to_install(board: Path) -> None:
    done = _run(board, "report", "bundle")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: `tracekit report`")
    assert "needs polars" in lines[0] and "pip install tracekit" in lines[0]
