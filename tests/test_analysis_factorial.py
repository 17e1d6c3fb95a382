"""Campaign effects and dose-responses on generated campaigns with known, injected effects.

Each generated boot's response is exp(sum of the injected log effects + noise): the
noise (sd 0.15 on the log ratio) is about the spread of the emulated null runs'
after/before p99.9 ratios. The checks: injected effects are recovered within their
intervals, the intervals cover at their stated rate, and where nothing was injected
"found" comes at the stated false-positive rate.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import polars as pl
import pytest

from tracekit.analysis.factorial import (
    CONFIDENCE,
    FOUND,
    NONE,
    NULL_EFFECTS,
    NULL_EFFECTS_FOUND,
    NULL_SWEEPS,
    NULL_SWEEPS_SHAPED,
    PRIMARY_RESPONSE,
    UNDECIDED,
    boot_lines,
    campaign_frame,
    dose_factor,
    dose_response,
    dose_shapes,
    effects,
    factor_levels,
    t_quantile,
    varying_factors,
)

NOISE = 0.15
FACTORS = {"mmu": ("0", "1"), "leaf": ("1g", "4k"), "pre_tlbi": ("0", "1")}


def _campaign(
    rng: np.random.Generator,
    conditions: list[dict[str, str]],
    log_effect: object,
    replicates: int,
) -> pl.DataFrame:
    """Boots of every condition, each response exp(injected log effect + noise)."""
    boots = []
    for i, levels in enumerate(conditions):
        for r in range(replicates):
            value = math.exp(log_effect(levels) + rng.normal(0, NOISE))  # type: ignore[operator]
            boots.append((f"{i}-{r}", levels, {PRIMARY_RESPONSE: value}))
    return campaign_frame(boots)


def _full(factors: dict[str, tuple[str, ...]]) -> list[dict[str, str]]:
    """Every combination of the levels."""
    names = list(factors)
    return [dict(zip(names, v, strict=True)) for v in itertools.product(*factors.values())]


def _injected(levels: dict[str, str]) -> float:
    """mmu x2, leaf 4k x1.3, and mmu with 4k a further x1.5 (interaction); pre_tlbi nothing."""
    mmu, small = levels["mmu"] == "1", levels["leaf"] == "4k"
    return math.log(2) * mmu + math.log(1.3) * small + math.log(1.5) * (mmu and small)


def test_t_quantiles_match_the_tables() -> None:
    """t(0.975) for 1, 2, 5, 10, 30 degrees of freedom, to three decimals."""
    table = {1: 12.706, 2: 4.303, 5: 2.571, 10: 2.228, 30: 2.042}
    for df, value in table.items():
        assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-3)


def test_known_main_effects_and_interaction_recovered_within_their_intervals() -> None:
    """2^3 x 3 boots: mmu, leaf and mmu x leaf found with the injected size inside the interval."""
    frame = _campaign(np.random.default_rng(1), _full(FACTORS), _injected, 3)
    found = {e.term: e for e in effects(frame, varying_factors(frame), PRIMARY_RESPONSE)}
    # Main effects average over the other factor: mmu is x2 at 1g and x3 at 4k.
    truth = {
        "mmu": math.sqrt(2 * 3),
        "leaf": math.sqrt(1.3 * 1.3 * 1.5),
        "leaf x mmu": 1.5,
    }
    for term, value in truth.items():
        effect = found[term]
        assert effect.verdict == FOUND, effect
        assert effect.ci_low < value < effect.ci_high, effect
    assert found["pre_tlbi"].verdict != FOUND
    assert found["mmu"].contrast == "1 vs 0" and found["mmu"].df == 24 - 8


def test_intervals_cover_and_null_effects_are_found_at_the_stated_rate() -> None:
    """200 campaigns: each interval covers its truth ~95%; null terms 'found' ~5%."""
    rng = np.random.default_rng(2)
    covered = total = false_found = nulls = 0
    for _ in range(200):
        frame = _campaign(rng, _full(FACTORS), _injected, 2)
        for effect in effects(frame, list(FACTORS), PRIMARY_RESPONSE):
            truth = {
                "mmu": math.sqrt(6),
                "leaf": math.sqrt(1.3 * 1.3 * 1.5),
                "leaf x mmu": 1.5,
            }.get(effect.term, 1.0)
            covered += effect.ci_low < truth < effect.ci_high
            total += 1
            if truth == 1.0:
                nulls += 1
                false_found += effect.verdict == FOUND
    assert nulls == NULL_EFFECTS
    assert abs(covered / total - CONFIDENCE) < 0.02
    # 600 null terms at 5%: 30 expected; the binomial 99.9% range is about 13-50.
    assert 13 <= false_found <= 50
    assert false_found == NULL_EFFECTS_FOUND  # the count the report states


def test_equivalence_says_none_when_the_boots_are_tight() -> None:
    """A null factor with 48 boots per condition: its interval inside [1/1.1, 1.1].

    With 12 boots the interval's half-width is already x1.07, so "none" needs many boots.
    """
    frame = _campaign(np.random.default_rng(3), _full(FACTORS), _injected, 48)
    found = {e.term: e for e in effects(frame, list(FACTORS), PRIMARY_RESPONSE)}
    assert found["pre_tlbi"].verdict == NONE


def test_a_fraction_reports_its_aliases() -> None:
    """2^(4-1) with D = ABC: two-factor interactions come in aliased pairs (AB = CD)."""
    conditions = []
    for levels in _full(FACTORS):
        signs = [levels["mmu"] == "1", levels["leaf"] == "4k", levels["pre_tlbi"] == "1"]
        conditions.append(levels | {"ng": "1" if sum(not s for s in signs) % 2 == 0 else "0"})
    frame = _campaign(np.random.default_rng(4), conditions, _injected, 2)
    found = {e.term: e for e in effects(frame, varying_factors(frame), PRIMARY_RESPONSE)}
    assert found["leaf x mmu"].aliases == ("ng x pre_tlbi",)
    assert found["mmu"].aliases == ()
    # The injected mmu x leaf interaction shows in its alias too: they are one column.
    assert found["ng x pre_tlbi"].ratio == pytest.approx(found["leaf x mmu"].ratio)


def test_one_boot_per_condition_gives_no_interval() -> None:
    """Without two boots of a condition there is no spread between boots: no verdict."""
    frame = _campaign(np.random.default_rng(5), _full(FACTORS), _injected, 1)
    assert all(math.isnan(e.ci_low) for e in effects(frame, list(FACTORS), PRIMARY_RESPONSE))


DOSES = ("0", "4", "16", "64", "256", "1024")
SHAPES = {
    "flat": lambda d: 0.0,
    "linear": lambda d: 0.7 * d / 1024,
    "saturating": lambda d: 0.7 * (1 - math.exp(-d / 40)),
    "step": lambda d: 0.7 * (d >= 64),
}


def _dose_campaign(rng: np.random.Generator, shape: str, replicates: int = 4) -> pl.DataFrame:
    """A dose sweep over `pages` with the shape's log effect injected."""
    conditions = [{"pages": d} for d in DOSES]
    return _campaign(rng, conditions, lambda lv: SHAPES[shape](int(lv["pages"])), replicates)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_dose_response_shape_and_curve_recovered(shape: str) -> None:
    """Each injected shape is chosen, and the true curve lies inside the fitted band."""
    frame = _dose_campaign(np.random.default_rng(6), shape)
    assert dose_factor(frame, varying_factors(frame)) == "pages"
    fit = dose_response(frame, "pages", PRIMARY_RESPONSE)
    assert fit.chosen == shape
    truth = np.exp([SHAPES[shape](int(d)) for d in DOSES])
    inside = (fit.curve["low"].to_numpy() <= truth) & (truth <= fit.curve["high"].to_numpy())
    assert inside.sum() >= len(DOSES) - 1
    assert fit.top_low <= truth[-1] / truth[0] <= fit.top_high


def test_flat_dose_is_rarely_given_a_shape() -> None:
    """Flat sweeps: a shape other than flat (or undecided) in the stated few of them."""
    rng = np.random.default_rng(8)
    wrong = sum(
        dose_shapes(_dose_campaign(rng, "flat"), "pages", PRIMARY_RESPONSE)[1] != "flat"
        for _ in range(NULL_SWEEPS)
    )
    # The rate the report states is this count: a change of the rule must restate it.
    assert wrong == NULL_SWEEPS_SHAPED
    assert wrong / NULL_SWEEPS < 0.1


def test_undecided_when_two_shapes_fit_alike() -> None:
    """Three doses cannot tell a step from a saturation: the rule says undecided, or flat."""
    frame = _campaign(
        np.random.default_rng(9),
        [{"pages": d} for d in ("0", "64", "1024")],
        lambda lv: 0.7 * (int(lv["pages"]) >= 64),
        4,
    )
    chosen = dose_response(frame, "pages", PRIMARY_RESPONSE).chosen
    assert chosen.startswith(UNDECIDED) and "saturating" in chosen and "step" in chosen


def test_factor_levels_from_collect_options() -> None:
    """Knobs, backing and the options a design varies, as the manifest records them."""
    options = {"knobs": ["mmu=1", "pages=64"], "backing": "thp", "touch_kb": [], "runs": 4}
    assert factor_levels(options) == {"mmu": "1", "pages": "64", "backing": "thp"}


def test_bundles_of_one_boot_and_condition_are_one_unit() -> None:
    """Two boots per condition, each boot holding three bundles: six bundles, two units,
    the df between boots (2), not between bundles (10); the unit is their mean log ratio."""
    rows, ids = [], []
    for level in ("0", "1"):
        for boot in range(2):
            for cell in range(3):
                value = math.exp(0.1 * boot + 0.01 * cell + (0.5 if level == "1" else 0))
                rows.append((f"{level}-{boot}-{cell}", {"mmu": level}, {PRIMARY_RESPONSE: value}))
                ids.append(f"boot-{level}-{boot}")
    frame = campaign_frame(rows, ids)
    (effect,) = effects(frame, ["mmu"], PRIMARY_RESPONSE)
    assert effect.boots == 4 and effect.df == 2
    assert effect.ratio == pytest.approx(math.exp(0.5))
    assert boot_lines(frame, ["mmu"]) == ["bundles of one boot and condition count as one boot"]


def test_an_interaction_reads_as_the_ratio_of_the_effects() -> None:
    """mmu x2 at 1g and x3 at 4k, no noise: 'leaf x mmu' is x1.5 (3 / 2), the ratio of
    mmu's effect at 4k to its effect at 1g, not its square root."""
    after = {("0", "1g"): 1.0, ("1", "1g"): 2.0, ("0", "4k"): 1.3, ("1", "4k"): 3.9}
    rows = [
        (f"{mmu}-{leaf}-{r}", {"mmu": mmu, "leaf": leaf}, {PRIMARY_RESPONSE: value})
        for (mmu, leaf), value in after.items()
        for r in range(2)
    ]
    found = {e.term: e for e in effects(campaign_frame(rows), ["leaf", "mmu"], PRIMARY_RESPONSE)}
    assert found["leaf x mmu"].ratio == pytest.approx(3.0 / 2.0)
    assert found["mmu"].ratio == pytest.approx(math.sqrt(2.0 * 3.0))
