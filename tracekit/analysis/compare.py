"""Before/after comparison of one metric, with the run as the unit of replication.

Each phase gives one value per run (a run's p99.9, its maximum, its mean, a probe
percentile...). The comparison reports the ratio of the phase means after/before, a
percentile-bootstrap confidence interval for it (runs are resampled, never samples; a
maximum is compared as the per-run maxima), a two-sided Mann-Whitney rank test (exact
permutation distribution for small phases, seeded Monte Carlo above EXACT_LIMIT) and a
verdict by the rule in `Thresholds`, whose values the report states.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import combinations

import numpy as np

from tracekit.errors import TracekitError

PRESENT, ABSENT, INCONCLUSIVE = "present", "absent", "inconclusive"
# Above this many ways to split the pooled runs, the rank test samples permutations.
EXACT_LIMIT = 200_000
PERMUTATIONS = 20_000
# Float midranks: statistics this close count as equally extreme.
RANK_TOLERANCE = 1e-9
DESCRIBE_WIDTH = 72
# Runs a phase needs before the bootstrap can estimate any spread between runs.
MIN_SPREAD_RUNS = 2
# Standard normal quantiles for units_for_ratio's sample size (two-sided 5%, 80%/90% power).
NORMAL_QUANTILES = {0.975: 1.959964, 0.8: 0.841621, 0.9: 1.281552}
# The verdict rule's false-positive rate at the default thresholds, measured by
# tests/test_analysis_fpr.py on null comparisons built from real emulated runs (an MMU-off
# guest, runs split into pseudo-runs, neighbouring windows compared); that test recomputes
# these two numbers and fails if they drift.
NULL_COMPARISONS = 756
NULL_PRESENT = 4
# The same method on saved bundles of boots under the null model (nothing injected):
# benchmarks/simulate_null_fpr.py, its result file benchmarks/results/simulate_null_fpr.txt
# (tests/test_analysis_fpr.py checks these against it). Pseudo-runs cut from 4+4 and from
# 1+1 quiet runs: (present, comparisons). Fewer real runs, more of the host's drift.
# Session 10's output, its bundles chosen by "the model predicts absent".
NULL_SAVED = {"4+4": (279, 7584), "1+1": (63, 240)}
# The test's own design on those boots (benchmarks/results/simulate_null_fpr.txt, "real
# design"): one 4+4 comparison per control cell with nothing injected, (present, cells).
# The sim test's claims rest on this one; the windows above reuse runs and share drift.
# Cells of 5 boots, 2 each: not independent draws. Its exact 95% interval, in percent.
NULL_DESIGN = (1, 10)
NULL_DESIGN_CI = (0.3, 44.5)


@dataclass(frozen=True)
class Thresholds:
    """The verdict rule's numbers; every one is stated in the report."""

    alpha: float = 0.05  # rank test level (after Holm for secondary metrics)
    confidence: float = 0.95  # bootstrap interval coverage
    min_effect: float = 1.10  # "present": the interval lies beyond x1.10 (or below 1/1.10)
    equivalence: float = 1.10  # "absent": the interval lies inside [1/1.10, 1.10]
    resamples: int = 10_000  # bootstrap resamples of the runs of each phase
    seed: int = 7  # bootstrap and Monte Carlo permutations are reproducible

    def rule(self) -> str:
        """The verdict rule as one sentence."""
        return (
            f"present: CI beyond x{self.min_effect:g} and p < {self.alpha:g}; absent: CI"
            f" inside [1/{self.equivalence:g}, {self.equivalence:g}]; else inconclusive"
            f" ({self.confidence:.0%} percentile bootstrap over runs, {self.resamples} resamples)"
            + (_false_positive_text() if self == DEFAULT_THRESHOLDS else "")
        )


def _false_positive_text() -> str:
    """The measured false-positive rates, stated with the rule they belong to: each set of
    null runs its own, since the rate grows as the real runs behind them get fewer."""
    sets = [("8+8", (NULL_PRESENT, NULL_COMPARISONS)), *NULL_SAVED.items()]
    runs = ", ".join(runs for runs, _ in sets)
    rates = ", ".join(_rate(*counts) for _, counts in sets)
    low, high = NULL_DESIGN_CI
    real = f"{NULL_DESIGN[0]}/{NULL_DESIGN[1]} real 4+4 controls (95% CI {low:g}-{high:g}%)"
    return f"; false present on null emulated runs: {real}, {rates} of windows of {runs} runs"


def _rate(present: int, comparisons: int) -> str:
    """'3.7% (279/7584)'."""
    share = present / comparisons
    digits = 1 if share < 0.1 else 0  # 0.5%, 3.4%, 12%, 26%
    return f"{share:.{digits}%} ({present}/{comparisons})"


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Excluded:
    """A run left out of the comparison because its trace lost events."""

    phase: str  # "before" or "after"
    run: str  # the caller's label, or the run's index in its phase
    lost: int


@dataclass(frozen=True)
class Comparison:
    """One metric before/after: effect, interval, rank test and verdict."""

    metric: str
    n_before: int
    n_after: int
    ratio: float  # mean(after) / mean(before)
    ci_low: float
    ci_high: float
    p_value: float  # two-sided rank test, uncorrected
    p_adjusted: float  # Holm-adjusted for secondary metrics; equals p_value otherwise
    test: str  # "exact rank test" or "permutation rank test (N perms)"
    verdict: str
    needed_runs: int | None  # runs per phase the rule needs to reach "present", when short
    excluded: tuple[Excluded, ...] = ()
    role: str = "primary"
    thresholds: Thresholds = field(default=DEFAULT_THRESHOLDS)
    # What the ratio divides, for describe(); "" when the metric's name already says it.
    ratio_label: str = "after/before"
    # The groups' sizes as said; "" is "B+A runs" (two groups of runs, not one run in both).
    runs_said: str = ""
    # Why no run count can make this a verdict (then needed_runs is None), e.g. a saturated
    # rt CPU, whose latencies measure its backlog; "" when more runs could.
    no_verdict: str = ""

    def interval(self) -> str:
        """The interval as "[lo, hi]", or "n/a" when one run per phase has no spread."""
        if not (math.isfinite(self.ci_low) and math.isfinite(self.ci_high)):
            return "n/a"
        return f"[{self.ci_low:.2f}, {self.ci_high:.2f}]"

    def brief(self) -> str:
        """One line: ratio, interval, p, runs and verdict (test and runs needed said apart)."""
        return self._line(f", {self._runs()}") + self._excluded_text()

    def terse(self) -> str:
        """Metric, ratio, interval, p and verdict: for a line that says the test, the runs
        and what the ratio divides once for several comparisons."""
        return replace(self, ratio_label="")._line("") + self._excluded_text()

    def describe(self) -> str:
        """A maintainer's summary, wrapped to 72 columns."""
        text = self._line(f" ({self.test}, {self._runs()})")
        if self.needed_runs is not None:
            text += f"; needs {self.needs()} to show an effect"
        if self.no_verdict:
            text += f"; no run count makes this a verdict: {self.no_verdict}"
        return textwrap.fill(text + self._excluded_text(), DESCRIBE_WIDTH, subsequent_indent="  ")

    def needs(self) -> str | None:
        """The runs a verdict needs, said as the groups are ("4+4 runs"); None: enough."""
        if self.needed_runs is None:
            return None
        if self.runs_said:
            return f"{self.needed_runs} runs, each split"
        return f"{self.needed_runs}+{self.needed_runs} runs"

    def _runs(self) -> str:
        """How many runs each group had, as said."""
        return self.runs_said or f"{self.n_before}+{self.n_after} runs"

    def _line(self, runs: str) -> str:
        """Metric, ratio, interval, p, then `runs` (how they are said) and the verdict."""
        p_name = "p" if self.role == "primary" else "p(Holm)"
        return (
            f"{self.metric} {self.ratio_label + ' ' if self.ratio_label else ''}"
            f"{self.ratio:.2f}x {self.interval()},"
            f" {p_name}={_p_text(self.p_adjusted)}{runs}: {self.verdict}"
        )

    def _excluded_text(self) -> str:
        """The runs left out for lost events, or ""."""
        if not self.excluded:
            return ""
        runs = ", ".join(f"{e.phase} {e.run} ({e.lost} lost)" for e in self.excluded)
        return f"; excluded for lost events: {runs}"


def _p_text(p: float) -> str:
    """p-values to three decimals, small ones as '<0.001'."""
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def compare(
    before: list[float],
    after: list[float],
    metric: str,
    *,
    before_lost: list[int] | None = None,
    after_lost: list[int] | None = None,
    before_runs: list[str] | None = None,
    after_runs: list[str] | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    ratio_label: str = "after/before",
) -> Comparison:
    """Compare one metric's per-run values; runs with lost events are excluded and listed.

    "before" and "after" are the two groups; `ratio_label` names them for describe()
    (e.g. "during/before"; "" when `metric` already says what is divided by what).
    """
    b, b_out = _clean_phase("before", before, before_lost, before_runs, metric)
    a, a_out = _clean_phase("after", after, after_lost, after_runs, metric)
    if b.mean() <= 0:
        raise TracekitError(
            f"compare {metric}: the before runs' mean is {b.mean():g}, so after/before has no"
            " ratio; compare a metric that is positive before the change"
        )
    lo, hi = bootstrap_ratio_ci(b, a, thresholds)
    judged = _judged(metric, b, a, float(a.mean() / b.mean()), (lo, hi), thresholds)
    return replace(judged, excluded=b_out + a_out, ratio_label=ratio_label)


def compare_units(
    before: np.ndarray, after: np.ndarray, metric: str, thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> Comparison:
    """Compare one value per unit (a boot) when the units are few: the ratio of geometric
    means, Welch's t interval on the logs (welch_log_ratio_ci), the rank test (none, NaN,
    with one unit a side) and the verdict with the rule's floor."""
    interval = welch_log_ratio_ci(before, after, thresholds.confidence)
    judged = _judged(metric, before, after, geometric_ratio(before, after), interval, thresholds)
    if min(len(before), len(after)) < 2:
        judged = replace(judged, p_value=math.nan, p_adjusted=math.nan, test="none")
    return replace(judged, ratio_label="")


def _judged(
    metric: str,
    b: np.ndarray,
    a: np.ndarray,
    ratio: float,
    interval: tuple[float, float],
    thresholds: Thresholds,
) -> Comparison:
    """The comparison of a ratio and its interval: the rank test, and the verdict unless
    a side has fewer runs than runs_needed (then inconclusive, with the runs it needs)."""
    lo, hi = interval
    p, test = rank_test(b, a, thresholds.seed)
    needed = runs_needed(thresholds.alpha)
    short = min(len(b), len(a)) < needed
    return Comparison(
        metric=metric,
        n_before=len(b),
        n_after=len(a),
        ratio=ratio,
        ci_low=lo,
        ci_high=hi,
        p_value=p,
        p_adjusted=p,
        test=test,
        verdict=INCONCLUSIVE if short else verdict(lo, hi, p, thresholds),
        needed_runs=needed if short else None,
        thresholds=thresholds,
    )


def _clean_phase(
    phase: str,
    values: list[float],
    lost: list[int] | None,
    labels: list[str] | None,
    metric: str,
) -> tuple[np.ndarray, tuple[Excluded, ...]]:
    """The phase's usable values, and the runs excluded because they lost events."""
    names = labels if labels is not None else [f"#{i}" for i in range(len(values))]
    losses = lost if lost is not None else [0] * len(values)
    if len(names) != len(values) or len(losses) != len(values):
        raise TracekitError(
            f"compare {metric}: {phase} has {len(values)} values but {len(losses)} lost counts"
            f" and {len(names)} run labels; give one of each per run"
        )
    if not values:
        raise TracekitError(f"compare {metric}: no {phase} runs; give one value per run")
    arr = np.asarray(values, dtype=float)
    if not np.isfinite(arr).all():
        raise TracekitError(f"compare {metric}: {phase} has a NaN or infinite run value")
    if (arr < 0).any():
        raise TracekitError(f"compare {metric}: {phase} has a negative run value")
    keep = np.asarray(losses) == 0
    out = tuple(Excluded(phase, n, int(x)) for n, x in zip(names, losses, strict=True) if x)
    if not keep.any():
        raise TracekitError(
            f"compare {metric}: no {phase} runs without lost events ({len(values)} given,"
            f" {len(out)} lost events); record runs with larger trace buffers"
        )
    return arr[keep], out


def bootstrap_ratio_ci(
    before: np.ndarray, after: np.ndarray, thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(after)/mean(before), resampling runs.

    NaN, NaN when a phase has one run: resampling it gives that run back every time, an
    interval of zero width that says nothing about the spread of runs.
    """
    if min(len(before), len(after)) < MIN_SPREAD_RUNS:
        return math.nan, math.nan
    rng = np.random.default_rng(thresholds.seed)
    n = thresholds.resamples
    b_means = before[rng.integers(0, len(before), (n, len(before)))].mean(axis=1)
    a_means = after[rng.integers(0, len(after), (n, len(after)))].mean(axis=1)
    return _ratio_interval(b_means, a_means, thresholds)


def _ratio_interval(
    b_means: np.ndarray, a_means: np.ndarray, thresholds: Thresholds
) -> tuple[float, float]:
    """The percentile interval of the resampled after/before ratios."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = a_means / b_means  # a resample of all-zero befores gives inf: it sorts last
    tail = (1 - thresholds.confidence) / 2 * 100
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return float(lo), float(hi)


def t_cdf_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer df (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total
    if df == 1:
        return 2 * theta / math.pi
    term, total = 1.0, 1.0
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)


def t_quantile(p: float, df: int) -> float:
    """The p quantile (p > 0.5) of Student's t with integer df, by bisection."""
    target = 2 * p - 1
    low, high = 0.0, 1.0
    while t_cdf_two_sided(high, df) < target:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf_two_sided(mid, df) < target else (low, mid)
    return (low + high) / 2


def welch_log_ratio_ci(
    before: np.ndarray, after: np.ndarray, confidence: float = 0.95
) -> tuple[float, float]:
    """Welch's t interval of the ratio of geometric means of per-unit values (boots): the
    difference of the log means, its Welch-Satterthwaite df rounded down (conservative).

    For few units (2-5 a side): a percentile bootstrap of so few has no small-sample
    widening and is bounded by the observed units, so it undercovers (review s17 of
    vm-churn: 71% at 2+2, 83-90% at 3+3 for a nominal 95%); t on the log keeps its
    coverage. NaN, NaN with fewer than two units a side or no spread at all.
    """
    if min(len(before), len(after)) < 2 or (before <= 0).any() or (after <= 0).any():
        return math.nan, math.nan
    lb, la = np.log(before), np.log(after)
    vb, va = lb.var(ddof=1) / len(lb), la.var(ddof=1) / len(la)
    if vb + va <= 0:
        return math.nan, math.nan
    df = (vb + va) ** 2 / (vb**2 / (len(lb) - 1) + va**2 / (len(la) - 1))
    half = t_quantile((1 + confidence) / 2, max(1, math.floor(df))) * math.sqrt(vb + va)
    diff = la.mean() - lb.mean()
    return math.exp(diff - half), math.exp(diff + half)


def geometric_ratio(before: np.ndarray, after: np.ndarray) -> float:
    """The ratio of the geometric means of per-unit values: what welch_log_ratio_ci bounds."""
    return float(np.exp(np.log(after).mean() - np.log(before).mean()))


def _pooled_log_variance(before: np.ndarray, after: np.ndarray) -> tuple[float, int] | None:
    """The pooled variance of log per-unit values and its df (k1 + k2 - 2); None: no df,
    no spread, or a value that has no log."""
    df = len(before) + len(after) - 2
    if df < 1 or (before <= 0).any() or (after <= 0).any():
        return None
    lb, la = np.log(before), np.log(after)
    pooled = float((((lb - lb.mean()) ** 2).sum() + ((la - la.mean()) ** 2).sum()) / df)
    return (pooled, df) if pooled > 0 else None


def min_detectable_ratio(
    before: np.ndarray, after: np.ndarray, alpha: float = 0.05, power: float = 0.8
) -> float | None:
    """The ratio a two-sided t test on log per-unit values detects with `power` at these
    unit counts and their pooled spread: exp((t(1-alpha/2) + t(power)) * s * sqrt(1/k1 +
    1/k2)), df = k1 + k2 - 2. None: no spread to pool (under three units, or none)."""
    spread = _pooled_log_variance(before, after)
    if spread is None:
        return None
    pooled, df = spread
    t = t_quantile(1 - alpha / 2, df) + t_quantile(power, df)
    return math.exp(t * math.sqrt(pooled * (1 / len(before) + 1 / len(after))))


def units_for_ratio(
    before: np.ndarray, after: np.ndarray, ratio: float, alpha: float = 0.05, power: float = 0.8
) -> int | None:
    """Units per side the t test needs to detect `ratio` at these units' pooled log spread
    (normal approximation, 2 (z + z)^2 s^2 / log(ratio)^2); None as min_detectable_ratio."""
    spread = _pooled_log_variance(before, after)
    if spread is None or ratio == 1:
        return None
    z = NORMAL_QUANTILES[1 - alpha / 2] + NORMAL_QUANTILES[power]
    return math.ceil(2 * z**2 * spread[0] / math.log(ratio) ** 2)


def rank_test(before: np.ndarray, after: np.ndarray, seed: int = 7) -> tuple[float, str]:
    """Two-sided Mann-Whitney test on midranks: (p-value, name of the test used)."""
    pooled = np.concatenate([before, after])
    ranks = _midranks(pooled)
    k = len(after)
    observed = ranks[len(before) :].sum()
    centre = k * (len(pooled) + 1) / 2
    if math.comb(len(pooled), k) <= EXACT_LIMIT:
        sums = ranks[_splits(len(pooled), k)].sum(axis=1)
        name, extra = "exact rank test", 0
    else:
        rng = np.random.default_rng(seed)
        picks = rng.permuted(np.tile(np.arange(len(pooled)), (PERMUTATIONS, 1)), axis=1)
        sums = ranks[picks[:, :k]].sum(axis=1)
        name, extra = f"permutation rank test ({PERMUTATIONS} perms)", 1
    extreme = np.abs(sums - centre) >= abs(observed - centre) - RANK_TOLERANCE
    # The observed split counts once more for Monte Carlo so p is never 0.
    return float((extreme.sum() + extra) / (len(sums) + extra)), name


def _midranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    ranks = np.empty(len(values))
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or sorted_values[end] != sorted_values[start]:
            ranks[order[start:end]] = (start + end + 1) / 2
            start = end
    return ranks


@lru_cache(maxsize=32)
def _splits(n: int, k: int) -> np.ndarray:
    """Every choice of k positions out of n: the exact permutation distribution's support."""
    return np.array(list(combinations(range(n), k)), dtype=np.int64).reshape(-1, k)


def min_p_value(n: int, m: int | None = None) -> float:
    """The smallest two-sided p the exact rank test can give with n runs in each phase (or
    n and m)."""
    return min(1.0, 2 / math.comb(n + (n if m is None else m), n))


def runs_needed(alpha: float) -> int:
    """The fewest runs per phase with which the exact rank test can reach p < alpha."""
    n = 1
    while min_p_value(n) >= alpha:
        n += 1
    return n


def runs_to_decide(c: Comparison) -> int | None:
    """Runs per phase an inconclusive comparison would need at its measured spread, roughly.

    The interval's half-width on a log scale shrinks as 1/sqrt(runs); this is the run count
    at which it would fit between the point estimate and the nearest boundary that decides
    (beyond min_effect for "present", inside the equivalence band for "absent"). None when
    the estimate sits on a boundary, or the comparison is not inconclusive.
    """
    if c.no_verdict:
        return None
    if c.verdict != INCONCLUSIVE or c.ratio <= 0 or not c.ci_low > 0:
        return c.needed_runs  # not c.ci_low > 0 also catches an interval of n/a (NaN)
    log_r, t = math.log(c.ratio), c.thresholds
    half = (math.log(c.ci_high) - math.log(c.ci_low)) / 2
    if abs(log_r) > math.log(t.min_effect):
        room = abs(log_r) - math.log(t.min_effect)
    else:
        room = math.log(t.equivalence) - abs(log_r)
    if room <= 0 or half <= 0:
        return None
    runs = min(c.n_before, c.n_after)
    return max(c.needed_runs or 0, runs + 1, math.ceil(runs * (half / room) ** 2))


def verdict(ci_low: float, ci_high: float, p: float, thresholds: Thresholds) -> str:
    """present / absent / inconclusive from the interval and the (adjusted) p-value."""
    beyond = ci_low > thresholds.min_effect or ci_high < 1 / thresholds.min_effect
    if beyond and p < thresholds.alpha:
        return PRESENT
    if 1 / thresholds.equivalence <= ci_low and ci_high <= thresholds.equivalence:
        return ABSENT
    return INCONCLUSIVE


def holm(p_values: list[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the order given."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def compare_all(comparisons: list[Comparison], primary: str) -> list[Comparison]:
    """Mark the declared primary metric; Holm-correct the secondaries and redo their verdicts."""
    names = [c.metric for c in comparisons]
    if names.count(primary) != 1:
        raise TracekitError(
            f"compare: the primary metric {primary!r} must appear exactly once among"
            f" {', '.join(names)}; declare one of them as primary"
        )
    secondary = [c for c in comparisons if c.metric != primary]
    adjusted = dict(zip(map(id, secondary), holm([c.p_value for c in secondary]), strict=True))
    return [c if c.metric == primary else _as_secondary(c, adjusted[id(c)]) for c in comparisons]


def secondary_family(comparisons: list[Comparison]) -> list[Comparison]:
    """A family of secondary comparisons without a primary: Holm over them, verdicts redone."""
    adjusted = holm([c.p_value for c in comparisons])
    return [_as_secondary(c, p) for c, p in zip(comparisons, adjusted, strict=True)]


def _as_secondary(c: Comparison, p_adjusted: float) -> Comparison:
    """The comparison with its Holm-adjusted p-value and the verdict that follows from it."""
    new_verdict = c.verdict
    if c.needed_runs is None:
        new_verdict = verdict(c.ci_low, c.ci_high, p_adjusted, c.thresholds)
    return replace(c, role="secondary", p_adjusted=p_adjusted, verdict=new_verdict)
