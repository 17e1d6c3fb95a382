#!/usr/bin/env python3
"""The verdict rule's false-positive rate on simulated runs where the model injects nothing.

Takes bundles made in the emulated host under a simulated mechanism whose prediction for
that bundle's condition is "absent" (the null model, or an MMU-off guest under any
shipped model: tracekit.simulate.predict says which; others are refused). The model is
the one the bundle carries (groundtruth/vhost-simulate.toml, hash checked), so bundles
made before a shipped model changed still count under the model they were made with. Their quiet
runs, in run order (before, then after), are each split into k contiguous pieces
(pseudo-runs, k = 1..6), and every window of n pseudo-runs is compared with the next n
(n = 4, 6, 8) for max, p99, p99.9 and mean, as tests/test_analysis_fpr.py does on its
fixture, and for top10 (the mean of a pseudo-run's 10 longest wake-ups,
tracekit.analysis.runs.TAIL_METRICS): neighbouring windows keep the host's drift.
Prints the "present" verdicts per bundle and metric, the rate per metric (one figure a
primary metric is chosen by, beside the known-answer boot's verdicts) and, as before
top10 existed, over the first four. Every metric comes from
tracekit.analysis.runs.run_metrics. Emulated timings.

    python3 benchmarks/simulate_null_fpr.py [--model TOML] BUNDLE [BUNDLE...]

--model: the model bundles were made under when they carry no copy of it (a boot that
timed out gives its bundles no ground truth; the copy is in its --out); hash checked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import polars as pl

from tracekit.analysis.compare import PRESENT, compare
from tracekit.analysis.conditions import bundle_condition
from tracekit.analysis.runs import metric_values, run_metrics
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData, load_bundle
from tracekit.simulate.model import Model, load_model, parse_model
from tracekit.simulate.predict import predict
from tracekit.vhost.runner import GT_BUNDLE_DIR, SIM_SOURCE

PIECES = range(1, 7)
WINDOWS = (4, 6, 8)
BEFORE = ("max", "p99", "p99.9", "mean")  # the metrics of the first output
METRICS = (*BEFORE, "top10")


def bundle_model(data: BundleData, label: str, given: Path | None = None) -> Model:
    """The model the bundle was made under: the copy it carries, `given` or the shipped
    one of that name, whichever has the bundle's hash (a model changed since is not it)."""
    copies = [data.path / GT_BUNDLE_DIR / SIM_SOURCE, given]
    models = [parse_model(c.read_text(), str(c)) for c in copies if c and c.is_file()]
    for model in [*models, load_model(label.split("@")[0])]:
        if model.label == label:
            return model
    raise TracekitError(f"{data.path}: made under {label}, and no copy of that model is here")


def null_runs(data: BundleData, given: Path | None = None) -> list[np.ndarray]:
    """The bundle's quiet runs in run order; refused unless its model predicts absent."""
    condition = bundle_condition(data.manifest)
    if condition.simulated == "none":
        raise TracekitError(f"{data.path}: not a simulated bundle")
    model = bundle_model(data, condition.simulated, given)
    said = predict(model, condition)
    if said.verdict != "absent":
        raise TracekitError(f"{data.path}: {model.name} predicts {said.verdict} here, not absent")
    quiet = data.latencies.filter(pl.col("kind") == "quiet")
    order = [r.run_id for r in data.manifest.runs if r.kind == "quiet"]
    return [
        quiet.filter(pl.col("run_id") == run_id)["latency_ns"].to_numpy()
        for run_id in order
        if run_id in set(quiet["run_id"])
    ]


def pseudo_metrics(runs: list[np.ndarray], k: int) -> dict[str, list[float]]:
    """Each run cut into k pieces, in order: every metric's value per piece."""
    pieces = [piece for run in runs for piece in np.array_split(run, k) if piece.size]
    frame = pl.DataFrame(
        {
            "run_id": np.repeat(np.arange(len(pieces)), [p.size for p in pieces]),
            "latency_ns": np.concatenate(pieces),
        }
    )
    per_run = run_metrics(frame, tail=True)  # sorted by piece number: run order kept
    return {metric: metric_values(per_run, metric) for metric in METRICS}


def comparisons(runs: list[np.ndarray]) -> dict[str, tuple[int, int]]:
    """Per metric (comparisons, present verdicts) over every pieces x window."""
    counts = dict.fromkeys(METRICS, (0, 0))
    for k in PIECES:
        values = pseudo_metrics(runs, k)
        for n in WINDOWS:
            for start in range(len(values["max"]) - 2 * n + 1):
                for metric, v in values.items():
                    c = compare(v[start : start + n], v[start + n : start + 2 * n], metric)
                    total, present = counts[metric]
                    counts[metric] = (total + 1, present + (c.verdict == PRESENT))
    return counts


def run_shape(data: BundleData) -> str:
    """'4+4': the bundle's quiet runs before + after (the rate grows as they get fewer)."""
    quiet = [r.phase for r in data.manifest.runs if r.kind == "quiet"]
    return f"{quiet.count('before')}+{quiet.count('after')}"


def _rate(total: int, present: int) -> str:
    """'P present in N (R%)'."""
    return f"{present} present in {total} ({present / total if total else float('nan'):.1%})"


def main() -> int:
    """Print per bundle and in all: comparisons, present, rate."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model TOML for bundles without a copy")
    parser.add_argument("bundles", nargs="+", type=Path)
    args = parser.parse_args()
    sums = dict.fromkeys(METRICS, (0, 0))
    shapes: dict[str, tuple[int, int]] = {}  # run shape -> over BEFORE's metrics
    try:
        for path in args.bundles:
            data = load_bundle(path)
            counts = comparisons(null_runs(data, args.model))
            label = bundle_condition(data.manifest).simulated
            each = ", ".join(f"{m} {p}/{n}" for m, (n, p) in counts.items())
            print(f"{path}: {label}: {each}")
            sums = {m: (sums[m][0] + n, sums[m][1] + p) for m, (n, p) in counts.items()}
            n, p = shapes.get(run_shape(data), (0, 0))
            n += sum(counts[m][0] for m in BEFORE)
            shapes[run_shape(data)] = (n, p + sum(counts[m][1] for m in BEFORE))
    except TracekitError as err:
        print(f"simulate_null_fpr: {err}", file=sys.stderr)
        return 2
    for metric, (n, p) in sums.items():
        print(f"{metric}: {_rate(n, p)} null comparisons")
    before = [sums[m] for m in BEFORE]
    total, present = sum(n for n, _ in before), sum(p for _, p in before)
    print(f"all of {', '.join(BEFORE)}: {_rate(total, present)} null comparisons")
    for shape, (n, p) in sorted(shapes.items()):
        # tracekit.analysis.compare.NULL_SAVED states these with the verdict rule.
        print(f"{shape} bundles {p}/{n} ({p / n:.1%}) over {', '.join(BEFORE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
