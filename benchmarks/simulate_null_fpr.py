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
fixture: neighbouring windows keep the host's drift. Prints the comparisons, the
"present" verdicts and the rate, per bundle and in all. Emulated timings.

    python3 benchmarks/simulate_null_fpr.py BUNDLE [BUNDLE...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import polars as pl

from tracekit.analysis.compare import PRESENT, compare
from tracekit.analysis.conditions import bundle_condition
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData, load_bundle
from tracekit.simulate.model import Model, load_model, parse_model
from tracekit.simulate.predict import predict
from tracekit.vhost.runner import GT_BUNDLE_DIR, SIM_SOURCE

PIECES = range(1, 7)
WINDOWS = (4, 6, 8)
METRICS = ("max", "p99", "p99.9", "mean")


def _value(samples: np.ndarray, metric: str) -> float:
    """One pseudo-run's metric (quantiles 'higher', as tracekit.analysis.runs)."""
    if metric == "max":
        return float(samples.max())
    if metric == "mean":
        return float(samples.mean())
    return float(np.quantile(samples, {"p99": 0.99, "p99.9": 0.999}[metric], method="higher"))


def bundle_model(data: BundleData, label: str) -> Model:
    """The model the bundle was made under: the copy it carries, else the shipped one of
    that name; either way its hash must be the bundle's (a model changed since is not it)."""
    copy = data.path / GT_BUNDLE_DIR / SIM_SOURCE
    name = label.split("@")[0]
    model = parse_model(copy.read_text(), str(copy)) if copy.is_file() else load_model(name)
    if model.label != label:
        raise TracekitError(f"{data.path}: made under {label}, and no copy of that model is here")
    return model


def null_runs(data: BundleData) -> list[np.ndarray]:
    """The bundle's quiet runs in run order; refused unless its model predicts absent."""
    condition = bundle_condition(data.manifest)
    if condition.simulated == "none":
        raise TracekitError(f"{data.path}: not a simulated bundle")
    model = bundle_model(data, condition.simulated)
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


def comparisons(runs: list[np.ndarray]) -> tuple[int, int]:
    """(comparisons, present verdicts) over every pieces x window x metric."""
    total = present = 0
    for k in PIECES:
        pseudo = [piece for run in runs for piece in np.array_split(run, k) if piece.size]
        for n in WINDOWS:
            for start in range(len(pseudo) - 2 * n + 1):
                first, second = pseudo[start : start + n], pseudo[start + n : start + 2 * n]
                for metric in METRICS:
                    c = compare(
                        [_value(x, metric) for x in first],
                        [_value(x, metric) for x in second],
                        metric,
                    )
                    total += 1
                    present += c.verdict == PRESENT
    return total, present


def main() -> int:
    """Print per bundle and in all: comparisons, present, rate."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs="+", type=Path)
    args = parser.parse_args()
    total = present = 0
    try:
        for path in args.bundles:
            data = load_bundle(path)
            n, p = comparisons(null_runs(data))
            print(f"{path}: {bundle_condition(data.manifest).simulated}: {p} present in {n}")
            total, present = total + n, present + p
    except TracekitError as err:
        print(f"simulate_null_fpr: {err}", file=sys.stderr)
        return 2
    rate = present / total if total else float("nan")
    print(f"all: {present} present in {total} null comparisons ({rate:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
