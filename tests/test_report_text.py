"""The text report on bundles generated here with a known injected effect.

Each run's cyclictest output is the real `-v -N` fixture recorded on Debian's
rt-tests (tests/fixtures/ingest/tools/cyclictest-verbose.txt), resampled per run with a
fixed seed; the "after" runs are multiplied by a known factor, and only they.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tracekit.analysis.beforeafter import latency_comparisons
from tracekit.bundle import BundleWriter, Manifest, RunRecord
from tracekit.ingest.bundle import load_bundle
from tracekit.ingest.tools import read_cyclictest_verbose
from tracekit.report.text import render_text

FIXTURE = Path(__file__).parent / "fixtures" / "ingest" / "tools" / "cyclictest-verbose.txt"
STRESS_YAML = "---\nstress-ng-version: 0.15.06\nmetrics:\n    - stressor: tlb-shootdown\n"
STRESS_FIELDS = "      bogo-ops: {ops}\n      bogo-ops-per-second-real-time: {rate}\n"


def _write_run(writer: BundleWriter, run_id: str, phase: str, factor: float, seed: int) -> None:
    """One quiet run: resampled real cyclictest samples (scaled) and a stress-ng result."""
    real = read_cyclictest_verbose(FIXTURE)["latency_ns"].to_numpy()
    rng = np.random.default_rng(seed)
    samples = (rng.choice(real, size=real.size) * factor).astype(int)
    lines = ["# /dev/cpu_dma_latency set to 0us"]
    lines += [f"{0:8d}:{i:8d}:{v:8d}" for i, v in enumerate(samples)]
    writer.path(f"runs/{run_id}/cyclictest.txt").write_text("\n".join(lines) + "\n")
    # cyclictest counts a few loops more than -v printed, as seen in real runs.
    counted = {"thread": {"0": {"cycles": samples.size + 3}}}
    writer.path(f"runs/{run_id}/cyclictest.json").write_text(json.dumps(counted))
    rate = 100.0 + rng.normal(0, 2)
    writer.path(f"runs/{run_id}/stress-ng.yaml").write_text(
        STRESS_YAML + STRESS_FIELDS.format(ops=int(rate * 5), rate=rate)
    )
    run = writer.start_run(RunRecord(run_id, phase, "quiet", int(run_id[-1])))
    writer.end_run(run)


def make_bundle(root: Path, runs: int, factor: float, emulated: bool = True) -> Path:
    """A complete bundle: `runs` quiet runs per phase, after = before x factor."""
    host = {"emulated": emulated, "kernel_release": "6.1.0-test", "kvm": {"mode": "nvhe"}}
    writer = BundleWriter.create(root, Manifest(host=host, options={"runs": runs}))
    for i in range(runs):
        _write_run(writer, f"before-quiet-{i}", "before", 1.0, seed=i)
        _write_run(writer, f"after-quiet-{i}", "after", factor, seed=100 + i)
    writer.finish()
    return root


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
    text = render_text(load_bundle(make_bundle(tmp_path / "b", runs=2, factor=2.0)))
    assert text.splitlines()[0].startswith("EMULATED HOST")
    assert "needs 4+4 runs" in text
    assert "lost events: no traced runs" in text
    assert "cyclictest samples: 12 of" in text  # 3 unprinted loops in each of 4 runs


def test_report_on_a_board_does_not_say_emulated(tmp_path: Path) -> None:
    text = render_text(load_bundle(make_bundle(tmp_path / "b", runs=4, factor=2.0, emulated=False)))
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
