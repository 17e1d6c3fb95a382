"""Board-side campaigns: one cell per boot, resumed from a state file across "reboots".

Each reboot is simulated by a fresh `python -m tracekit campaign --board` process, as a
boot hook would start it. The cells run the real `tracekit collect --dry-run` (it reads
this machine's CPUs and the reproducer's guest ELFs, and changes nothing), so nothing in
the executor is faked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit.bundle import MANIFEST
from tracekit.campaign import state
from tracekit.campaign.cells import expand_cells
from tracekit.campaign.plan import load_plan, parse_plan
from tracekit.campaign.run import note_emulated
from tracekit.vhost.runner import EMULATED_NOTE, project_tree

GUESTS = project_tree() / "reproducer" / "build" / "guests"

pytestmark = pytest.mark.skipif(
    not (GUESTS / "mmu-on.elf").is_file() or (os.cpu_count() or 1) < 2,
    reason="needs the built reproducer (make -C reproducer) and two CPUs",
)

PLAN = """
seed = 5
[matrix]
guest = ["mmu-on", "mmu-off"]
[placements.default]
rt_cpu = 1
stress_cpus = "0"
guest_cpu = "0"
[collect]
runs = 1
traced_runs = 0
duration = 1
dry_run = true
"""


def _boot(plan: Path, out: Path, state_file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """One 'boot' of the board: the campaign's boot hook runs once and exits."""
    argv = [sys.executable, "-m", "tracekit", "campaign", str(plan), "--board"]
    argv += ["--state", str(state_file), "-o", str(out), *extra]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)


def _record(path: Path) -> dict:
    """The campaign record as JSON."""
    return json.loads(path.read_text())


def test_board_runs_one_cell_per_boot_and_resumes(tmp_path: Path) -> None:
    """Boot 1 runs the first cell, boot 2 the second, boot 3 finds nothing left."""
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out, state_file = tmp_path / "campaign", tmp_path / "var" / "state.json"

    first = _boot(plan, out, state_file)
    assert first.returncode == 0, first.stderr
    record = _record(state_file)
    assert [c["status"] for c in record["cells"]] == ["done", "pending"]
    assert record["seed"] == 5 and not record["complete"] and record["mode"] == "board"
    assert _record(out / "campaign.json") == record
    cell1 = record["cells"][0]
    log1 = (out / "logs" / f"{cell1['cell_id']}.txt").read_text()
    assert f"(variant {cell1['axes']['guest']})" in log1  # the cell ran its own guest

    second = _boot(plan, out, state_file)
    assert second.returncode == 0, second.stderr
    record = _record(state_file)
    assert [c["status"] for c in record["cells"]] == ["done", "done"]
    assert record["complete"]
    assert "campaign: complete" in second.stdout
    guests = {c["axes"]["guest"] for c in record["cells"]}
    assert guests == {"mmu-on", "mmu-off"}
    assert all(c["kernel_release"] == os.uname().release for c in record["cells"])

    third = _boot(plan, out, state_file)
    assert third.returncode == 0
    assert "0 pending of 2" in third.stdout
    assert _record(state_file)["cells"] == record["cells"]  # nothing ran again


def test_board_recovers_a_cell_the_host_died_in(tmp_path: Path) -> None:
    """A cell left `running` (the host went down in it) is moved aside and run again."""
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out, state_file = tmp_path / "campaign", tmp_path / "state.json"
    assert _boot(plan, out, state_file).returncode == 0
    # What a power cut during cell 2 leaves: the record says running, a partial bundle.
    record = _record(state_file)
    record["cells"][1]["status"] = "running"
    record["cells"][1]["attempts"] = [{"started": "2026-01-01T00:00:00Z"}]
    state_file.write_text(json.dumps(record))
    partial = out / record["cells"][1]["cell_id"]
    partial.mkdir()
    (partial / "manifest.json").write_text("{}")

    again = _boot(plan, out, state_file)
    assert again.returncode == 0, again.stderr
    assert "was running when the host went down; it runs again" in again.stdout
    cell = _record(state_file)["cells"][1]
    assert cell["status"] == "done"
    assert [a["outcome"] for a in cell["attempts"]] == ["interrupted", "done"]
    moved = out / cell["attempts"][0]["moved_to"]
    assert (moved / "manifest.json").is_file() and not partial.exists()


def test_board_reboots_only_while_cells_remain(tmp_path: Path) -> None:
    """--reboot runs the reboot command after a cell, except after the last one."""
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out, state_file = tmp_path / "campaign", tmp_path / "state.json"
    marker = tmp_path / "reboots"
    reboot = ["--reboot", "--reboot-command", f"sh -c 'echo reboot >> {marker}'"]
    assert _boot(plan, out, state_file, *reboot).returncode == 0
    assert marker.read_text() == "reboot\n"
    assert _boot(plan, out, state_file, *reboot).returncode == 0
    assert marker.read_text() == "reboot\n"  # the campaign is complete: no reboot


def test_board_refuses_another_plan_on_the_same_state(tmp_path: Path) -> None:
    """Resuming with a changed plan is one clear error, not a mixed campaign."""
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out, state_file = tmp_path / "campaign", tmp_path / "state.json"
    assert _boot(plan, out, state_file).returncode == 0
    plan.write_text(PLAN.replace("seed = 5", "seed = 6"))
    refused = _boot(plan, out, state_file)
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith("tracekit: error:")
    assert "another plan" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_stopped_cells_run_again_but_dying_ones_give_up() -> None:
    """Ctrl-C never uses up a cell's tries; the host dying in it twice does."""
    plan = parse_plan({"seed": 1})
    campaign = state.Campaign.new("board", plan, 1, expand_cells(plan, 1))
    (cell,) = campaign.cells
    for _ in range(3):
        state.end_attempt(cell, state.begin_attempt(cell), "stopped", None, "Ctrl-C")
    assert cell.status == state.PENDING
    state.end_attempt(cell, state.begin_attempt(cell), "interrupted", None, "host died")
    assert cell.status == state.PENDING
    state.end_attempt(cell, state.begin_attempt(cell), "interrupted", None, "host died")
    assert cell.status == state.FAILED and "interrupted 2 times" in cell.notes[0]
    assert campaign.next_pending() is None


def test_a_board_step_on_an_emulated_host_says_so(tmp_path: Path) -> None:
    """`--board` run inside the emulated host (a cell whose bundle's preflight found QEMU)
    marks the campaign emulated and the cell with the emulated note; a board's does not."""
    plan = parse_plan({"seed": 1})
    campaign = state.Campaign.new("board", plan, 1, expand_cells(plan, 1))
    (cell,) = campaign.cells
    real = tmp_path / "real"
    real.mkdir()
    (real / MANIFEST).write_text(json.dumps({"host": {"emulated": False}}))
    note_emulated(campaign, cell, real)
    assert not campaign.emulated and cell.notes == []
    emulated = tmp_path / "emulated"
    emulated.mkdir()
    (emulated / MANIFEST).write_text(json.dumps({"host": {"emulated": True}}))
    note_emulated(campaign, cell, emulated)
    note_emulated(campaign, cell, emulated)
    assert campaign.emulated and cell.notes == [EMULATED_NOTE]


def test_emulated_campaign_resume_recovers_without_booting(tmp_path: Path) -> None:
    """A vhost campaign whose last cell died twice gives it up and boots nothing more."""
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(PLAN.replace("dry_run = true", "").replace("rt_cpu = 1", "rt_cpu = 3"))
    plan = load_plan(plan_file)
    campaign = state.Campaign.new("vhost", plan, 5, expand_cells(plan, 5))
    first, second = campaign.cells
    state.end_attempt(first, state.begin_attempt(first), "done", 0)
    state.end_attempt(second, state.begin_attempt(second), "interrupted", None, "host died")
    state.begin_attempt(second)  # and died again: tracekit itself was killed
    out = tmp_path / "campaign"
    state.save(campaign, [out / "campaign.json"])
    argv = [sys.executable, "-m", "tracekit", "campaign", str(plan_file), "-o", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 1, done.stderr  # a failed cell
    assert "given up" in done.stdout and "campaign: complete" in done.stdout
    record = _record(out / "campaign.json")
    assert [c["status"] for c in record["cells"]] == ["done", "failed"]
    assert not (out / "vhost-logs").exists()  # nothing booted
