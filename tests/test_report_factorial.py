"""The campaign section on generated campaigns: effects, dose-responses, in every format."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from bundlegen import Spec, generate

from tracekit.ingest.bundle import BundleData, load_bundle
from tracekit.report.assemble import build_report
from tracekit.report.email import WIDTH, render_email
from tracekit.report.html import render_html
from tracekit.report.json import render_json
from tracekit.report.model import Report, Section
from tracekit.report.text import render_text

MMU_FACTOR = 2.0


def _factorial(root: Path, kernel: str = "6.1.0-50-arm64") -> list[BundleData]:
    """mmu x ng, two boots each: mmu=1 doubles the after phase, ng does nothing."""
    bundles, seed = [], 0
    for mmu in ("0", "1"):
        for ng in ("0", "1"):
            for boot in range(2):
                seed += 1
                spec = Spec(
                    runs=4,
                    factor=MMU_FACTOR if mmu == "1" else 1.0,
                    seed=seed,
                    knobs=(f"mmu={mmu}", f"ng={ng}"),
                    kernel=kernel,
                )
                bundles.append(generate(root / f"{seed:03d}-mmu{mmu}-ng{ng}-r{boot}", spec))
    return [load_bundle(path) for path in bundles]


@pytest.fixture(scope="module")
def factorial_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """The report of the generated 2x2 campaign."""
    return build_report(_factorial(tmp_path_factory.mktemp("factorial")))


def _section(report: Report) -> Section:
    """The campaign section."""
    return next(s for s in report.sections if s.key == "factorial")


def test_the_injected_factor_is_found_and_the_null_one_is_not(factorial_report: Report) -> None:
    """mmu found on both responses with x2 inside its interval; ng not found."""
    section = _section(factorial_report)
    primary = section.tables[0].frame
    assert primary["term"].to_list() == ["mmu", "ng", "mmu x ng"]
    mmu = primary.row(0, named=True)
    low, high = map(float, mmu["95% CI"].split("-"))
    assert mmu["verdict"] == "found" and low < MMU_FACTOR < high
    assert primary.row(1, named=True)["verdict"] != "found"
    assert any(f.startswith("p99.9: mmu 1 vs 0 x") for f in section.findings)
    assert any(f.startswith("probe: mmu 1 vs 0 x") for f in section.findings)


def test_email_keeps_the_effects_table_within_72_columns(factorial_report: Report) -> None:
    """The whole email fits, and the effects table is whole (not split) in it."""
    text = render_email(factorial_report)
    assert all(len(line) <= WIDTH for line in text.splitlines())
    header = next(line for line in text.splitlines() if line.strip().startswith("term"))
    assert header.split() == ["term", "levels", "x", "95%", "CI", "verdict", "aliases"]


def test_html_draws_each_effect_on_its_interval(factorial_report: Report) -> None:
    """One interval plot per response; each effect a line with its tooltip, around x1."""
    html = render_html(factorial_report)
    start = html.index("effects with their 95% intervals")
    svg = html[html.index("<svg", start) : html.index("</svg>", start) + 6]
    tree = ET.fromstring(svg)
    tips = [t.text or "" for t in tree.iter("title")]
    assert any(t.startswith("mmu 1 vs 0: ") for t in tips)
    assert any(t.startswith("mmu x ng: ") for t in tips)
    assert len([e for e in tree.iter("circle")]) == 3


def test_json_and_text_carry_the_same_numbers(factorial_report: Report) -> None:
    """The JSON section has the effects table; the text shows the same interval."""
    data = json.loads(render_json(factorial_report))
    sections = data["sections"]
    section = (
        sections["factorial"]
        if isinstance(sections, dict)
        else next(s for s in sections if s["key"] == "factorial")
    )
    interval = _section(factorial_report).tables[0].frame["95% CI"][0]
    assert interval in json.dumps(section)
    assert interval in render_text(factorial_report)


def test_a_dose_sweep_gets_its_shape_and_curve(tmp_path: Path) -> None:
    """pages 0..1024 with the effect rising then flat: dose table, shapes, an xy plot."""
    ratios = {"0": 1.0, "16": 1.6, "256": 2.0, "1024": 2.0}
    paths = []
    for i, (pages, ratio) in enumerate(ratios.items()):
        for boot in range(2):
            spec = Spec(runs=4, factor=ratio, seed=10 + 2 * i + boot, knobs=(f"pages={pages}",))
            paths.append(generate(tmp_path / f"{i}{boot}-pages{pages}", spec))
    report = build_report([load_bundle(p) for p in paths])
    section = _section(report)
    assert section.title.startswith("Campaign: dose-response over pages")
    curve = section.tables[0].frame
    assert curve["dose"].to_list() == [0.0, 16.0, 256.0, 1024.0]
    assert set(section.tables[1].frame["shape"]) == {"flat", "linear", "saturating", "step"}
    assert section.plots[0].kind == "xy"
    assert all(len(line) <= WIDTH for line in render_email(report).splitlines())


def test_no_section_without_a_varying_factor(tmp_path: Path) -> None:
    """Bundles that share every knob are not a campaign over factors."""
    paths = [generate(tmp_path / f"b{i}", Spec(runs=4, seed=i, knobs=("mmu=1",))) for i in (1, 2)]
    report = build_report([load_bundle(p) for p in paths])
    assert all(s.key != "factorial" for s in report.sections)


def test_a_chosen_vmid_is_reported_with_its_baseline(tmp_path: Path) -> None:
    """VMID 1 vs 40, two boots each: the VMID section says the before phase is the cell's own
    baseline, lists the throwaway VMs, and the campaign section takes vmid as a factor."""
    paths = [
        generate(tmp_path / f"{vmid}-{boot}", Spec(runs=4, seed=20 + vmid + boot, vmid=vmid))
        for vmid in (1, 40)
        for boot in (0, 1)
    ]
    report = build_report([load_bundle(p) for p in paths])
    prep = next(s for s in report.sections if s.key == "vmidprep")
    assert "own baseline" in prep.findings[0]
    table = prep.tables[0].frame
    assert table["throwaway VMs"].to_list() == [0, 0, 39, 39]
    assert table["VMIDs seen"].to_list()[2:] == ["1-39", "1-39"]
    assert set(table["as planned"]) == {"yes"}
    assert _section(report).tables[0].frame["term"].to_list() == ["vmid"]
    assert "own baseline" in " ".join(render_email(report).split())


def test_bundles_that_differ_beyond_the_factors_are_never_pooled(tmp_path: Path) -> None:
    """mmu x ng on two kernels (a matrix axis beside the design): one effects table per
    kernel, each over that kernel's 8 boots; a bundle that lacks a field (no guest revision:
    unknown) pools with nothing and is said to be left out."""
    kernels = ("6.1.0-50-arm64", "6.12.0-1-arm64")
    bundles = [b for k in kernels for b in _factorial(tmp_path / k, kernel=k)]
    spec = Spec(runs=4, seed=99, knobs=("mmu=1", "ng=0"), guest_revision=None)
    bundles.append(load_bundle(generate(tmp_path / "old", spec)))
    report = build_report(bundles)
    section = _section(report)
    primary = [
        t for t in section.tables if t.title.endswith("p99.9 after/before: effects as factors")
    ]
    assert len(primary) == 2
    for kernel, table in zip(kernels, primary, strict=True):
        assert table.title.startswith("[") and f"kernel {kernel}" in table.title
        assert table.note.startswith("8 bundles from 8 boots")
    assert any(
        "guest revision unknown" in line and "no effect" in line for line in section.unknowns
    )
    assert all(len(line) <= WIDTH for line in render_email(report).splitlines())


def test_cells_of_one_boot_are_one_unit_not_replicates(tmp_path: Path) -> None:
    """Four cells of one boot (as `campaign --board` in one boot makes): one unit per
    condition, so no interval; the report says so and never prints them as four boots."""
    bundles = [
        load_bundle(
            generate(
                tmp_path / f"{i}-pre_tlbi{level}",
                Spec(runs=4, seed=40 + i, knobs=(f"pre_tlbi={level}",), boot_id="one-boot"),
            )
        )
        for i, level in enumerate(("1", "1", "0", "0"))
    ]
    section = _section(build_report(bundles))
    table = section.tables[0]
    assert table.note.startswith("4 bundles from 1 boot, 0 degrees of freedom"), table.note
    assert table.frame["95% CI"].to_list() == ["-"] and table.frame["verdict"][0] == "unclear"
    text = " ".join(section.findings)
    assert "1 of 1 boots ran cells of more than one condition" in text
    assert any("no condition was run on two boots" in line for line in section.unknowns)


def test_bundles_without_a_boot_id_count_as_their_own_boots(tmp_path: Path) -> None:
    """Old bundles (no host.boot_id): each its own boot, and the report says it assumed so."""
    bundles = [
        load_bundle(
            generate(
                tmp_path / f"{i}-ng{ng}",
                Spec(runs=4, seed=60 + i, knobs=(f"ng={ng}",), boot_id=None),
            )
        )
        for i, ng in enumerate(("0", "0", "1", "1"))
    ]
    section = _section(build_report(bundles))
    assert section.tables[0].note.startswith("4 bundles from 4 boots, 2 degrees of freedom")
    assert any("4 bundles do not record their boot" in line for line in section.findings)


def test_the_section_says_how_many_finds_chance_alone_would_give(factorial_report: Report) -> None:
    """mmu, ng and mmu x ng on two responses: six tested effects, about 0.3 by chance."""
    section = _section(factorial_report)
    (line,) = [f for f in section.findings if "by chance" in f]
    assert line.startswith("6 effects tested over 2 responses") and "about 0.3 of them" in line
