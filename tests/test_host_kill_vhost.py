"""Two cells of the emulated host's kill matrix (scripts/vhost_kill_matrix.py) in CI.

They join the protected-mode boot (2 x cortex-a76, pKVM), which had the fewest checks:
SIGKILL during a traced run (instance, kprobes, tracing on, tools running) undone by
`tracekit cleanup`, and SIGTERM during the after-guest CPU hotplug. The whole matrix,
with a power cut, is the script's (docs/robustness-figures.md).

Passed in that boot on 2026-12-02 (08:06-08:11 UTC, `-m "vhost or unproven"` on this
file alone, the shared 2-core machine): the cells took 81.5 s (kill-traced-cleanup) and
199.2 s (term-hotplug), so they add ~4.7 min to the protected-a76 boot (the whole
session, boot included, took 312 s); 87.1 s and 326.8 s in the last CI run of session 10.
Session 11 (17:24 UTC, load ~3): 58.1 s and 79.1 s, the whole boot 155 s; term-hotplug's
collect runs no traced run before its point, and its bundle's check (bundle_state) no
longer resolves every path (~110 s of it before).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import VhostBoot, register_vhost_check
from scripts_loader import load_script

BOOT = "protected-a76"
CELLS = ("kill-traced-cleanup", "term-hotplug")
# Two CPUs: cyclictest on 0, stress-ng and the guest on 1 (the CPU hot-unplugged).
ROLES = "--rt-cpu 0 --stress-cpus 1 --guest-cpu 1"

register_vhost_check(
    BOOT,
    "kill_matrix_cells",
    f"python3 /tracekit/scripts/vhost_kill_matrix.py inside {' '.join(CELLS)} --roles '{ROLES}'",
)


def _cells(boot: VhostBoot) -> dict[str, dict[str, object]]:
    """The cells' results, by name, as the script wrote them inside the host."""
    check = boot.checks["kill_matrix_cells"]
    assert check.status == 0, check.stdout + check.stderr
    path = boot.result.out_dir / "checks" / "kill_matrix_cells" / "cells.json"
    return {r["cell"]: r for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.vhost
def test_sigkill_in_a_traced_run_is_undone_by_cleanup(
    vhost_boot: Callable[[str], VhostBoot],
) -> None:
    cell = _cells(vhost_boot(BOOT))["kill-traced-cleanup"]
    assert cell["point"] == "reached" and cell["exit"] == -9
    # What SIGKILL left is real: the instance and kprobes stayed until cleanup ran.
    assert {"instances", "kprobe_events"} <= set(cell["left_after_run"])
    assert any(line.startswith("undone: ") for line in cell["recovery_said"])
    # The quiet and the traced run each made the cyclictest histogram; undone once read,
    # only the traced run's record can be pending (it was once per run: named twice).
    removals = [line for line in cell["recovery_said"] if "cyclictest-hist" in line]
    assert len(removals) <= 1, removals
    assert cell["left_after_recovery"] == {}
    assert str(cell["bundle"]).startswith("INCOMPLETE")


@pytest.mark.vhost
def test_sigterm_in_the_hotplug_leaves_nothing(vhost_boot: Callable[[str], VhostBoot]) -> None:
    cell = _cells(vhost_boot(BOOT))["term-hotplug"]
    assert cell["point"] in ("cpu offline", "hotplug started") and cell["exit"] == 143
    assert cell["left_after_run"] == {}
    assert cell["bundle"] == "INCOMPLETE (interrupted (stopped by SIGTERM))"


def test_the_matrix_sorts_what_differs_by_kind() -> None:
    matrix = load_script("vhost_kill_matrix")
    before = {
        "tracefs": {"top": {"tracing_on": "1"}, "instances": []},
        "cpus_online": "0-3",
        "tmp_files": [],
    }
    now = {
        "tracefs": {"top": {"tracing_on": "0"}, "instances": ["tracekit-7"]},
        "cpus_online": "0,2-3",
        "tmp_files": ["tracekit-7-cyclictest-hist.txt"],
    }
    assert matrix.differences(before, now) == {
        "settings": ["tracefs/top/tracing_on: '0'"],
        "instances": ["tracefs/instances: ['tracekit-7']"],
        "cpus_online": ["cpus_online: '0,2-3'"],
        "tmp_files": ["tmp_files: ['tracekit-7-cyclictest-hist.txt']"],
    }
    assert matrix.differences(before, before) == {}
    assert matrix.kinds(matrix.differences(before, now)) == (
        "cpus_online 1, instances 1, settings 1, tmp_files 1"
    )


def test_the_matrix_runs_every_cell_once_sigkill_first_and_keeps_time_for_the_cut() -> None:
    matrix = load_script("vhost_kill_matrix")
    cells = matrix.all_cells()
    expected = {f"{s}-{p}" for s in ("int", "term", "kill") for p in matrix.POINTS}
    assert sorted(cells) == sorted(expected | {"kill-traced-cleanup"})
    assert all(c.startswith("kill-") for c in cells[: len(matrix.POINTS)])
    assert cells.index("int-hotplug") > cells.index("term-probe")  # SIGINT: SIGTERM's path
    assert matrix.cell_budget(None) is None
    assert matrix.cell_budget(25) == 25 * 60 - matrix.RESERVE_S
    assert matrix.cell_budget(1) == 0.0  # no cell starts; the power cut still runs
    assert matrix.cell_budget(24, cut=False) == 24 * 60 - matrix.RESERVE_NO_CUT_S
    assert matrix.cell_budget(24, cut=False) > matrix.cell_budget(24)  # no boot 2
    assert matrix.estimate("kill-hotplug") > matrix.estimate("term-hotplug")  # the recovery


def test_runs_tabulated_together_count_a_cell_not_run_only_if_no_run_ran_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = load_script("vhost_kill_matrix")
    ran = {"at_signal": ["instances 1"], "exit": 143, "left_after_run": {}, "recovery": "none"}
    ran |= {"left_after_recovery": {}, "seconds": 30.0}
    runs = {
        "first": [{"cell": "term-quiet", **ran}, {"cell": "int-quiet", "not_run": "time budget"}],
        "second": [{"cell": "int-quiet", **ran}, {"cell": "int-probe", "not_run": "time budget"}],
    }
    for name, rows in runs.items():
        (tmp_path / name / "boot1").mkdir(parents=True)
        lines = "".join(json.dumps(row) + "\n" for row in rows)
        (tmp_path / name / "boot1" / "cells.json").write_text(lines)
    matrix.tabulate(tmp_path / "second", (tmp_path / "first",))
    said = capsys.readouterr().out
    assert "not run (time budget): int-probe\n" in said
    saved = json.loads((tmp_path / "second" / "matrix.json").read_text())
    assert [(r["cell"], r["began"]) for r in saved] == [("term-quiet", "-"), ("int-quiet", "-")]


def test_the_probe_point_is_reached_by_its_argv_record_and_said_so(tmp_path: Path) -> None:
    matrix = load_script("vhost_kill_matrix")
    stand_in = subprocess.Popen(["sleep", "30"], text=True)  # the collect, still running
    try:
        collect = matrix.Collect(stand_in, ["[3/12 +139s] before-probe-page-cpu3"], tmp_path)
        slot = tmp_path / "runs" / "before-probe-page-cpu3"
        slot.mkdir(parents=True)
        (slot / "probe.json.argv").write_text('["tlbiprobe"]\n')  # written just before it runs
        assert matrix.reach("probe", collect) == "reached"  # not "missed (preflight over)"
    finally:
        stand_in.kill()
        stand_in.wait()
    collect = matrix.Collect(stand_in, ["[3/12 +139s] before-probe-page-cpu3"], tmp_path / "x")
    assert matrix.reach("probe", collect) == "not reached"  # the collect ended without one
