"""Campaign plans: parsing, validation, expansion, seeded order and the cells' commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.campaign.cells import expand_cells
from tracekit.campaign.command import (
    check_board_plan,
    check_vhost_cells,
    collect_argv,
    vhost_settings,
)
from tracekit.campaign.plan import load_plan, parse_plan
from tracekit.errors import TracekitError

PLAN = """
seed = 11
repeats = 2
[matrix]
kernel = ["bookworm", "trixie"]
guest = ["mmu-on", "mmu-off"]
placement = ["default", "cross"]
[placements.cross]
rt_cpu = 3
stress_cpus = "0-1"
guest_cpu = "2"
[collect]
runs = 3
traced_runs = 0
events = ["kvm/kvm_exit", "sched/sched_switch"]
perf_counters = true
dry_run = false
[vhost]
smp = 4
clusters = 2
"""


def _write(tmp_path: Path, text: str, name: str = "plan.toml") -> Path:
    """A plan file in the test's directory."""
    path = tmp_path / name
    path.write_text(text)
    return path


def test_plan_expands_to_every_condition_and_repeat(tmp_path: Path) -> None:
    """2 kernels x 2 guests x 2 placements x 2 repeats = 16 distinct cells, positions 1..16."""
    plan = load_plan(_write(tmp_path, PLAN))
    cells = expand_cells(plan, plan.seed or 0)
    assert len(cells) == 16
    assert [cell.position for cell in cells] == list(range(1, 17))
    assert len({cell.cell_id for cell in cells}) == 16
    keys = {(c.kernel, c.axes["guest"], c.axes["placement"], c.repeat) for c in cells}
    assert len(keys) == 16
    # Only the axes that vary name a cell; the others are in its axes.
    first = cells[0]
    assert first.cell_id.startswith("001-") and first.cell_id.endswith(f"-r{first.repeat}")
    assert "nvhe" not in first.cell_id and first.axes["kvm_mode"] == "nvhe"


def test_order_is_random_but_reproducible_from_the_seed(tmp_path: Path) -> None:
    """The same seed gives the same order; another seed another; shuffle=false keeps it."""
    plan = load_plan(_write(tmp_path, PLAN))

    def order(seed: int) -> list[tuple]:
        """The conditions in run order for a seed."""
        return [
            (c.kernel, c.axes["guest"], c.axes["placement"], c.repeat)
            for c in expand_cells(plan, seed)
        ]

    assert order(11) == order(11)
    assert order(11) != order(12)
    fixed = load_plan(_write(tmp_path, PLAN.replace("seed = 11", "shuffle = false")))
    natural = [
        (c.kernel, c.axes["guest"], c.axes["placement"], c.repeat) for c in expand_cells(fixed, 5)
    ]
    assert natural == sorted(natural, key=lambda k: (k[3],))  # repeats in blocks, in matrix order
    assert natural[0] == ("bookworm", "mmu-on", "default", 1)


def test_json_plan_and_defaults(tmp_path: Path) -> None:
    """A JSON plan works; absent axes take the brief's main case; one value is one cell."""
    path = _write(tmp_path, json.dumps({"matrix": {"guest": "mmu-on"}}), "plan.json")
    plan = load_plan(path)
    (cell,) = expand_cells(plan, 1)
    assert cell.axes == {
        "kernel": "bookworm",
        "kvm_mode": "nvhe",
        "cpu_model": "cortex-a76",
        "guest": "mmu-on",
        "after_guest": "none",
        "placement": "default",
        "scenario": "main",
        "simulate": None,
    }
    assert cell.cell_id == "001"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[matrix]\nkernal = ['trixie']", "unknown key 'kernal' in \\[matrix\\]"),
        ("[matrix]\nkernel = ['jessie']", "unknown kernel suite 'jessie'"),
        ("[matrix]\nkernel = ['bookworm:rt']", "has no KVM"),
        ("[matrix]\nkvm_mode = ['hvhe']", "kvm_mode 'hvhe' is unknown"),
        ("[matrix]\nplacement = ['far']", "placement 'far' is unknown"),
        ("[matrix]\nguest = []", "guest is empty"),
        ("[matrix]\nguest = ['mmu-on', 'mmu-on']", "repeats a value"),
        ("repeats = 0", "repeats must be at least 1"),
        ("repeats = 'two'", "repeats must be a int"),
        ("[collect]\nruns = '3'", "\\[collect\\] runs must be a int"),
        ("[collect]\noutput = 'x'", "unknown key 'output' in \\[collect\\]"),
        ("[placements.p]\nrt_cpu = 1", "lacks stress_cpus"),
        ("[placements.p]\nrt_cpu = 1\nstress_cpus = 'x'\nguest_cpu = '0'", "placements.p"),
        ("seed = 1\nseed = 2", "not valid TOML"),
    ],
)
def test_bad_plans_fail_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    """Each mistake is a TracekitError naming the file and the key, on one line."""
    path = _write(tmp_path, text)
    with pytest.raises(TracekitError, match=message) as caught:
        load_plan(path)
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_plan_file(tmp_path: Path) -> None:
    """A plan that does not exist says so."""
    with pytest.raises(TracekitError, match="cannot read plan"):
        load_plan(tmp_path / "nope.toml")


def test_cell_command_line_and_boot(tmp_path: Path) -> None:
    """A cell becomes the collect argv (placement, guest, options) and its boot settings."""
    plan = load_plan(_write(tmp_path, PLAN))
    cell = next(c for c in expand_cells(plan, 3) if c.axes["placement"] == "cross")
    argv = collect_argv(cell, plan, "/share/x", "/g", "python3")
    assert argv[:4] == ["python3", "-m", "tracekit", "collect"]
    pairs = dict(zip(argv[4::2], argv[5::2], strict=False))
    assert pairs["--rt-cpu"] == "3" and pairs["--stress-cpus"] == "0-1"
    assert pairs["--guest-cpu"] == "2"
    assert f"/g/{cell.axes['guest']}.elf" in argv
    assert argv[argv.index("--runs") + 1] == "3"
    assert argv.count("--events") == 2 and "--perf-counters" in argv
    assert "--dry-run" not in argv  # false flags are left out
    assert argv[-2:] == ["-o", "/share/x"]
    settings = vhost_settings(cell, plan)
    assert settings["kernel"] == cell.kernel and settings["smp"] == 4
    assert settings["clusters"] == 2
    assert settings["append"] == "isolcpus=3 nohz_full=3 rcu_nocbs=3"
    assert settings["ground_truth"] is False


def test_ground_truth_asked_for_every_cell() -> None:
    """[vhost] ground_truth = true boots every cell with the plugin; a non-bool is refused."""
    plan = parse_plan({"vhost": {"ground_truth": True}})
    assert all(vhost_settings(c, plan)["ground_truth"] for c in expand_cells(plan, 1))
    with pytest.raises(TracekitError, match="ground_truth"):
        parse_plan({"vhost": {"ground_truth": "yes"}})


def test_emulated_host_refuses_impossible_cells() -> None:
    """VHE needs max; 16 KB pages need a granule the model has; CPUs must exist."""
    vhe = parse_plan({"matrix": {"kvm_mode": ["vhe"], "cpu_model": ["cortex-a76", "max"]}})
    with pytest.raises(TracekitError, match="'vhe' needs cpu_model 'max'"):
        check_vhost_cells(vhe, expand_cells(vhe, 1))
    page = parse_plan({"matrix": {"kernel": ["sid:16k"], "cpu_model": ["cortex-a53"]}})
    with pytest.raises(TracekitError, match="uses 16 KB pages, which the cortex-a53 model"):
        check_vhost_cells(page, expand_cells(page, 1))
    small = parse_plan({"vhost": {"smp": 2}})
    with pytest.raises(TracekitError, match="uses CPU 3 but the emulated host has 2 CPUs"):
        check_vhost_cells(small, expand_cells(small, 1))
    fine = parse_plan({"matrix": {"kernel": ["sid:16k"], "cpu_model": ["max"]}})
    check_vhost_cells(fine, expand_cells(fine, 1))


def test_board_plans_keep_one_kernel() -> None:
    """A board cannot switch kernels between cells of one campaign."""
    with pytest.raises(TracekitError, match="kernel has several values"):
        check_board_plan(parse_plan({"matrix": {"kernel": ["bookworm", "trixie"]}}))
    check_board_plan(parse_plan({"matrix": {"guest": ["mmu-on", "mmu-off"]}}))
