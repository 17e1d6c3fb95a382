"""Bundles and sections the report tests build, and the real bundle fixture.

Generated bundles: each run's cyclictest output is the real `-v -N` fixture recorded on
Debian's rt-tests (tests/fixtures/ingest/tools/cyclictest-verbose.txt), resampled per
run with a fixed seed; the "after" runs are multiplied by a known factor, and only they.
The real bundle (tests/fixtures/report/nvhe-a76) is described in its README.md.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl

from tracekit.analysis.compare import compare
from tracekit.bundle import BundleWriter, Manifest, RunRecord
from tracekit.ingest.tools import read_cyclictest_verbose
from tracekit.report.model import Plot, Section, Table

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE = FIXTURES / "ingest" / "tools" / "cyclictest-verbose.txt"
REAL_BUNDLE = FIXTURES / "report" / "nvhe-a76"
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


def make_bundle(
    root: Path, runs: int, factor: float, emulated: bool = True, guest: str = "mmu-on"
) -> Path:
    """A complete bundle: `runs` quiet runs per phase, after = before x factor."""
    host = {"emulated": emulated, "kernel_release": "6.1.0-test", "kvm": {"mode": "nvhe"}}
    options = {"runs": runs, "rt_cpu": 3, "stress_cpus": [0, 1, 2], "guest_cpus": [1]}
    scenario = {"name": "main", "guest_variant": guest}
    writer = BundleWriter.create(root, Manifest(host=host, options=options, scenario=scenario))
    for i in range(runs):
        _write_run(writer, f"before-quiet-{i}", "before", 1.0, seed=i)
        _write_run(writer, f"after-quiet-{i}", "after", factor, seed=100 + i)
    writer.finish()
    return root


def copy_real_bundle(dest: Path) -> Path:
    """A writable copy of the real bundle fixture."""
    shutil.copytree(REAL_BUNDLE, dest)
    return dest


def edit_manifest(bundle: Path, edit: object) -> None:
    """Apply `edit(manifest_dict)` to a bundle's manifest.json."""
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)  # type: ignore[operator]
    path.write_text(json.dumps(data))


EVIL_COMM = "<img src=x onerror=alert(1)>"
LONG_CELL = "a-comm-name-that-is-far-too-long-for-any-column-" * 3


def awkward_section() -> Section:
    """A section built to be hard to render: wide tables, long words, every plot kind."""
    rng = np.random.default_rng(3)
    wide = pl.DataFrame(
        {
            "condition": ["mmu-on guest on CPU 1", "mmu-off guest on CPU 1"],
            **{f"metric_{i}_latency_ns": [123456789.5 * i, 0.000123] for i in range(9)},
        }
    )
    long_cell = pl.DataFrame({"cpu": [0, 3], "comm": [LONG_CELL, EVIL_COMM], "count": [12, 7]})
    samples = pl.DataFrame(
        {
            "latency_us": np.concatenate([rng.lognormal(3, 1, 500), rng.lognormal(4, 1, 500)]),
            "series": ["before"] * 500 + ["after"] * 500,
        }
    )
    spans = pl.DataFrame(
        {
            "start": [1_000_000, 2_500_000, 1_200_000],
            "end": [2_000_000, 4_000_000, 1_300_000],
            "lane": ["CPU 0", "CPU 3", "CPU 0"],
            "label": [EVIL_COMM, "irq 11", "mprotect"],
        }
    )
    xy = pl.DataFrame({"ipa_bits": [32, 36, 40, 44], "teardown_ms": [1.0, 2.0, 16.0, 250.0]})
    bars = pl.DataFrame({"cpu": ["0", "1", "2"], "cost_ns": [100.0, 0.0, 300.0]})
    return Section(
        key="awkward <section>",
        title=f"Awkward section with {EVIL_COMM} in its title",
        findings=[
            "a finding naming a long path " + "/very/long/path" * 8 + " and more words " * 6,
            f"comm {EVIL_COMM} and a non-ASCII comm kworker/\u00e9\u4e2d",
        ],
        comparisons=[
            compare([10.0, 11, 9, 10], [20.0, 22, 19, 21], "probe p99 on CPU 3 " + "x" * 40)
        ],
        tables=[
            Table("a table with ten columns", wide, note="too wide for 72 columns"),
            Table("a table with a long cell", long_cell),
            Table("an empty table", pl.DataFrame(schema={"cpu": pl.Int64, "what": pl.String})),
        ],
        plots=[
            Plot("cdf", "cdf", samples, x="latency_us", series="series", log_x=True),
            Plot("histogram", "histogram", samples, x="latency_us", series="series", log_x=True),
            Plot("bars", "bars", bars, x="cpu", y="cost_ns"),
            Plot("xy", "xy", xy, x="ipa_bits", y="teardown_ms"),
            Plot("timeline", "timeline", spans, x="start", y="lane"),
            Plot("missing column", "xy", xy, x="ipa_bits", y="nope"),
            Plot("empty", "cdf", samples.head(0), x="latency_us"),
        ],
        unknowns=["whether " + "the state is per CPU " * 8, f"what {EVIL_COMM} did"],
        lost_events=5,
    )
