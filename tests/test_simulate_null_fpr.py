"""benchmarks/simulate_null_fpr.py on generated bundles: which bundles count as null (by
the plugin's log, not by a model's prediction), the test's 4 + 4 design beside the
pseudo-run windows, the exact interval and the power figure."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from report_bundles import edit_manifest, make_bundle
from scripts_loader import load_benchmark

from tracekit.errors import TracekitError
from tracekit.ingest.bundle import load_bundle
from tracekit.simulate.model import load_model
from tracekit.simulate.simlog import RESPONDER_KEYS, VCPU_KEYS, WAKE_KEYS
from tracekit.vhost.runner import GT_BUNDLE_DIR, SIM_LOG


def _script() -> ModuleType:
    """The benchmark script imported as a module."""
    return load_benchmark("simulate_null_fpr")


def _log(label: str, *events: str) -> str:
    """A complete two-vCPU log of `label` with these event lines."""
    name, _, digest = label.partition("@")
    keys = (*VCPU_KEYS, *RESPONDER_KEYS, *WAKE_KEYS)
    vcpus = [f"vcpu {v} " + " ".join(f"{k} 0" for k in keys) for v in (0, 1)]
    return "\n".join(
        ["tksim-log 4", f"model {name} {digest}", "clock 1", *events, *vcpus, "complete 1"]
    )


def _bundle(root: Path, model: str, log: str, runs: int = 4) -> Path:
    """A generated null bundle (after = before) made under `model`, with `log`."""
    bundle = make_bundle(root, runs=runs, factor=1.0)
    label = load_model(model).label
    name, _, digest = label.partition("@")
    simulated = {"model": name, "hash": digest, "label": label}
    edit_manifest(bundle, lambda m: m["host"].__setitem__("simulated", simulated))
    (bundle / GT_BUNDLE_DIR).mkdir()
    (bundle / GT_BUNDLE_DIR / SIM_LOG).write_text(log)
    return bundle


def test_null_bundles_are_chosen_by_the_log(tmp_path: Path) -> None:
    """A log that created nothing makes a null set with the test's 4 + 4 design; one
    whose state held somewhere in the boot is left out unless its runs can be placed
    outside it (here: no ground truth to place them); a 1+1 bundle has no design."""
    fpr = _script()
    null = load_model("null").label
    kept = fpr.null_set(load_bundle(_bundle(tmp_path / "n", "null", _log(null))), None, None)  # type: ignore[attr-defined]
    assert kept.before == 4 and len(kept.runs) == 8
    before, after = kept.design
    assert len(before) == len(after) == 4 and all(v > 0 for v in before + after)
    brief = load_model("brief-literal").label
    held = _bundle(tmp_path / "b", "brief-literal", _log(brief, "create 100 1 1 0x4000015c"))
    with pytest.raises(TracekitError, match="no ground truth, so its runs cannot be placed"):
        fpr.null_set(load_bundle(held), None, None)  # type: ignore[attr-defined]
    # The same model, nothing created in the boot: nothing injected, so it counts.
    clean = _bundle(tmp_path / "c", "brief-literal", _log(brief))
    assert fpr.null_set(load_bundle(clean), None, None).design is not None  # type: ignore[attr-defined]
    wrong = _bundle(tmp_path / "w", "brief-literal", _log(null))
    with pytest.raises(TracekitError, match="its log ran null@"):
        fpr.null_set(load_bundle(wrong), None, None)  # type: ignore[attr-defined]
    short = _bundle(tmp_path / "s", "null", _log(null), runs=1)
    assert fpr.null_set(load_bundle(short), None, None).design is None  # type: ignore[attr-defined]


def test_the_windows_widen_by_what_a_responder_may_still_pay() -> None:
    """A held state's window ends at its clear plus the responders' window and cap."""
    fpr = _script()
    from tracekit.simulate.simlog import parse_sim_log

    brief = load_model("brief-literal")
    text = _log(brief.label, "create 100 1 1 0x4000015c", "clear-local 500 1 1 0x41159b28")
    windows = fpr.injected_windows(parse_sim_log(text), brief)  # type: ignore[attr-defined]
    assert windows == [(100, 500 + brief.window_ns + brief.cap_ns)]
    issuer = load_model("holder-only")
    assert fpr.injected_windows(parse_sim_log(text), issuer) == [(100, 500)]  # type: ignore[attr-defined]


def test_the_interval_and_the_smallest_effect() -> None:
    """Clopper-Pearson for 1 in 8 and 0 in 10; constant runs of 10 ms need more than
    +1 ms (the interval beyond x1.10) on every after run, and separated ranks."""
    fpr = _script()
    low, high = fpr.clopper_pearson(1, 8)  # type: ignore[attr-defined]
    assert low == pytest.approx(0.00316, abs=1e-4) and high == pytest.approx(0.5265, abs=1e-3)
    assert fpr.clopper_pearson(0, 10) == (0.0, pytest.approx(0.3085, abs=1e-3))  # type: ignore[attr-defined]
    flat = [10e6] * 4
    assert fpr.smallest_effect(flat, flat, added=True) == pytest.approx(1e6, rel=1e-3)  # type: ignore[attr-defined]
    assert fpr.smallest_effect(flat, flat, added=False) == pytest.approx(1.10, rel=1e-3)  # type: ignore[attr-defined]
    spread = [10e6, 20e6, 30e6, 150e6]
    assert fpr.smallest_effect(spread, spread, added=True) > 140e6  # type: ignore[attr-defined]
    recorded = fpr.recorded_set("s9-off=13,12,19,16/24,14,16,14")  # type: ignore[attr-defined]
    assert recorded.design == ([13e6, 12e6, 19e6, 16e6], [24e6, 14e6, 16e6, 14e6])
    with pytest.raises(TracekitError, match="4 \\+ 4 values"):
        fpr.recorded_set("x=1,2/3,4")  # type: ignore[attr-defined]
