"""The text report on bundles generated with a known injected effect (report_bundles.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_bundles import copy_real_bundle, edit_manifest, make_bundle

from tracekit.analysis.beforeafter import latency_comparisons
from tracekit.ingest.bundle import load_bundle
from tracekit.report.assemble import build_report
from tracekit.report.text import render_text


def test_injected_effect_is_present_with_its_ratio(tmp_path: Path) -> None:
    data = load_bundle(make_bundle(tmp_path / "b", runs=8, factor=2.0))
    primary = next(c for c in latency_comparisons(data.latencies) if c.role == "primary")
    assert primary.metric == "cyclictest p99.9"
    assert primary.verdict == "present"
    assert primary.ci_low <= 2.0 <= primary.ci_high
    assert 1.6 < primary.ratio < 2.5


def test_no_effect_is_not_present(tmp_path: Path) -> None:
    data = load_bundle(make_bundle(tmp_path / "b", runs=8, factor=1.0))
    verdicts = {c.metric: c.verdict for c in latency_comparisons(data.latencies)}
    assert "present" not in verdicts.values()


def test_report_says_emulated_first_and_fits_a_terminal(tmp_path: Path) -> None:
    text = render_text(build_report([load_bundle(make_bundle(tmp_path / "b", runs=2, factor=2.0))]))
    assert text.splitlines()[0].startswith("EMULATED HOST")
    assert "needs 4+4 runs" in text
    assert "lost events: no traced runs" in text
    assert "cyclictest samples: 12 of" in text  # 3 unprinted loops in each of 4 runs


def test_report_on_a_board_does_not_say_emulated(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", runs=4, factor=2.0, emulated=False)
    text = render_text(build_report([load_bundle(bundle)]))
    assert "EMULATED" not in text


def test_unreadable_probe_summary_is_one_clear_error(tmp_path: Path) -> None:
    from tracekit.errors import TracekitError

    root = make_bundle(tmp_path / "b", runs=1, factor=1.0)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["runs"].append({**manifest["runs"][0], "run_id": "x-probe", "kind": "probe"})
    (root / "manifest.json").write_text(json.dumps(manifest))
    (root / "runs/x-probe").mkdir()
    (root / "runs/x-probe/probe.json").write_text("not json\n")
    with pytest.raises(TracekitError, match="probe's JSON summary"):
        load_bundle(root)


def test_saturated_rt_cpu_and_probe_samples_are_said_plainly(tmp_path: Path) -> None:
    """The real emulated run's median wake-up exceeds its 1000 us interval: said first."""
    text = render_text(build_report([load_bundle(copy_real_bundle(tmp_path / "real"))]))
    flat = " ".join(text.split())
    said = "CONTRADICTS THE SETUP: the emulated rt CPU is saturated: its median wake-up"
    assert flat.index(said) < flat.index("Question:")  # right after the warnings line
    assert "SATURATED" not in flat.split("Question:")[0]  # one label, not two
    assert "(1049 us before quiet, 3793 us before traced)" in flat
    assert "above cyclictest's 1000 us interval" in flat
    # Review of 17, point 17: no run count makes a saturated CPU's latencies a verdict, so
    # neither the result nor the unknowns ask for more runs of cyclictest; the wake-up
    # decomposition says its parts are the backlog's.
    result = flat.split("Result:")[1].split("stress-ng")[0]
    assert "no run count makes this a verdict" in result and "needs" not in result
    assert "the rule needs" not in flat.split("1. Before -> after")[-1].split("2. Wake-up")[0]
    if "Wake-up latency on the rt CPU, decomposed" in flat:
        assert "decompose that backlog, not the wake-up path" in flat
    assert "broadcast-TLBI call" not in flat and "mprotect per call" not in flat
    assert "one syscall per sample" in flat and "never the slow responder" in flat
    calm = make_bundle(tmp_path / "calm", runs=2, factor=1.0)
    edit_manifest(calm, lambda m: m["options"].update(interval_us=1000))
    calm_text = " ".join(render_text(build_report([load_bundle(calm)])).split())
    assert "saturated" not in calm_text.lower() and "no run count" not in calm_text
