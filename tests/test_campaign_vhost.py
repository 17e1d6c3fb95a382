"""End to end: a two-cell campaign in the emulated host (two boots, kept short).

Cells differ by guest (MMU on, MMU off); each boots bookworm on two cortex-a76s, runs
`tracekit collect` with one quiet run per phase of 1 s and no traced run, and leaves a
bundle. The campaign's own boots are outside conftest's one-boot-per-configuration
batching: a campaign is precisely one fresh boot per cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.vhost.runner import project_tree

pytestmark = pytest.mark.vhost

PLAN = """
seed = 3
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
[vhost]
smp = 2
timeout = 900
"""


def test_two_cell_campaign_in_the_emulated_host(vhost_available, tmp_path: Path) -> None:
    """Both cells boot fresh and leave a complete bundle; campaign.json names the kernels."""
    if not (project_tree() / "reproducer" / "build" / "guests" / "mmu-off.elf").is_file():
        pytest.skip("build the reproducer first: make -C reproducer")
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out = tmp_path / "campaign"
    result = CliRunner().invoke(main, ["campaign", str(plan), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "campaign: complete" in result.output
    record = json.loads((out / "campaign.json").read_text())
    assert record["complete"] and record["emulated"] and record["seed"] == 3
    assert {cell["axes"]["guest"] for cell in record["cells"]} == {"mmu-on", "mmu-off"}
    for cell in record["cells"]:
        assert cell["status"] == "done", cell
        assert cell["kvm_mode"] == "nvhe"
        assert cell["kernel_release"].startswith("6.1.")
        assert any("not hardware timings" in note for note in cell["notes"])
        manifest = json.loads((out / cell["bundle"] / "manifest.json").read_text())
        assert manifest["complete"], manifest.get("incomplete_reason")
        assert manifest["host"]["kernel_release"] == cell["kernel_release"]
        assert manifest["options"]["guest"].endswith(f"/{cell['axes']['guest']}.elf")
        # One fresh boot per cell, each with its own logs.
        run = json.loads((out / "vhost-logs" / cell["cell_id"] / "vhost-run.json").read_text())
        assert run["kernel"] == "bookworm" and run["exit_status"] == 0
    bundles = sorted(path.parent.name for path in out.glob("*/manifest.json"))
    assert bundles == sorted(cell["cell_id"] for cell in record["cells"])
