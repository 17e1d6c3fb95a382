"""Before/after comparison: the verdict rule on generated runs (fixed seeds), per-run metrics
and the cyclictest -v -N reader on a real recording."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tracekit.analysis.compare import (
    ABSENT,
    INCONCLUSIVE,
    PRESENT,
    compare,
    compare_all,
    holm,
    min_p_value,
    rank_test,
    runs_needed,
    runs_to_decide,
)
from tracekit.analysis.runs import metric_values, run_metrics
from tracekit.errors import TracekitError
from tracekit.ingest.tools import read_cyclictest_verbose

VERBOSE = Path(__file__).parent / "fixtures" / "ingest" / "tools" / "cyclictest-verbose.txt"
NULL_COMPARISONS = 1000
RUNS = 8


def _heavy_tailed_runs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Per-run p99.9-like values: a lognormal body with a Pareto tail (rare huge runs)."""
    body = rng.lognormal(mean=10.0, sigma=0.4, size=n)
    return body * (1.0 + rng.pareto(1.5, size=n))


def test_false_positive_rate_on_null_comparisons() -> None:
    """Both phases from one heavy-tailed distribution: "present" in at most 5 % of them."""
    rng = np.random.default_rng(2026)
    verdicts = []
    rank_rejections = 0
    for _ in range(NULL_COMPARISONS):
        pooled = _heavy_tailed_runs(rng, 2 * RUNS)
        c = compare(list(pooled[:RUNS]), list(pooled[RUNS:]), "p99.9")
        verdicts.append(c.verdict)
        rank_rejections += c.p_value < c.thresholds.alpha
    rate = verdicts.count(PRESENT) / NULL_COMPARISONS
    print(f"false-positive rate: {rate:.3f} over {NULL_COMPARISONS} null comparisons, 8+8 runs")
    assert rate <= 0.05
    assert rank_rejections / NULL_COMPARISONS <= 0.05  # the exact test alone keeps its level


def _p999_runs(rng: np.random.Generator, n: int, scale: float = 1.0) -> list[float]:
    """Per-run p99.9 of 2000 heavy-tailed latency samples per run, via run_metrics()."""
    samples = rng.lognormal(10.0, 0.3, (n, 2000)) * (1.0 + rng.pareto(3.0, (n, 2000))) * scale
    frame = pl.DataFrame({"run_id": np.repeat(np.arange(n), 2000), "latency_ns": samples.ravel()})
    return metric_values(run_metrics(frame), "p99.9")


def test_doubled_runs_are_present_and_ci_holds_two() -> None:
    """after = before x 2 with 8 runs each: "present", and the interval contains 2."""
    rng = np.random.default_rng(11)
    c = compare(_p999_runs(rng, RUNS), _p999_runs(rng, RUNS, scale=2.0), "cyclictest p99.9")
    assert c.verdict == PRESENT
    assert c.ci_low <= 2.0 <= c.ci_high
    assert c.test == "exact rank test" and c.needed_runs is None


def test_doubling_power_and_coverage_over_repeats() -> None:
    """Not one lucky seed: x2 is found in >= 90 % of 100 repeats, CI holds 2 in >= 85 %."""
    rng = np.random.default_rng(12)
    results = [
        compare(_p999_runs(rng, RUNS), _p999_runs(rng, RUNS, scale=2.0), "p99.9")
        for _ in range(100)
    ]
    power = sum(c.verdict == PRESENT for c in results) / len(results)
    coverage = sum(c.ci_low <= 2.0 <= c.ci_high for c in results) / len(results)
    print(f"x2 effect, 8+8 runs: present in {power:.2f}, CI holds 2 in {coverage:.2f}")
    assert power >= 0.90
    assert coverage >= 0.85  # percentile bootstrap on 8 runs covers a little under 95 %


def test_two_runs_each_is_inconclusive_with_runs_needed() -> None:
    """With 2+2 runs the rank test can never reach p < 0.05: say how many runs are needed."""
    c = compare([100.0, 110.0], [300.0, 320.0], "cyclictest max")
    assert c.verdict == INCONCLUSIVE
    assert c.needed_runs == 4 == runs_needed(0.05)
    assert min_p_value(3) >= 0.05 > min_p_value(4)
    assert "needs 4+4 runs" in c.describe()


def test_runs_with_lost_events_are_excluded_and_listed() -> None:
    """A run with lost events is left out of the numbers and named in the result."""
    before = [100.0, 101.0, 99.0, 102.0, 98.0]
    after = [100.0, 5000.0, 101.0, 99.0, 100.0]
    c = compare(
        before, after, "p99", after_lost=[0, 37, 0, 0, 0], after_runs=["r0", "r1", "r2", "r3", "r4"]
    )
    assert (c.n_before, c.n_after) == (5, 4)
    assert [(e.phase, e.run, e.lost) for e in c.excluded] == [("after", "r1", 37)]
    assert c.ratio == pytest.approx(np.mean([100, 101, 99, 100]) / np.mean(before))
    assert "after r1 (37 lost)" in c.describe()


def test_same_values_are_absent() -> None:
    """Runs that agree within 2 %: the interval sits inside the equivalence band."""
    rng = np.random.default_rng(5)
    base = rng.normal(1000.0, 10.0, size=2 * RUNS)
    c = compare(list(base[:RUNS]), list(base[RUNS:]), "mean")
    assert c.verdict == ABSENT


def test_holm_changes_a_borderline_secondary() -> None:
    """p=0.048 alone is "present"; as one of two secondaries Holm doubles it: inconclusive."""
    before = [56.0, 66.0, 81.0, 117.0, 127.0, 129.0, 130.0, 146.0]
    after = [93.0, 118.0, 125.0, 181.0, 205.0, 220.0, 220.0, 229.0]
    borderline = compare(before, after, "p99")
    assert 0.025 < borderline.p_value < 0.05 and borderline.verdict == PRESENT
    primary = compare(before, [x * 3 for x in before], "p99.9")
    unrelated = compare(before, list(reversed(before)), "mean")
    results = compare_all([primary, borderline, unrelated], primary="p99.9")
    by_name = {c.metric: c for c in results}
    assert by_name["p99.9"].role == "primary" and by_name["p99.9"].p_adjusted == primary.p_value
    assert by_name["p99"].p_adjusted == pytest.approx(2 * borderline.p_value)
    assert by_name["p99"].verdict == INCONCLUSIVE
    assert "p(Holm)=" in by_name["p99"].describe()


def test_holm_adjustment_values() -> None:
    """Holm step-down: sorted p times (m - rank), made monotone, capped at 1."""
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_compare_all_needs_the_primary_once() -> None:
    """A primary metric that is not among the comparisons is a user error."""
    c = compare([1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.0], "p99")
    with pytest.raises(TracekitError, match=r"primary metric 'p99\.9'"):
        compare_all([c], primary="p99.9")


def test_exact_rank_test_separated_and_tied() -> None:
    """4 vs 4 fully separated: p = 2/C(8,4); all values equal: p = 1."""
    p, name = rank_test(np.array([1.0, 2, 3, 4]), np.array([5.0, 6, 7, 8]))
    assert p == pytest.approx(2 / 70) and name == "exact rank test"
    p_tied, _ = rank_test(np.array([3.0, 3, 3]), np.array([3.0, 3, 3]))
    assert p_tied == 1.0


def test_large_phases_use_seeded_permutations() -> None:
    """15+15 runs is past the exact limit: Monte Carlo, reproducible, p never 0."""
    before, after = np.arange(15.0), np.arange(15.0) + 100
    p1, name = rank_test(before, after)
    p2, _ = rank_test(before, after)
    assert name.startswith("permutation rank test") and p1 == p2
    assert 0 < p1 < 0.001


def test_describe_names_the_groups_it_divides() -> None:
    """A during-phase comparison never reads as after/before."""
    during = compare([10.0] * 4, [12.0] * 4, "cyclictest p99", ratio_label="during/before")
    assert during.describe().startswith("cyclictest p99 during/before 1.20x")
    named = compare([10.0] * 4, [12.0] * 4, "during/before cyclictest p99", ratio_label="")
    assert named.describe().startswith("during/before cyclictest p99 1.20x")


def test_describe_fits_72_columns() -> None:
    """Every line of describe() fits in a mail reply, with a long name and exclusions."""
    rng = np.random.default_rng(3)
    c = compare(
        list(_heavy_tailed_runs(rng, RUNS)),
        list(_heavy_tailed_runs(rng, RUNS) * 1.8),
        "cyclictest p99.9 (rt CPU 3, quiet runs)",
        before_lost=[0, 0, 0, 4, 0, 0, 0, 0],
    )
    text = c.describe()
    assert text.startswith("cyclictest p99.9 (rt CPU 3, quiet runs) after/before")
    assert all(len(line) <= 72 for line in text.splitlines())
    assert text.endswith("(4 lost)")
    assert "CI beyond x1.1 and p < 0.05" in c.thresholds.rule()  # the report states it


@pytest.mark.parametrize(
    ("before", "after", "lost", "message"),
    [
        ([], [1.0], None, "no before runs"),
        ([1.0], [float("nan")], None, "NaN"),
        ([0.0, 0.0], [1.0, 2.0], None, "no ratio"),
        ([1.0, 2.0], [1.0], [0], "2 values but 1 lost counts"),
        ([1.0], [1.0], [3], "no before runs without lost events"),
    ],
)
def test_bad_input_is_one_clear_error(
    before: list[float], after: list[float], lost: list[int] | None, message: str
) -> None:
    """Empty, non-finite, zero-mean or mismatched input: a TracekitError, not a traceback."""
    with pytest.raises(TracekitError, match=message):
        compare(before, after, "p99", before_lost=lost)


def test_cyclictest_verbose_reader_matches_its_summary() -> None:
    """Every `thread: cycle: latency` line is a row; min/max equal cyclictest's own T: line."""
    df = read_cyclictest_verbose(VERBOSE)
    lines = VERBOSE.read_text().splitlines()
    summary = next(line for line in lines if line.startswith("T:"))
    assert df.schema == {"thread": pl.Int32, "cycle": pl.Int64, "latency_ns": pl.Int64}
    assert df.height == sum(line.count(":") == 2 and line[:1] == " " for line in lines)
    assert df["cycle"].to_list() == list(range(df.height))
    assert df["latency_ns"].min() == int(summary.split("Min:")[1].split()[0])
    assert df["latency_ns"].max() == int(summary.split("Max:")[1].split()[0])


def test_cyclictest_verbose_reader_refuses_other_lines(tmp_path: Path) -> None:
    """A line that is neither a sample nor a known header stops the reader, naming it."""
    bad = tmp_path / "v.txt"
    bad.write_text("Thread 0 Interval: 1500\n       0:       0:   42325\nWARN: oops\n")
    with pytest.raises(TracekitError, match="line 3"):
        read_cyclictest_verbose(bad)
    (tmp_path / "e.txt").write_text("Thread 0 Interval: 1500\n")
    with pytest.raises(TracekitError, match="-v -N"):
        read_cyclictest_verbose(tmp_path / "e.txt")


def test_run_metrics_on_real_samples() -> None:
    """The recording cut into 4 runs: per-run counts, maxima and percentiles agree with numpy."""
    df = read_cyclictest_verbose(VERBOSE).with_columns((pl.col("cycle") // 500).alias("run_id"))
    per_run = run_metrics(df)
    assert per_run["run_id"].to_list() == [0, 1, 2, 3]
    assert per_run["samples"].sum() == df.height
    for run, group in df.group_by("run_id"):
        row = per_run.filter(pl.col("run_id") == run[0]).row(0, named=True)
        values = group["latency_ns"].to_numpy()
        assert row["max_ns"] == values.max()
        assert row["mean_ns"] == pytest.approx(values.mean())
        assert row["p99_ns"] == np.percentile(values, 99, method="higher")
    assert metric_values(per_run, "max") == [float(x) for x in per_run["max_ns"]]


def test_run_metrics_refuses_missing_columns_and_nulls() -> None:
    """No run column, null values or an unknown metric: one clear error each."""
    with pytest.raises(TracekitError, match="no column run_id"):
        run_metrics(pl.DataFrame({"latency_ns": [1, 2]}))
    with pytest.raises(TracekitError, match="1 samples have no"):
        run_metrics(pl.DataFrame({"run_id": [1, 1], "latency_ns": [1, None]}))
    with pytest.raises(TracekitError, match="unknown metric"):
        metric_values(pl.DataFrame({"max_ns": [1.0]}), "p50")


def test_one_run_per_phase_has_no_interval() -> None:
    """1+1 runs: the bootstrap can only give the point back; the interval is n/a."""
    one = compare([10.0], [15.8], "p99")
    assert one.interval() == "n/a" and "[1.58, 1.58]" not in one.describe()
    assert "1.58x n/a" in one.describe()
    assert one.verdict == INCONCLUSIVE and runs_to_decide(one) == one.needed_runs == 4
    lopsided = compare([10.0], [15.0, 16.0, 17.0], "p99")
    assert lopsided.interval() == "n/a"
    two = compare([10.0, 11.0], [15.0, 16.0], "p99")
    assert two.interval().startswith("[") and two.ci_low < two.ci_high
