"""Planning a collection for a board from any machine: its CPUs and IPA limit given by
flags or a facts file, the guest not built here; and the board's own archive."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from tracekit.cli import main

REAL_MANIFEST = Path(__file__).parent / "fixtures" / "report" / "nvhe-a76" / "manifest.json"
# A board's roles: CPU 7 isolated, 4-6 stressed; more CPUs than any test machine has here.
BOARD = ["--rt-cpu", "7", "--stress-cpus", "4-6", "--guest-cpu", "5"]


def _collect(tmp_path: Path, *args: str) -> tuple[int, str]:
    """`tracekit collect` with the board's roles; exit code and output."""
    res = CliRunner().invoke(main, ["collect", *BOARD, "-o", str(tmp_path / "b"), *args])
    return res.exit_code, res.output


def test_a_dry_run_plans_for_the_board_its_flags_describe(tmp_path: Path) -> None:
    assert len(os.sched_getaffinity(0)) < 8  # so CPU 7 is not online on this machine
    code, out = _collect(tmp_path, "--dry-run")
    assert code != 0 and "7 is not online here" in out
    code, out = _collect(tmp_path, "--dry-run", "--board-cpus", "0-7")
    assert code == 0, out
    assert "after-probe-page-cpu7" in out and "not online" not in out
    code, out = _collect(tmp_path, "--dry-run", "--board-cpus", "0-6")
    assert code != 0 and "CPU 7 is not online here (online: 0-6)" in out  # the board's own
    assert not (tmp_path / "b").exists()  # a plan changes nothing


def test_a_facts_file_describes_the_board(tmp_path: Path) -> None:
    facts = tmp_path / "board.json"
    facts.write_text(json.dumps({"online_cpus": "0-7", "ipa_limit_bits": 40}))
    sweep = ["--dry-run", "--scenario", "teardown", "--board-facts", str(facts)]
    code, out = _collect(tmp_path, *sweep)
    assert code == 0, out
    assert "--ipa-bits 32,36,40" in out  # the default spread stops at the board's limit
    code, out = _collect(tmp_path, *sweep, "--ipa-bits", "44")
    assert code != 0 and "accepts at most 40 bits" in out
    # A manifest recorded on a 4-CPU host: CPU 7 is not there.
    code, out = _collect(tmp_path, "--dry-run", "--board-facts", str(REAL_MANIFEST))
    assert code != 0 and "CPU 4-7 is not online here (online: 0-3)" in out


def test_board_flags_without_a_dry_run_are_one_line(tmp_path: Path) -> None:
    code, out = _collect(tmp_path, "--board-cpus", "0-7")
    assert code != 0
    assert out.strip().endswith("plan for another machine: add --dry-run")
    (tmp_path / "bad.json").write_text("[1, 2]")
    code, out = _collect(tmp_path, "--dry-run", "--board-facts", str(tmp_path / "bad.json"))
    assert code != 0 and "a JSON object is needed, not list" in out


def test_a_dry_run_without_the_guest_built_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.elf"
    code, out = _collect(tmp_path, "--dry-run", "--board-cpus", "0-7", "--guest", str(missing))
    assert code == 0, out
    assert f"guest {missing}: not built here, so its knobs are not checked" in out
