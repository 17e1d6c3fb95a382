#!/usr/bin/env python3
"""The verdict rule's false-positive rate on simulated runs where the model injected nothing.

Which bundles: made in the emulated host under a simulated mechanism (any model), whose
quiet runs the plugin's log shows nothing injected into: the log (the bundle's
groundtruth/vhost-simulate.txt, or --log) creates no state at all (the null model, or
an MMU-off boot), or every quiet run lies outside every window in which any CPU held the
state, each window widened by the model's responder window and cap (a payment for a
completion inside it can come that much later). The runs are placed by the bundle's
ground-truth rows (QEMU's host clock, the log's). Other bundles are left out, with the
reason; the model is the one the bundle carries (hash checked) or --model's.

Two rates, on two designs:
- the test's real design (what tests/test_simulate_vhost.py's verdicts rest on): each
  bundle with at least 4 + 4 quiet runs gives one comparison, its last 4 before runs
  against its first 4 after runs, on p99.9, by the verdict rule as it stands; the rate
  of "present" with an exact (Clopper-Pearson) 95% interval. Bundles of one boot share
  its drift, so even this counts boots' cells, not independent draws.
- pseudo-run windows, as tests/test_analysis_fpr.py: each bundle's quiet runs, in run
  order, cut into k contiguous pieces (k = 1..6), every window of n pseudo-runs compared
  with the next n (n = 4, 6, 8) for max, p99, p99.9, mean and top10. Windows overlap and
  share their runs, so the 95% interval is a bootstrap over bundles (the unit), not over
  windows. This is the rule on this machine's drift, not the test's design.

The smallest shift detected (issue 18's review): per 4 + 4 null set not already
"present", the smallest effect added to every after run's p99.9 (in ms, and as a factor)
that the rule calls "present" on these data: what a passing boot's effect had to beat.
`--recorded LABEL=B1,B2,B3,B4/A1,A2,A3,A4` adds a null 4 + 4 set by its per-run p99.9 in
ms (e.g. a boot account in docs/simulate.md whose bundles are gone) to the real-design
count and the shift figure, marked as recorded; `LABEL=VERDICT` one whose values were not
recorded. Emulated timings.

    python3 benchmarks/simulate_null_fpr.py [--model TOML] [--log LOG] [--recorded ...] BUNDLE...
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from tracekit.analysis.compare import ABSENT, INCONCLUSIVE, PRESENT, compare
from tracekit.analysis.conditions import bundle_condition
from tracekit.analysis.runs import metric_values, run_metrics
from tracekit.bundle import RunKind
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData, load_bundle
from tracekit.simulate.expected import OPEN, paying_windows
from tracekit.simulate.model import Model, load_model, parse_model
from tracekit.simulate.predict import VERDICT_METRIC
from tracekit.simulate.simlog import SimLog, read_sim_log
from tracekit.vhost.runner import GT_BUNDLE_DIR, SIM_LOG, SIM_SOURCE

PIECES = range(1, 7)
WINDOWS = (4, 6, 8)
BEFORE = ("max", "p99", "p99.9", "mean")  # the metrics of the first output
METRICS = (*BEFORE, "top10")
DESIGN = 4  # the sim test's runs per phase
RESAMPLES, SEED = 10_000, 7
MS = 1e6


@dataclass(frozen=True)
class NullSet:
    """One bundle's (or one recorded account's) null runs."""

    label: str
    runs: list[np.ndarray]  # each quiet run's latencies (ns), in run order; [] if recorded
    before: int  # quiet runs before the guest
    design: tuple[list[float], list[float]] | None  # the 4 + 4 p99.9 values, when it has them
    verdict: str | None = None  # a recorded 4 + 4 verdict whose values were not recorded


def bundle_model(data: BundleData, label: str, given: Path | None = None) -> Model:
    """The model the bundle was made under: the copy it carries, `given` or the shipped
    one of that name, whichever has the bundle's hash (a model changed since is not it)."""
    copies = [data.path / GT_BUNDLE_DIR / SIM_SOURCE, given]
    models = [parse_model(c.read_text(), str(c)) for c in copies if c and c.is_file()]
    for model in [*models, load_model(label.split("@")[0])]:
        if model.label == label:
            return model
    raise TracekitError(f"{data.path}: made under {label}, and no copy of that model is here")


def injected_windows(log: SimLog, model: Model) -> list[tuple[int, int]]:
    """[start, end) on the log's clock in which any CPU may have been delayed: while any
    CPU held the state, widened by what a responder may still pay after it."""
    margin = model.window_ns + model.cap_ns if model.on != "issuer" else 0
    spans = paying_windows(log.events, len(log.vcpus), True).values()
    held = {span for each in spans for span in each}
    return [(lo, hi if hi == OPEN else hi + margin) for lo, hi in sorted(held)]


def quiet_spans(data: BundleData) -> dict[str, tuple[int, int]]:
    """Each quiet run's first and last ground-truth record (QEMU's host clock)."""
    try:
        found = data.ground_truth()
    except TracekitError as err:  # a boot that timed out: the log but no ground truth
        raise TracekitError(f"no ground truth, so its runs cannot be placed ({err})") from None
    if found is None:
        raise TracekitError(f"{data.path}: no ground truth, so its runs cannot be placed")
    quiet = [r.run_id for r in data.manifest.runs if r.kind == RunKind.QUIET]
    spans = (
        found[1]
        .filter(pl.col("run_id").is_in(quiet))
        .group_by("run_id")
        .agg(lo=pl.col("ts_host").min(), hi=pl.col("ts_host").max())
    )
    return {run: (int(lo), int(hi)) for run, lo, hi in spans.iter_rows()}


def nothing_injected(data: BundleData, model: Model, log: SimLog) -> str | None:
    """None when the log shows nothing injected into the bundle's quiet runs; else why not."""
    if not log.complete:
        return "its simulation log is incomplete"
    windows = injected_windows(log, model)
    if not windows:
        return None
    hit = [
        run
        for run, (lo, hi) in sorted(quiet_spans(data).items())
        if any(lo < end and start < hi for start, end in windows)
    ]
    return f"quiet runs {', '.join(hit)} lie in a window the state held" if hit else None


def null_set(data: BundleData, model_file: Path | None, log_file: Path | None) -> NullSet:
    """The bundle's quiet runs, if its log shows nothing injected into them."""
    label = bundle_condition(data.manifest).simulated
    if label == "none":
        raise TracekitError(f"{data.path}: not a simulated bundle")
    model = bundle_model(data, label, model_file)
    log_path = data.path / GT_BUNDLE_DIR / SIM_LOG
    log = read_sim_log(log_path if log_path.is_file() else log_file or log_path)
    if log.model != label:
        raise TracekitError(f"{data.path}: its log ran {log.model}, the bundle says {label}")
    why = nothing_injected(data, model, log)
    if why:
        raise TracekitError(f"{data.path}: left out: {why}")
    quiet = data.latencies.filter(pl.col("kind") == RunKind.QUIET.value)
    order = [r for r in data.manifest.runs if r.kind == RunKind.QUIET]
    present = set(quiet["run_id"])
    runs = [
        quiet.filter(pl.col("run_id") == r.run_id)["latency_ns"].to_numpy()
        for r in order
        if r.run_id in present
    ]
    before = sum(1 for r in order if r.run_id in present and r.phase == "before")
    return NullSet(str(data.path), runs, before, _design(runs, before))


def _design(runs: list[np.ndarray], before: int) -> tuple[list[float], list[float]] | None:
    """The test's design: the last 4 before and the first 4 after runs' p99.9."""
    if before < DESIGN or len(runs) - before < DESIGN:
        return None
    chosen = runs[before - DESIGN : before + DESIGN]
    frame = pl.DataFrame(
        {
            "run_id": np.repeat(np.arange(len(chosen)), [r.size for r in chosen]),
            "latency_ns": np.concatenate(chosen),
        }
    )
    values = metric_values(run_metrics(frame), VERDICT_METRIC)
    return values[:DESIGN], values[DESIGN:]


def recorded_set(text: str) -> NullSet:
    """LABEL=B1,B2,B3,B4/A1,A2,A3,A4 (per-run p99.9 in ms), or LABEL=VERDICT (only the
    verdict was recorded), as a recorded null 4 + 4 set."""
    label, _, values = text.partition("=")
    if values in (PRESENT, ABSENT, INCONCLUSIVE) and label:
        return NullSet(f"recorded {label}", [], DESIGN, None, values)
    before, _, after = values.partition("/")
    try:
        b = [float(v) * MS for v in before.split(",")]
        a = [float(v) * MS for v in after.split(",")]
    except ValueError:
        raise TracekitError(f"--recorded {text!r}: write LABEL=B1,...,B4/A1,...,A4 in ms") from None
    if len(b) != DESIGN or len(a) != DESIGN or not label:
        raise TracekitError(f"--recorded {text!r}: a label and {DESIGN} + {DESIGN} values")
    return NullSet(f"recorded {label}", [], DESIGN, (b, a))


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


def clopper_pearson(present: int, total: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval of present/total."""
    tail = (1 - level) / 2

    def cdf(k: int, p: float) -> float:
        return sum(math.comb(total, i) * p**i * (1 - p) ** (total - i) for i in range(k + 1))

    def solve(target: float, k: int) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):  # P(X <= k) falls as p grows
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if cdf(k, mid) > target else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if present == 0 else solve(1 - tail, present - 1)
    high = 1.0 if present == total else solve(tail, present)
    return low, high


def bundle_bootstrap(counts: list[tuple[int, int]]) -> tuple[float, float]:
    """95% percentile interval of the pooled rate, resampling bundles (the unit)."""
    arr = np.array(counts, dtype=float)  # (comparisons, present) per bundle
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, len(arr), (RESAMPLES, len(arr)))
    rates = arr[picks, 1].sum(axis=1) / arr[picks, 0].sum(axis=1)
    low, high = np.percentile(rates, [2.5, 97.5])
    return float(low), float(high)


def smallest_effect(before: list[float], after: list[float], added: bool) -> float:
    """The smallest shift (ns, added) or factor (multiplied) of every after run that the
    rule calls present: bisection, the verdict being monotone in the effect."""

    def present(x: float) -> bool:
        shifted = [v + x if added else v * x for v in after]
        return compare(before, shifted, VERDICT_METRIC).verdict == PRESENT

    lo, hi = (0.0, 1e6) if added else (1.0, 2.0)
    while not present(hi):
        hi *= 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if present(mid) else (mid, hi)
    return hi


def _rate(total: int, present: int) -> str:
    """'P present in N (R%)'."""
    return f"{present} present in {total} ({present / total if total else float('nan'):.1%})"


def _interval(low: float, high: float) -> str:
    """'95% CI 0.3-44.5%'."""
    return f"95% CI {low:.1%}-{high:.1%}"


def report_design(sets: list[NullSet]) -> None:
    """The test's design: one 4 + 4 p99.9 comparison per null set that has it; power."""
    designed = [s for s in sets if s.design or s.verdict]
    print(f"real design ({DESIGN}+{DESIGN} runs, {VERDICT_METRIC}, last before vs first after):")
    present, shifts = 0, []
    for s in designed:
        if s.design is None:
            present += s.verdict == PRESENT
            print(f"  {s.label}: {s.verdict} (the verdict recorded; no values)")
            continue
        b, a = s.design
        c = compare(b, a, VERDICT_METRIC)
        present += c.verdict == PRESENT
        values = " ".join(f"{v / MS:.1f}" for v in b) + " / " + " ".join(f"{v / MS:.1f}" for v in a)
        if c.verdict == PRESENT:  # a false positive: no shift is needed, none is counted
            print(f"  {s.label}: {values} ms: {c.ratio:.2f}x p={c.p_value:.3f} {c.verdict}")
            continue
        shifts.append(smallest_effect(b, a, added=True) / MS)
        factor = smallest_effect(b, a, added=False)
        print(
            f"  {s.label}: {values} ms: {c.ratio:.2f}x p={c.p_value:.3f} {c.verdict};"
            f" present from +{shifts[-1]:.1f} ms or x{factor:.2f} on every after run"
        )
    if not designed:
        print(f"  none: no null set with {DESIGN}+{DESIGN} quiet runs")
        return
    ci = _interval(*clopper_pearson(present, len(designed)))
    print(f"  rate: {_rate(len(designed), present)}, {ci} (exact)")
    if shifts:
        shifts.sort()
        print(
            f"  smallest shift detected on these data (every after run shifted, the sets"
            f" not already present): over {len(shifts)} sets median"
            f" {float(np.median(shifts)):.1f} ms, largest {shifts[-1]:.1f} ms"
        )


def report_windows(bundles: list[NullSet]) -> None:
    """Pseudo-run windows, per bundle and pooled, with a bootstrap over bundles."""
    windowed = [(s, comparisons(s.runs)) for s in bundles if len(s.runs) >= 2]
    print("pseudo-run windows (overlapping; the rule on this machine's drift):")
    for s, counts in windowed:
        each = ", ".join(f"{m} {p}/{n}" for m, (n, p) in counts.items())
        print(f"  {s.label} ({s.before}+{len(s.runs) - s.before}): {each}")
    if not windowed:
        print("  none")
        return
    for metric in METRICS:
        per = [counts[metric] for _, counts in windowed]
        total, present = sum(n for n, _ in per), sum(p for _, p in per)
        ci = _interval(*bundle_bootstrap(per)) + " over bundles" if len(per) > 1 else ""
        print(f"  {metric}: {_rate(total, present)} {ci}")
    shapes: dict[str, list[tuple[int, int]]] = {}
    for s, counts in windowed:
        shape = f"{s.before}+{len(s.runs) - s.before}"
        shapes.setdefault(shape, []).append(
            (sum(counts[m][0] for m in BEFORE), sum(counts[m][1] for m in BEFORE))
        )
    for shape, per in sorted(shapes.items()):
        total, present = sum(n for n, _ in per), sum(p for _, p in per)
        ci = _interval(*bundle_bootstrap(per)) if len(per) > 1 else "one bundle"
        metrics = ", ".join(BEFORE)
        print(f"  {shape} bundles {present}/{total} ({present / total:.1%}) over {metrics}, {ci}")


def main() -> int:
    """Select the null bundles by their logs; print both rates and the power figure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model TOML for bundles without a copy")
    parser.add_argument("--log", type=Path, help="the boot's log for bundles without a copy")
    parser.add_argument("--recorded", action="append", default=[], help="LABEL=B,B,B,B/A,A,A,A")
    parser.add_argument("bundles", nargs="*", type=Path)
    args = parser.parse_args()
    sets = []
    try:
        recorded = [recorded_set(text) for text in args.recorded]
        for path in args.bundles:
            try:
                sets.append(null_set(load_bundle(path), args.model, args.log))
            except TracekitError as err:
                print(f"left out: {err}")
    except TracekitError as err:
        print(f"simulate_null_fpr: {err}", file=sys.stderr)
        return 2
    print(f"null bundles (nothing injected, by their logs): {len(sets)} of {len(args.bundles)}")
    report_design(sets + recorded)
    report_windows(sets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
