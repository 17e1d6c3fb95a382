"""End to end: a two-cell campaign in the emulated host (two boots, kept short).

Cells differ by guest (MMU on, MMU off); each boots bookworm on two cortex-a76s, runs
`tracekit collect` with one quiet run per phase of 1 s and no traced run, and leaves a
bundle. The campaign's own boots are outside conftest's one-boot-per-configuration
batching: a campaign is precisely one fresh boot per cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import register_vhost_check

from tracekit.analysis.factorial import boot_responses, campaign_frame, factor_levels
from tracekit.bundle import read_manifest
from tracekit.campaign.plan import Plan, load_plan
from tracekit.cli import main
from tracekit.guests import guest_invalidations
from tracekit.ingest.bundle import BundleData
from tracekit.ingest.groundtruth import load_ground_truth
from tracekit.ingest.vmm import parse_vmm_output
from tracekit.report.assemble import build_report
from tracekit.report.load import load_bundles
from tracekit.report.render import render
from tracekit.report.sections import factorial
from tracekit.vhost.runner import EMULATED_NOTE, project_tree

pytestmark = pytest.mark.vhost

# Two CPUs, one quiet run of 1 s per phase, no traced run: the shortest cell collect runs.
SHORT_CELLS = """[placements.default]
rt_cpu = 1
stress_cpus = "0"
guest_cpu = "0"
[collect]
runs = 1
traced_runs = 0
duration = 1
"""
PLAN = f"""
seed = 3
[matrix]
guest = ["mmu-on", "mmu-off"]
{SHORT_CELLS}[vhost]
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


# --- A small real design, run by `tracekit campaign --board` inside the nvhe-a53 boot ---
#
# Folded into an existing boot (no boot of its own): the cells run one after another in
# the boot that already loads the ground-truth plugin, so the plugin's log shows what
# each cell's guest executed. Cells share a boot, so none is fresh: one throwaway MMU-off
# VM runs first, so every cell finds a host where a VM ran (allow_dirty), whether or not
# other checks ran before; the cells after the first MMU-on one find a host it changed.
# So the cells are not replicates: the report must count them as one boot, give no
# interval, and say why. What is asserted is the machinery on real bundles, not a
# verdict (docs/campaign.md).
DESIGN_CONFIG = "nvhe-a53"
DESIGN_CHECK = "campaign_design"
DESIGN_PLAN = f"""
seed = 19
repeats = 2
[matrix]
guest = ["mmu-on-vmalle1"]
{SHORT_CELLS}allow_dirty = true
[design]
kind = "full"
[design.factors]
pre_tlbi = [0, 1]
[design.fixed]
tlbi = "vmalle1is"
tlbi_count = 2
"""
DESIGN_CELLS = 4
register_vhost_check(
    DESIGN_CONFIG,
    DESIGN_CHECK,
    f"cat > plan.toml <<'EOF'\n{DESIGN_PLAN}EOF\n"
    "B=/tracekit/reproducer/build; "
    "$B/vmm --cpus 0 $B/guests/mmu-off.elf > throwaway.txt || exit 1; "
    f"i=0; while [ $i -le {DESIGN_CELLS} ]; do "
    "date +%s >> times.txt; "
    "python3 -m tracekit campaign plan.toml --board -o camp > step-$i.txt 2>&1 || exit 1; "
    "grep -q 'campaign: complete' step-$i.txt && break; i=$((i+1)); done; "
    "date +%s >> times.txt; "
    "grep -q '\"complete\": true' camp/campaign.json",
    late=True,
)


def _design_dir(vhost_boot) -> Path:  # type: ignore[no-untyped-def]
    """The boot's --out directory, once its design check passed."""
    if not (project_tree() / "reproducer" / "build" / "guests" / "mmu-on-vmalle1.elf").is_file():
        pytest.skip("build the reproducer first: make -C reproducer")
    boot = vhost_boot(DESIGN_CONFIG)
    check = boot.checks[DESIGN_CHECK]
    here = boot.result.out_dir / "checks" / DESIGN_CHECK
    steps = "".join(p.read_text() for p in sorted(here.glob("step-*.txt")))
    assert check.status == 0, check.stdout + check.stderr + steps
    return boot.result.out_dir


@pytest.mark.vhost
def test_a_fractional_design_runs_end_to_end_in_one_boot(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    """Every cell of the design ran, its bundle holds its levels and its boot, and the
    report's effects section has each term, the design's aliases (none: full), and no
    interval: the four cells are one boot."""
    check_design_campaign(_design_dir(vhost_boot))


@pytest.mark.vhost
def test_the_guests_invalidations_follow_the_knobs(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    """The plugin's log of the same boot: each cell's guest executed the TLBIs and DSBs
    its knobs say (guests.guest_invalidations), on the guest CPU, and nothing else."""
    check_guest_invalidations(_design_dir(vhost_boot))


def _term(word: str, letters: dict[str, str]) -> str:
    """A design word (e.g. "BC") as the report names the term ("tlbi x tlbi_count")."""
    return " x ".join(sorted(letters[c] for c in word))


def _expected_aliases(plan: Plan) -> dict[str, set[str]]:
    """Each main effect and two-factor interaction with its aliases, from the design."""
    assert plan.design is not None
    letters = {f.letter: f.name for f in plan.design.factors}
    return {
        _term(effect, letters): {_term(w, letters) for w in aliased if len(w) <= 2}
        for effect, aliased in plan.design.aliases().items()
    }


def check_design_campaign(out: Path) -> None:
    """The campaign's record, bundles and factorial section (out: the boot's --out)."""
    here = out / "checks" / DESIGN_CHECK
    camp = here / "camp"
    plan = load_plan(here / "plan.toml")
    assert plan.design is not None
    names = [f.name for f in plan.design.factors]
    record = json.loads((camp / "campaign.json").read_text())
    assert record["complete"] and record["seed"] == 19 and record["mode"] == "board"
    cells = record["cells"]
    assert len(cells) == DESIGN_CELLS and {c["status"] for c in cells} == {"done"}
    # --board inside the emulated host: the record says emulated, from each bundle.
    assert record["emulated"] and all(EMULATED_NOTE in c["notes"] for c in cells)
    # Every condition of the fraction, each on `repeats` cells, and nothing else.
    run = sorted(tuple(c["axes"][n] for n in names) for c in cells)
    planned = sorted(tuple(c[n] for n in names) for c in plan.design.conditions())
    assert run == sorted(planned * plan.repeats)
    bundles = load_bundles([camp])
    assert sorted(b.path.name for b in bundles) == sorted(c["cell_id"] for c in cells)
    axes = {c["cell_id"]: c["axes"] for c in cells}
    # One boot: a VM ran before every cell; whatever preflight could read, it is the same,
    # and every bundle records that one boot.
    assert len({b.manifest.host["freshness"]["state"] for b in bundles}) == 1
    boots = {b.manifest.host.get("boot_id") for b in bundles}
    assert len(boots) == 1 and None not in boots, boots
    for data in bundles:
        manifest = data.manifest
        assert manifest.complete and manifest.host["emulated"] is True
        # The bundle's own record of its levels is what the report groups by.
        levels = factor_levels(manifest.options)
        assert {n: levels[n] for n in names} == {n: axes[data.path.name][n] for n in names}
    check_factorial_section(bundles, plan, names)


def check_factorial_section(bundles: list[BundleData], plan: Plan, names: list[str]) -> None:
    """Every term and the design's aliases; one boot, so no interval; never pooled."""
    section = factorial.section(bundles)
    assert section is not None and section.title.startswith("Campaign: effects")
    assert section.tables, section.findings + section.unknowns
    expected = _expected_aliases(plan)
    for table in section.tables:
        rows = {r["term"]: r for r in table.frame.to_dicts()}
        assert set(rows) == set(expected), table.title
        for term, aliased in expected.items():
            got = set() if rows[term]["aliases"] == "-" else set(rows[term]["aliases"].split(","))
            assert got == aliased, term
            # Cells of one boot are one unit per condition: no spread between boots.
            assert rows[term]["95% CI"] == "-" and rows[term]["verdict"] == "unclear", term
        assert table.note.startswith(f"{DESIGN_CELLS} bundles from 1 boot, 0 degrees of freedom"), (
            table.note
        )
    assert any("ran cells of more than one condition" in line for line in section.findings)
    assert any("no condition was run on two boots" in line for line in section.unknowns)
    # No pooling: each condition's boots are exactly the cells run at its levels.
    frame = campaign_frame(
        [
            (b.path.name, factor_levels(b.manifest.options), boot_responses(b.latencies, b.probes))
            for b in bundles
        ],
        [b.manifest.host["boot_id"] for b in bundles],
    )
    groups = frame.group_by(names).agg(pl.col("bundle").sort())
    assert plan.design is not None and groups.height == len(plan.design.conditions())
    cells = {b.path.name: factor_levels(b.manifest.options) for b in bundles}
    for row in groups.iter_rows(named=True):
        same = sorted(c for c, lv in cells.items() if all(lv[n] == row[n] for n in names))
        assert row["bundle"] == same and len(same) == plan.repeats
    report = build_report(bundles)
    assert report.emulated
    email = render(report, "email")
    assert "Campaign: effects" in email
    assert max(len(line) for line in email.splitlines()) <= 72
    assert "<svg" in render(report, "html")


def _guest_rows(table: pl.DataFrame, start: int, end: int) -> pl.DataFrame:
    """The guest's TLBIs and DSB NSH/ISH between start and end (trace clock, ns)."""
    return table.filter(
        (pl.col("where") == "guest")
        & (pl.col("kind").is_in(["tlbi", "tlbi-nxs"]) | pl.col("operation").is_in(DSBS))
        & pl.col("ts").is_between(start, end)
    )


DSBS = ["DSB NSH", "DSB ISH"]
# The ground-truth clock is fitted at the boot's markers; a guest run's window is widened
# by this much (cells' guest runs are tens of seconds apart).
SLACK_NS = 1_000_000_000


def check_guest_invalidations(out: Path) -> None:
    """Ground truth per cell against the knob table's expectation (out: the boot's --out)."""
    truth = load_ground_truth(out)
    assert truth.header.not_written == 0 and truth.unfilled == 0 and truth.header.complete
    camp = out / "checks" / DESIGN_CHECK / "camp"
    plan = load_plan(out / "checks" / DESIGN_CHECK / "plan.toml")
    assert plan.design is not None
    record = json.loads((camp / "campaign.json").read_text())
    seen = 0
    for cell in record["cells"]:
        bundle = camp / cell["bundle"]
        manifest = read_manifest(bundle)
        guest = next(r for r in manifest.runs if r.kind == "guest")
        assert guest.start_ns is not None and guest.end_ns is not None
        vmm = parse_vmm_output((bundle / "runs" / guest.run_id / "vmm.txt").read_text())
        knobs = vmm.runs[0]
        # The VMM says it set the cell's levels; the expectation comes from what it set.
        asked = plan.design.fixed | {f.name: cell["axes"][f.name] for f in plan.design.factors}
        assert {k: knobs[k] for k in asked} == asked
        vcpu_runs = vmm.vms.height * int(knobs["vcpus"])
        expected = {op: n * vcpu_runs for op, n in guest_invalidations(knobs).items()}
        rows = _guest_rows(truth.table, guest.start_ns - SLACK_NS, guest.end_ns + SLACK_NS)
        counts = dict(rows.group_by("operation").len().iter_rows())
        assert counts == expected, cell["cell_id"]
        # Executed on the guest's CPU only: the log has no record of the broadcast on
        # the other CPUs (they execute nothing). effective_shareability is derived
        # (ingest/gtalign.py upgrades a guest's non-shareable operation under FB; the
        # plugin reads no HCR_EL2): this checks that derivation, it does not show FB in
        # emulation.
        assert set(rows["cpu"]) == set(manifest.options["guest_cpus"])
        assert set(rows["effective_shareability"]) == {"inner"}
        assert set(rows.filter(pl.col("kind") == "tlbi")["regime"]) == {"EL1&0"}
        local = rows.filter(pl.col("operation").is_in(["TLBI VMALLE1", "DSB NSH"]))
        assert set(local["shareability"]) <= {"non-shareable"}
        seen += rows.height
    # Nothing else in the boot executed a TLBI in the guest (the other checks' guests
    # have none), so every guest TLBI of the log was in some cell's guest run.
    everywhere = _guest_rows(truth.table, 0, 2**63 - 1)
    assert everywhere.height == seen
