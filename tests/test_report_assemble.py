"""Assembling a report: header first lines, builder order, failures shown, not hidden."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_bundles import awkward_section, copy_real_bundle, make_bundle

from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData, load_bundle
from tracekit.report import assemble
from tracekit.report.header import EMULATED_LINE
from tracekit.report.model import Report, Section
from tracekit.report.text import render_text


def _fails(bundles: list[BundleData]) -> Section | None:
    """A builder whose analysis refuses the data, as require_events does."""
    raise TracekitError("wakeup: no event sched_waking; record it with -e sched/sched_waking")


def _nothing(bundles: list[BundleData]) -> Section | None:
    """A builder with nothing to say about these bundles."""
    return None


def test_builder_failures_become_sections_and_none_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assemble, "SECTION_BUILDERS", [_nothing, _fails])
    heard: list[str] = []
    report = assemble.build_report([load_bundle(copy_real_bundle(tmp_path / "b"))], heard.append)
    assert [s.key for s in report.sections] == ["test_report_assemble"]
    assert "no event sched_waking" in report.sections[0].findings[0]
    assert "no event sched_waking" in report.sections[0].unknowns[0]
    assert heard[-2:] == ["report: test_report_assemble"] * 2


def _buggy(bundles: list[BundleData]) -> Section | None:
    """A builder with a bug (not the user's data): a KeyError."""
    return {}["r0"]  # type: ignore[no-any-return]


def test_a_builder_bug_is_named_but_hides_no_other_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assemble, "SECTION_BUILDERS", [_buggy, _fails])
    monkeypatch.delenv("TRACEKIT_DEBUG", raising=False)
    bundles = [load_bundle(copy_real_bundle(tmp_path / "b"))]
    report = assemble.build_report(bundles)
    assert len(report.sections) == 2
    assert report.sections[0].findings[0].startswith(f"not computed: {assemble.INTERNAL_ERROR}")
    assert "KeyError" in report.sections[0].findings[0]
    monkeypatch.setenv("TRACEKIT_DEBUG", "1")
    with pytest.raises(KeyError):
        assemble.build_report(bundles)


def test_header_names_each_bundle_and_says_emulated_first(tmp_path: Path) -> None:
    board = load_bundle(make_bundle(tmp_path / "board", 2, 1.0, emulated=False, guest="mmu-off"))
    emulated = load_bundle(make_bundle(tmp_path / "qemu", 2, 1.0, guest="mmu-on"))
    report = assemble.build_report([board, emulated])
    assert report.emulated and report.warnings == [EMULATED_LINE]
    # What both share is said once, first; each bundle's line says what is its own.
    assert report.header[0].startswith("2 bundles; in all: 6.1.0-test,")
    assert "guest CPU 1" in report.header[0]
    lines = [line for line in report.header if line.startswith(("board:", "qemu:"))]
    assert lines == ["board: guest mmu-off, hardware", "qemu: guest mmu-on, emulated"]
    on_board = assemble.build_report([board])
    assert not on_board.emulated and on_board.warnings == []


def test_no_bundles_is_a_clear_error() -> None:
    with pytest.raises(TracekitError, match="no bundles given"):
        assemble.build_report([])


def test_text_draws_any_section() -> None:
    empty = Section(key="empty", title="An empty section")
    text = render_text(Report(["header"], False, [empty, awkward_section()]))
    assert "An empty section" in text
    assert "metric_8_latency_ns" in text and "(no rows)" in text
    assert "lost trace events: 5" in text
    assert "plots (in --format html): cdf, histogram" in text


def _contradicts(bundles: list[BundleData]) -> Section | None:
    """A section with a finding that contradicts the setup, as a ground-truth check makes."""
    return Section(key="truth", title="truth", contradictions=["hotplug did not flush CPU 1"])


def _extra_warning(bundles: list[BundleData]) -> list[str]:
    """A warning of another kind, as a simulated effect adds one."""
    return ["SIMULATED EFFECT (model x2)."]


def test_warnings_and_contradictions_lead_every_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracekit.report import header
    from tracekit.report.render import render

    bundle = make_bundle(tmp_path / "b", 2, 1.0)
    monkeypatch.setattr(assemble, "SECTION_BUILDERS", [_contradicts, _contradicts])
    monkeypatch.setattr(header, "WARNINGS", [header.emulated_warnings, _extra_warning])
    report = assemble.build_report([load_bundle(bundle)])
    assert report.warnings == [EMULATED_LINE, "SIMULATED EFFECT (model x2)."]
    assert report.contradictions == ["hotplug did not flush CPU 1"]  # said once
    first = f"{EMULATED_LINE} SIMULATED EFFECT (model x2)."
    said = "CONTRADICTS THE SETUP: hotplug did not flush CPU 1"
    for fmt in ("text", "email"):
        lines = render(report, fmt).splitlines()
        assert " ".join(line.strip() for line in lines[:2]) == first
        assert lines[2] == said
    html = render(report, "html")
    assert html.index(first) < html.index(said) < html.index("b; host:")
    assert '"contradictions": [\n  "hotplug did not flush CPU 1"' in render(report, "json")


def test_the_header_names_the_guest_the_decision_table_names(tmp_path: Path) -> None:
    """A bundle from before collect recorded the variant that ran: its file name wins, in
    the header as in the decision table's conditions."""
    from report_bundles import edit_manifest

    from tracekit.analysis.conditions import guest_variant

    bundle = make_bundle(tmp_path / "b", 2, 1.0, guest="mmu-on")
    edit_manifest(bundle, lambda m: m["scenario"].update(guest="/x/build/guests/mmu-off.elf"))
    data = load_bundle(bundle)
    report = assemble.build_report([data])
    assert guest_variant(data.manifest) == "mmu-off"
    assert "guest mmu-off on CPU 1" in " ".join(report.header)
    assert "(mmu-off on CPU 1)" in report.question and "mmu-on" not in report.question


def test_every_format_leads_with_the_same_not_known_and_lists_every_item(
    tmp_path: Path,
) -> None:
    import json
    from dataclasses import replace
    from html import escape

    from tracekit.report.gather import not_known_lines, not_known_note
    from tracekit.report.render import render

    real = assemble.build_report([load_bundle(copy_real_bundle(tmp_path / "b"))])
    extra = Section(key="extra", title="Extra <topic>", unknowns=["x < y", "z"])
    report = replace(real, sections=[*real.sections, extra])
    number = len(report.sections)
    lead = not_known_lines(report)
    assert f"{number}. Extra <topic>: 2 items" in lead
    items = [u for s in report.sections for u in s.unknowns]
    data = json.loads(render(report, "json"))
    assert data["lead"]["not known"] == lead
    assert data["lead_notes"]["not known"] == not_known_note(report)
    assert [u for part in data["not_known"] for u in part["items"]] == items
    assert data["not_known"][-1] == {"section": "extra", "number": number, "items": ["x < y", "z"]}
    html = render(report, "html")
    part = html.split('<section id="what-is-not-known">', 1)[1]
    assert html.index('href="#what-is-not-known"') < html.index('<section id="what-is-not-known"')
    assert all(f"<li>{escape(u)}</li>" in part for u in items)
    for fmt in ("text", "email"):
        flat = " ".join(render(report, fmt).split())
        assert all(f"- {line}" in flat for line in lead)
        tail = flat.split(f"{number + 1}. What is not known", 2)[-1]
        assert all(f"- {u}" in tail for u in items)
