"""Effects over a campaign (issue 19): which factor changes the effect, by how much (pure).

The unit is the boot: each cell's bundle gives one response per metric, its after/before
ratio (the primary metric, cyclictest p99.9 as the mean of per-run values; the probe's
cost, the mean of its slots' median call time), and the bundles of one boot (its
manifest's host.boot_id) at one condition are averaged into one unit: cells that share a
boot share its state (the effect lasts until reboot), so they are not replicates. Effects
are computed on log ratios from the condition means, so each reads as a factor: a main
effect x1.8, the after/before ratio is 1.8 times larger at the factor's second level; an
interaction a x b x1.8, a's effect is 1.8 times larger at b's second level than at its
first (a ratio of ratios; x1: a acts alike at both). Each has a
t interval from the spread between the boots of a condition (pooled over conditions;
needs two boots in some condition).

Dose-response: the log ratio against the dose is fitted flat, linear, saturating and
step; AICc picks the shape by the rule in `shape_rule()`, with a bootstrap band (boots
resampled within each dose).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analysis.compare import t_quantile
from tracekit.analysis.conditions import FIELD_LABELS, Condition, Unknown
from tracekit.analysis.runs import metric_values, run_metrics
from tracekit.errors import TracekitError

PRIMARY_RESPONSE = "p99.9 after/before"
PROBE_RESPONSE = "probe cost after/before"
RESPONSES = (PRIMARY_RESPONSE, PROBE_RESPONSE)
CONFIDENCE = 0.95
EQUIVALENCE = 1.10  # "none": the interval lies inside [1/1.10, 1.10]
FOUND, NONE, UNCLEAR = "found", "none", "unclear"
# The shape with the fewest parameters among those within this AICc of the best is chosen.
AIC_MIN_DIFFERENCE = 2.0
UNDECIDED = "undecided"
BOOTSTRAP_RESAMPLES = 1000
SEED = 7
# Measured by tests/test_analysis_factorial.py on generated campaigns (log-normal boots,
# sd 0.15, about the emulated null runs' spread), which recomputes them and fails on a
# drift: null effects "found" (2^3 x 2 boots, 200 campaigns), and flat sweeps given a
# shape (6 doses x 4 boots, 400 sweeps).
NULL_EFFECTS, NULL_EFFECTS_FOUND = 600, 37
NULL_SWEEPS, NULL_SWEEPS_SHAPED = 400, 25
# Options of collect a design can vary besides the knobs (matrix axes such as after_guest
# are the decision table's: its section compares them).
OPTION_FACTORS = ("backing", "tlbi_count", "touch_kb", "vmid")


@dataclass(frozen=True)
class Effect:
    """A main effect or a two-factor interaction on one response, as a factor."""

    response: str
    term: str  # "mmu" or "leaf x mmu" (an interaction's factors alphabetically)
    contrast: str  # "1 vs 0" (main effect), "" for an interaction
    ratio: float
    ci_low: float
    ci_high: float
    verdict: str  # found, none, unclear
    aliases: tuple[str, ...]  # terms whose columns coincide with this one in the cells run
    boots: int  # units: one per boot and condition
    df: int


@dataclass(frozen=True)
class ShapeFit:
    """One dose-response shape fitted to the log ratios."""

    shape: str
    parameters: int
    aicc: float
    rss: float


@dataclass(frozen=True)
class DoseResponse:
    """Which shape the effect follows over the dose, and the fitted curve with its band."""

    response: str
    dose: str
    fits: tuple[ShapeFit, ...]
    chosen: str  # a shape, or "undecided (a or b)"
    curve: pl.DataFrame  # dose, ratio, low, high: the fitted ratio and its band
    top_ratio: float  # fitted ratio at the highest dose over that at the lowest
    top_low: float
    top_high: float
    boots: int


def shape_rule() -> str:
    """The dose-response rule, as the report states it."""
    return (
        f"shape: of flat, linear, saturating and step fits of the log ratio, the one with the"
        f" fewest parameters among those within {AIC_MIN_DIFFERENCE:g} AICc of the best;"
        f" {UNDECIDED} when two with that count qualify. Band: {CONFIDENCE:.0%} percentile"
        f" bootstrap, boots resampled within each dose ({BOOTSTRAP_RESAMPLES} resamples);"
        f" a flat response was given a shape in {NULL_SWEEPS_SHAPED} of {NULL_SWEEPS}"
        " generated sweeps"
    )


def effect_rule() -> str:
    """The effects rule, as the report states it."""
    return (
        f"effects on log after/before ratios of cell means, boot = unit (a x b: a's effect"
        f" at b's second level over a's effect at its first); {CONFIDENCE:.0%}"
        f" t interval from the spread between boots of a condition; found: the interval"
        f" excludes x1 (false positives: {1 - CONFIDENCE:.0%} per effect by design,"
        f" {NULL_EFFECTS_FOUND} of {NULL_EFFECTS} null effects of generated campaigns);"
        f" none: inside [1/{EQUIVALENCE:g}, {EQUIVALENCE:g}]; else unclear"
    )


# The condition fields a design's factors set (every --knob, the backing); bundles that
# differ in any other field (kernel, KVM mode, placement, freshness...) are never pooled.
FACTOR_FIELDS = ("knobs", "backing")


def setting_groups(conditions: list[Condition]) -> list[list[int]]:
    """Indices of the bundles alike in every condition field but the factors', in order.

    An unknown field equals nothing (conditions.Unknown), so a bundle that lacks one is a
    group of its own.
    """
    keys: list[Condition] = []
    groups: list[list[int]] = []
    for i, condition in enumerate(conditions):
        rest = dataclasses.replace(condition, **dict.fromkeys(FACTOR_FIELDS, ""))
        if rest in keys:
            groups[keys.index(rest)].append(i)
        else:
            keys.append(rest)
            groups.append([i])
    return groups


def setting_label(conditions: list[Condition], members: list[int]) -> str:
    """What sets one group apart: the non-factor fields that vary (or are unknown)."""
    names = [f.name for f in dataclasses.fields(Condition) if f.name not in FACTOR_FIELDS]
    varying = [
        n
        for n in names
        if len({str(getattr(c, n)) for c in conditions}) > 1
        or any(isinstance(getattr(c, n), Unknown) for c in conditions)
    ]
    first = conditions[members[0]]
    return ", ".join(f"{FIELD_LABELS[n]} {getattr(first, n)}" for n in varying)


# --- Per boot: responses and factor levels ---


def boot_responses(latencies: pl.DataFrame, probes: pl.DataFrame) -> dict[str, float | None]:
    """One bundle's responses: quiet-run p99.9 and the probe's median cost, after/before."""
    return {
        PRIMARY_RESPONSE: _latency_ratio(latencies),
        PROBE_RESPONSE: _probe_ratio(probes),
    }


def _latency_ratio(latencies: pl.DataFrame) -> float | None:
    """Mean per-run p99.9 after over before, quiet runs; None without both phases."""
    if not latencies.height:
        return None
    quiet = latencies.filter(pl.col("kind") == "quiet")
    means = []
    for phase in ("before", "after"):
        rows = quiet.filter(pl.col("phase") == phase)
        if not rows.height:
            return None
        means.append(float(np.mean(metric_values(run_metrics(rows), "p99.9"))))
    return means[1] / means[0] if means[0] > 0 else None


def _probe_ratio(probes: pl.DataFrame) -> float | None:
    """Mean of the probe slots' median call time after over before; None without both."""
    if not probes.height:
        return None
    means = [probes.filter(pl.col("phase") == p)["p50_ns"].mean() for p in ("before", "after")]
    if any(m is None for m in means) or not means[0]:
        return None
    return float(means[1]) / float(means[0])  # type: ignore[arg-type]


def factor_levels(options: Mapping[str, object]) -> dict[str, str]:
    """The factor levels a bundle ran with: every --knob, and the options a design varies."""
    levels = {}
    for text in options.get("knobs") or []:  # type: ignore[union-attr]
        name, _, value = str(text).partition("=")
        levels[name] = value
    for name in OPTION_FACTORS:
        value = options.get(name)
        if isinstance(value, list):
            value = ",".join(map(str, value)) if value else None
        if value is not None:
            levels[name] = str(value)
    return levels


def campaign_frame(
    bundles: list[tuple[str, dict[str, str], dict[str, float | None]]],
    boot_ids: list[str | None] | None = None,
) -> pl.DataFrame:
    """One row per bundle: its label, boot, factor levels (str) and responses.

    boot_ids: each bundle's host.boot_id; a bundle without one (None, or no list: one
    collected before boots were recorded) is counted as a boot of its own.
    """
    names = sorted({name for _, levels, _ in bundles for name in levels})
    ids = boot_ids if boot_ids is not None else [None] * len(bundles)
    rows = [
        {
            "bundle": label,
            "boot": boot if boot is not None else f"unrecorded:{label}",
            "boot_recorded": boot is not None,
            **{n: levels.get(n, "") for n in names},
            **responses,
        }
        for (label, levels, responses), boot in zip(bundles, ids, strict=True)
    ]
    schema = {"bundle": pl.String, "boot": pl.String, "boot_recorded": pl.Boolean}
    schema |= dict.fromkeys(names, pl.String) | dict.fromkeys(RESPONSES, pl.Float64)
    return pl.DataFrame(rows, schema=schema, orient="row")


_NOT_FACTORS = frozenset({"bundle", "boot", "boot_recorded", *RESPONSES})


def varying_factors(frame: pl.DataFrame) -> list[str]:
    """The factor columns that take more than one level across the bundles."""
    return [c for c in frame.columns if c not in _NOT_FACTORS and frame[c].n_unique() > 1]


def boot_units(frame: pl.DataFrame, factors: list[str], response: str) -> pl.DataFrame:
    """One unit per boot and condition: the mean log ratio ("_y") of its bundles."""
    rows = frame.filter(pl.col(response).is_not_null() & (pl.col(response) > 0))
    return (
        rows.with_columns(pl.col(response).log().alias("_y"))
        .group_by(["boot", *factors], maintain_order=True)
        .agg(pl.col("_y").mean())
    )


def boot_lines(frame: pl.DataFrame, factors: list[str]) -> list[str]:
    """What the report must say of the bundles' boots: shared ones, unrecorded ones."""
    lines = []
    conditions = frame.group_by("boot").agg(pl.struct(factors).n_unique().alias("n"))
    shared = conditions.filter(pl.col("n") > 1).height
    if shared:
        lines.append(
            f"{shared} of {conditions.height} boots ran cells of more than one condition:"
            " those cells share the boot's state (the effect lasts until reboot) and differ"
            " by run order as much as by their levels; they are not replicates, and the"
            " bundles of one boot and condition count as one boot"
        )
    elif conditions.height < frame.height:
        lines.append("bundles of one boot and condition count as one boot")
    unrecorded = frame.filter(~pl.col("boot_recorded")).height
    if unrecorded:
        lines.append(
            f"{unrecorded} bundles do not record their boot (collected before host.boot_id):"
            " each is counted as a boot of its own"
        )
    return lines


def dose_factor(frame: pl.DataFrame, factors: list[str]) -> str | None:
    """The one factor of a dose sweep: numeric, three or more levels, nothing else varies."""
    if len(factors) != 1:
        return None
    levels = frame[factors[0]].unique().to_list()
    return factors[0] if len(levels) >= 3 and all(str(v).isdigit() for v in levels) else None


# --- Effects ---


@dataclass(frozen=True)
class _Cells:
    """The conditions run: their levels, mean log ratio, boots, and the pooled spread."""

    levels: list[dict[str, str]]
    means: np.ndarray
    counts: np.ndarray  # boots per condition
    sd: float | None  # pooled within-condition standard deviation of the log ratio
    df: int


def _cells(frame: pl.DataFrame, factors: list[str], response: str) -> _Cells:
    """Group the boots by condition (log ratios); pool the spread within conditions."""
    units = boot_units(frame, factors, response)
    if not units.height:
        raise TracekitError(f"campaign effects: no bundle has a {response}; check the bundles")
    grouped = (
        units.group_by(factors, maintain_order=True)
        .agg(pl.col("_y").mean().alias("mean"), pl.col("_y").var(ddof=0).alias("ss"), pl.len())
        .sort(factors)
    )
    counts = grouped["len"].to_numpy().astype(float)
    df = int(counts.sum() - len(counts))
    ss = float((grouped["ss"].fill_null(0).to_numpy() * counts).sum())
    return _Cells(
        levels=grouped.select(factors).to_dicts(),
        means=grouped["mean"].to_numpy(),
        counts=counts,
        sd=math.sqrt(ss / df) if df > 0 else None,
        df=df,
    )


def chance_finds(found: list[Effect]) -> tuple[int, float]:
    """How many effects had an interval (were tested), and how many of them a campaign
    with no effect at all would call found by chance (CONFIDENCE per effect, unadjusted)."""
    tested = sum(1 for e in found if math.isfinite(e.ci_low) and math.isfinite(e.ci_high))
    return tested, tested * (1 - CONFIDENCE)


def effects(frame: pl.DataFrame, factors: list[str], response: str) -> list[Effect]:
    """Main effects of every factor and interactions of every two-level pair, with intervals."""
    cells = _cells(frame, factors, response)
    levels = {f: sorted({c[f] for c in cells.levels}, key=_level_key) for f in factors}
    terms = _terms(cells, factors, levels)
    out = []
    for name, contrast, weights in terms:
        aliases = tuple(other for other, _, w in terms if other != name and _collinear(w, weights))
        out.append(_effect(response, name, contrast, weights, cells, aliases))
    return out


def _level_key(level: str) -> tuple[int, float | str]:
    """Numeric levels in numeric order, others alphabetically (the first is the baseline)."""
    return (0, float(level)) if level.isdigit() else (1, level)


def _terms(
    cells: _Cells, factors: list[str], levels: dict[str, list[str]]
) -> list[tuple[str, str, np.ndarray]]:
    """(term, contrast, cell weights) of each main effect and two-level interaction."""
    terms = []
    for f in factors:
        base = levels[f][0]
        for level in levels[f][1:]:
            weights = _average(cells, f, level) - _average(cells, f, base)
            terms.append((f, f"{level} vs {base}", weights))
    two = [f for f in factors if len(levels[f]) == 2]
    for a, b in itertools.combinations(sorted(two), 2):
        signs = np.array(
            [_sign(c[a], levels[a]) * _sign(c[b], levels[b]) for c in cells.levels], dtype=float
        )
        # The whole change of a's (log) effect between b's levels, so the printed factor is
        # the ratio of a's effects (textbooks' interaction is half of it: its square root).
        terms.append((f"{a} x {b}", "", signs / (len(signs) / 4)))
    return terms


def _average(cells: _Cells, factor: str, level: str) -> np.ndarray:
    """Weights averaging the conditions with factor at level (cell means, equally weighted)."""
    mask = np.array([c[factor] == level for c in cells.levels], dtype=float)
    return mask / mask.sum()


def _sign(level: str, levels: list[str]) -> int:
    """-1 at a two-level factor's first level, +1 at its second."""
    return -1 if level == levels[0] else 1


def _collinear(a: np.ndarray, b: np.ndarray) -> bool:
    """Two contrasts over the same conditions that cannot be told apart (aliased)."""
    norm = np.linalg.norm(a) * np.linalg.norm(b)
    return bool(norm) and abs(abs(float(a @ b)) / norm - 1) < 1e-9


def _effect(
    response: str,
    term: str,
    contrast: str,
    weights: np.ndarray,
    cells: _Cells,
    aliases: tuple[str, ...],
) -> Effect:
    """One contrast of the cell means with its t interval, as a ratio."""
    estimate = float(weights @ cells.means)
    low = high = math.nan
    verdict = UNCLEAR
    if cells.sd is not None:
        se = cells.sd * math.sqrt(float((weights**2 / cells.counts).sum()))
        half = t_quantile((1 + CONFIDENCE) / 2, cells.df) * se
        low, high = math.exp(estimate - half), math.exp(estimate + half)
        verdict = effect_verdict(low, high)
    return Effect(
        response,
        term,
        contrast,
        math.exp(estimate),
        low,
        high,
        verdict,
        aliases,
        int(cells.counts.sum()),
        cells.df,
    )


def effect_verdict(low: float, high: float) -> str:
    """found / none / unclear from an effect's interval (as a ratio)."""
    if low > 1 or high < 1:
        return FOUND
    if low >= 1 / EQUIVALENCE and high <= EQUIVALENCE:
        return NONE
    return UNCLEAR


# --- Dose-response ---


def _regressor(shape: str, x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """The shape's regressor at each knot: one column per knot (flat: none varies)."""
    if shape == "flat":
        return np.zeros((len(x), 1))
    if shape == "linear":
        return x[:, None].astype(float)
    if shape == "saturating":
        return 1 - np.exp(-x[:, None] / knots[None, :])
    return (x[:, None] >= knots[None, :]).astype(float)


SHAPES = {"flat": 1, "linear": 2, "saturating": 3, "step": 3}


def _knots(shape: str, x: np.ndarray) -> np.ndarray:
    """The nonlinear parameter's candidates: saturation scales, or step positions."""
    doses = np.unique(x)
    if shape == "step":
        return doses[1:].astype(float)
    if shape == "saturating":
        top = float(doses.max()) or 1.0
        positive = doses[doses > 0]
        bottom = float(positive.min()) / 4 if positive.size else top / 100
        return np.geomspace(bottom, top * 4, 60)
    return np.ones(1)


def _fit(shape: str, x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """Least squares y = a + b z(knot) over the shape's knots: (rss, knot, a, b)."""
    knots = _knots(shape, x)
    z = _regressor(shape, x, knots)
    zc = z - z.mean(axis=0)
    yc = y - y.mean()
    szz = (zc**2).sum(axis=0)
    szy = zc.T @ yc
    # A regressor constant over the boots (a knot beyond every dose) fits as flat.
    slope = np.divide(szy, szz, out=np.zeros_like(szy), where=szz > 1e-12)
    rss = float(yc @ yc) - slope * szy
    best = int(np.argmin(rss))
    intercept = float(y.mean() - slope[best] * z[:, best].mean())
    return float(rss[best]), float(knots[best]), intercept, float(slope[best])


def _aicc(rss: float, n: int, k: int) -> float:
    """AICc of a Gaussian least-squares fit with k mean parameters (+1 for the variance)."""
    params = k + 1
    floor = max(rss / n, 1e-300)
    small = 2 * params * (params + 1) / (n - params - 1) if n - params - 1 > 0 else math.inf
    return n * math.log(floor) + 2 * params + small


def choose_shape(fits: list[ShapeFit]) -> str:
    """The rule of shape_rule(): fewest parameters within the minimum difference of the best."""
    best = min(f.aicc for f in fits)
    close = [f for f in fits if f.aicc <= best + AIC_MIN_DIFFERENCE]
    fewest = min(f.parameters for f in close)
    simplest = sorted(f.shape for f in close if f.parameters == fewest)
    return simplest[0] if len(simplest) == 1 else f"{UNDECIDED} ({' or '.join(simplest)})"


def _dose_data(frame: pl.DataFrame, dose: str, response: str) -> tuple[np.ndarray, np.ndarray]:
    """(dose, log ratio) of every boot with a response; enough of them for a shape."""
    units = boot_units(frame, [dose], response)
    x = units[dose].cast(pl.Float64).to_numpy()
    y = units["_y"].to_numpy()
    if len(np.unique(x)) < 3 or len(y) < 5:
        raise TracekitError(
            f"dose-response of {response} over {dose}: {len(np.unique(x))} doses and {len(y)}"
            " boots; a shape needs three doses and five boots"
        )
    return x, y


def dose_shapes(frame: pl.DataFrame, dose: str, response: str) -> tuple[list[ShapeFit], str]:
    """Every shape's fit to the log ratios over the dose, and the one the rule chooses."""
    x, y = _dose_data(frame, dose, response)
    fits = []
    for shape, k in SHAPES.items():
        rss = _fit(shape, x, y)[0]
        fits.append(ShapeFit(shape, k, _aicc(rss, len(y), k), rss))
    return fits, choose_shape(fits)


def dose_response(frame: pl.DataFrame, dose: str, response: str) -> DoseResponse:
    """The chosen shape (the best by AICc drawn when undecided) with its bootstrap band."""
    x, y = _dose_data(frame, dose, response)
    fits, chosen = dose_shapes(frame, dose, response)
    drawn = chosen if not chosen.startswith(UNDECIDED) else min(fits, key=lambda f: f.aicc).shape
    doses = np.unique(x)
    centre = _predict(drawn, x, y, doses)
    band = _bootstrap(drawn, x, y, doses)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(band, [tail, 100 - tail], axis=0)
    top_low, top_high = np.percentile(band[:, -1] - band[:, 0], [tail, 100 - tail])
    curve = pl.DataFrame(
        {"dose": doses, "ratio": np.exp(centre), "low": np.exp(low), "high": np.exp(high)}
    )
    return DoseResponse(
        response,
        dose,
        tuple(fits),
        chosen,
        curve,
        float(np.exp(centre[-1] - centre[0])),
        float(np.exp(top_low)),
        float(np.exp(top_high)),
        len(y),
    )


def _predict(shape: str, x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The fitted log ratio of `shape` at the doses `at`."""
    _, knot, intercept, slope = _fit(shape, x, y)
    return intercept + slope * _regressor(shape, at, np.array([knot]))[:, 0]


def _bootstrap(shape: str, x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Refits on boots resampled within each dose: one predicted curve per resample."""
    rng = np.random.default_rng(SEED)
    groups = [np.flatnonzero(x == d) for d in np.unique(x)]
    curves = np.empty((BOOTSTRAP_RESAMPLES, len(at)))
    for i in range(BOOTSTRAP_RESAMPLES):
        pick = np.concatenate([rng.choice(g, len(g)) for g in groups])
        curves[i] = _predict(shape, x[pick], y[pick], at)
    return curves


# --- The VMID a guest was given (collect --vmid) ---


@dataclass(frozen=True)
class VmidPrep:
    """The throwaway VMs a bundle ran before its before phase, and the VMIDs they got."""

    vmid: int  # the VMID the guest was to get
    vms: int  # throwaway MMU-off VMs run first
    seen: tuple[int, ...] | None  # VMIDs (without generation) the kprobe saw; None: unread
    why_unread: str = ""

    @property
    def as_planned(self) -> bool | None:
        """The throwaway VMs took VMIDs 1..vmid-1 (so the guest's is next); None: not seen."""
        if self.seen is None:
            return None
        return self.seen == tuple(range(1, self.vmid))


def vmid_prep(record: Mapping[str, object] | None) -> VmidPrep | None:
    """A run's vmid-prep.json as what it shows; None without one."""
    if record is None:
        return None
    ids, bits = record.get("vmid_ids"), record.get("vmid_bits")
    seen = None
    if isinstance(ids, list):
        mask = (1 << bits) - 1 if isinstance(bits, int) else (1 << 16) - 1
        seen = tuple(sorted({int(v) & mask for v in ids}))
    return VmidPrep(
        int(str(record["vmid"])), int(str(record["vms"])), seen, str(record.get("vmids_unread", ""))
    )
