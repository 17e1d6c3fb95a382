"""Campaign designs: full, fractional (generators, aliases, resolution) and dose sweeps."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.campaign.cells import expand_cells
from tracekit.campaign.command import collect_argv
from tracekit.campaign.design import (
    LETTERS,
    STANDARD_GENERATORS,
    check_balance,
    parse_design,
    runs_for_verdict,
)
from tracekit.campaign.plan import COLLECT_OPTIONS, parse_plan
from tracekit.cli import main
from tracekit.errors import TracekitError

# Resolutions of the textbook generators (Box, Hunter & Hunter, table 6.22).
KNOWN_RESOLUTION = {
    (3, 1): 3, (4, 1): 4, (5, 1): 5, (5, 2): 3, (6, 1): 6, (6, 2): 4, (6, 3): 3,
    (7, 1): 7, (7, 2): 4, (7, 3): 4, (7, 4): 3, (8, 4): 4,
}  # fmt: skip
KNOB_FACTORS = ("mmu", "pre_tlbi", "ng", "caches", "mmu_off", "touch", "pages", "asid")


def _design(table: dict) -> object:
    """A design parsed as a plan's [design] table."""
    return parse_design("test", table, COLLECT_OPTIONS)


def _two_level(k: int) -> dict[str, list[str]]:
    """k two-level knob factors (numeric knobs get two doses)."""
    return {name: ["0", "1"] if name != "pages" else ["1", "64"] for name in KNOB_FACTORS[:k]}


def _column(design: object, rows: list[dict[str, str]], letters: str) -> list[int]:
    """The +/-1 column of a product of factors, read from the design's rows."""
    factors = {f.letter: f for f in design.factors}
    return [
        math.prod(-1 if row[factors[c].name] == factors[c].levels[0] else 1 for c in letters)
        for row in rows
    ]


def test_full_factorial_is_every_combination_once_and_balanced() -> None:
    """3 x 2 x 2 levels: 12 distinct conditions, each level equally often."""
    design = _design(
        {"factors": {"leaf": ["4k", "2m", "1g"], "mmu": ["0", "1"], "backing": ["4k", "thp"]}}
    )
    rows = design.conditions()
    assert len(rows) == 12
    assert len({tuple(r.items()) for r in rows}) == 12
    assert check_balance(design) == []
    assert design.resolution() is None


@pytest.mark.parametrize(("k", "p"), sorted(STANDARD_GENERATORS))
def test_standard_fractions_balanced_with_their_resolution(k: int, p: int) -> None:
    """Every textbook fraction: 2^(k-p) distinct rows, balanced, orthogonal, stated resolution."""
    design = _design({"kind": "fractional", "fraction": p, "factors": _two_level(k)})
    rows = design.conditions()
    assert len(rows) == 2 ** (k - p)
    assert len({tuple(r.items()) for r in rows}) == len(rows)
    assert check_balance(design) == []
    assert design.resolution() == KNOWN_RESOLUTION[(k, p)]


@pytest.mark.parametrize(("k", "p"), sorted(STANDARD_GENERATORS))
def test_aliases_are_the_columns_that_coincide(k: int, p: int) -> None:
    """An effect's listed aliases are exactly the effects whose columns equal its own (+/-)."""
    design = _design({"kind": "fractional", "fraction": p, "factors": _two_level(k)})
    rows = design.conditions()
    letters = LETTERS[:k]
    every = ["".join(c) for n in range(1, k + 1) for c in itertools.combinations(letters, n)]
    for effect, aliased in design.aliases().items():
        mine = _column(design, rows, effect)
        same = {e for e in every if e != effect and abs(sum(
            a * b for a, b in zip(mine, _column(design, rows, e), strict=True)
        )) == len(rows)}  # fmt: skip
        assert same == set(aliased), effect


def test_generators_by_name_and_the_printed_alias_structure() -> None:
    """ng = mmu*leaf*pre_tlbi is D=ABC: I = ABCD, resolution IV, AB = CD shown once."""
    design = _design(
        {
            "kind": "fractional",
            "generators": ["ng = mmu*leaf*pre_tlbi"],
            "factors": {"mmu": [0, 1], "leaf": ["4k", "1g"], "pre_tlbi": [0, 1], "ng": [0, 1]},
        }
    )
    assert design.generators == ("D=ABC",)
    text = "\n".join(design.summary())
    assert "resolution IV" in text and "defining relation: I = ABCD" in text
    assert "    AB = CD" in text and "    CD = AB" not in text
    # The generated factor really is the product: ng on exactly where mmu*leaf*pre_tlbi is +.
    for row in design.conditions():
        signs = [row["mmu"] == "1", row["leaf"] == "1g", row["pre_tlbi"] == "1"]
        assert (row["ng"] == "1") == (sum(not s for s in signs) % 2 == 0)


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"factors": {"mmu": ["0", "2"]}}, "guest knob mmu='2'"),
        ({"factors": {"colour": ["a", "b"]}}, "neither a guest knob"),
        ({"factors": {"mmu": ["1"]}}, "at least two levels"),
        ({"kind": "fractional", "fraction": 1, "factors": {"leaf": ["4k", "2m", "1g"]}},
         "two-level"),
        ({"kind": "fractional", "fraction": 1, "factors": _two_level(2)}, "no standard generators"),
        ({"kind": "fractional", "generators": ["C = A*Z"], "factors": _two_level(3)},
         "not a factor"),
        ({"kind": "fractional", "generators": ["C=AB", "C=AB"], "factors": _two_level(4)}, "twice"),
        ({"kind": "dose", "factors": {"pages": ["1", "8"]}}, "at least three numeric"),
        ({"kind": "dose", "factors": _two_level(2)}, "sweeps one factor"),
        ({"factors": {"mmu": ["0", "1"]}, "fixed": {"mmu": 1}}, "also a factor"),
        ({"factors": {"mmu": ["0", "1"]}, "timing": {"boot": 3}}, "unknown key 'boot'"),
    ],
)  # fmt: skip
def test_design_mistakes_are_one_line(table: dict, says: str) -> None:
    """Each mistake names what is wrong before anything boots."""
    with pytest.raises(TracekitError, match=says) as err:
        _design(table)
    assert "\n" not in str(err.value)


PLAN = {
    "seed": 5,
    "repeats": 3,
    "collect": {"runs": 4, "traced_runs": 0, "duration": 5},
    "design": {
        "kind": "dose",
        "factors": {"pages": [1, 16, 256, 4096]},
        "fixed": {"mmu": 1, "backing": "thp"},
    },
}


def test_dose_plan_cells_replicated_in_a_seeded_order_with_their_arguments() -> None:
    """4 doses x 3 replicates = 12 cells, seeded order; fixed values and the dose reach collect."""
    plan = parse_plan(PLAN)
    cells = expand_cells(plan, 5)
    assert len(cells) == 12
    assert sorted(c.axes["pages"] for c in cells) == sorted(["1", "16", "256", "4096"] * 3)
    assert [c.cell_id for c in expand_cells(plan, 5)] == [c.cell_id for c in cells]
    assert [c.cell_id for c in expand_cells(plan, 6)] != [c.cell_id for c in cells]
    assert all("pages" in c.cell_id for c in cells)
    argv = collect_argv(cells[0], plan, "/out", "/guests", "python3")
    tail = argv[argv.index("--duration") + 2 : argv.index("-o")]
    assert tail == [
        "--knob", "mmu=1", "--backing", "thp", "--knob", f"pages={cells[0].axes['pages']}"
    ]  # fmt: skip


def test_a_factor_given_twice_is_refused() -> None:
    """A factor that [collect] also sets would give collect two values."""
    data = PLAN | {"design": {"factors": {"tlbi_count": [1, 2]}}}
    data["collect"] = {"tlbi_count": 3}
    with pytest.raises(TracekitError, match="in \\[design\\] and in \\[collect\\]"):
        parse_plan(data)


def test_campaign_design_prints_cells_time_and_runs_needed(tmp_path: Path) -> None:
    """`tracekit campaign PLAN --design`: the summary, run nothing; too few runs are flagged."""
    plan = tmp_path / "dose.toml"
    plan.write_text(
        "repeats = 1\n[collect]\nruns = 2\ntraced_runs = 0\nduration = 5\n"
        '[design]\nkind = "dose"\n[design.factors]\npages = [1, 16, 256]\n'
        "[design.timing]\nboot_s = 10\nsetup_s = 50\nboard_boot_s = 60\nboard_setup_s = 0\n"
    )
    result = CliRunner().invoke(
        main, ["campaign", str(plan), "--design", "-o", str(tmp_path / "c")]
    )
    assert result.exit_code == 0, result.output
    assert "cells: 3 (3 conditions x 1 replicate(s)" in result.output
    assert "needs 4 quiet runs per phase" in result.output and "TOO FEW" in result.output
    assert "set repeats = 2" in result.output
    # 2 phases x (2 quiet runs + 3 probe slots) x 5 s + a guest (2 s) = 52 s.
    assert "52 s measured per cell" in result.output
    assert not (tmp_path / "c").exists()


def test_runs_for_verdict_matches_the_rank_test() -> None:
    """The stdlib count equals compare.py's (the campaign cannot import numpy on a board)."""
    from tracekit.analysis.compare import runs_needed

    for alpha in (0.1, 0.05, 0.01, 0.001):
        assert runs_for_verdict(alpha) == runs_needed(alpha)


def test_vmid_is_a_factor_of_its_own() -> None:
    """A design over the VMID passes collect --vmid per cell."""
    plan = parse_plan({"repeats": 2, "design": {"factors": {"vmid": [1, 200], "mmu": [0, 1]}}})
    cells = expand_cells(plan, 1)
    assert len(cells) == 8
    for cell in cells:
        argv = collect_argv(cell, plan, "/out", "/guests", "python3")
        assert argv[argv.index("--vmid") + 1] == cell.axes["vmid"]


def test_the_estimate_counts_the_vmid_throwaway_vms() -> None:
    """VMID 201 costs 200 throwaway VMs more than VMID 1, at the stated seconds per VM."""
    from tracekit.campaign.cells import plan_conditions
    from tracekit.campaign.estimate import THROWAWAY_VM_SECONDS, cell_measure_seconds

    plan = parse_plan({"design": {"factors": {"vmid": [1, 201]}}})
    one, many = (
        cell_measure_seconds(plan, "main", "default", c["vmid"]) for c in plan_conditions(plan)
    )
    assert many - one == pytest.approx(200 * THROWAWAY_VM_SECONDS)
