"""A campaign over guest knobs and options: which factor changes the effect, and how much.

Each bundle is one cell; its factor levels are the knobs and options it was collected with
(its manifest), its responses its after/before ratios, its boot its host.boot_id (cells
of one boot are one unit, not replicates). The numbers come from
tracekit.analysis.factorial; this section only lays them out.
"""

from __future__ import annotations

import math
from dataclasses import replace

import polars as pl

from tracekit.analysis.factorial import (
    FOUND,
    RESPONSES,
    DoseResponse,
    Effect,
    boot_lines,
    boot_responses,
    campaign_frame,
    chance_finds,
    dose_factor,
    dose_response,
    effect_rule,
    effects,
    factor_levels,
    setting_groups,
    setting_label,
    shape_rule,
    varying_factors,
)
from tracekit.ingest.bundle import BundleData
from tracekit.report.header import bundle_condition_of, bundle_label
from tracekit.report.model import Plot, Section, Table

SHORT = {RESPONSES[0]: "p99.9", RESPONSES[1]: "probe"}


def section(bundles: list[BundleData]) -> Section | None:
    """Effects (or a dose-response) per group of bundles alike but for the factors."""
    if len(bundles) < 2:
        return None
    conditions = [bundle_condition_of(b) for b in bundles]
    groups = setting_groups(conditions)
    if len(groups) == 1:
        return _group_section(bundles)
    made = [(setting_label(conditions, g), _group_section([bundles[i] for i in g])) for g in groups]
    alone = [label for (label, part), g in zip(made, groups, strict=True) if part is None]
    parts = [(label, part) for label, part in made if part is not None]
    if not parts:
        return None
    return _merged(parts, alone)


def _group_section(bundles: list[BundleData]) -> Section | None:
    """One group's effects or dose-response; None unless its bundles differ in a factor."""
    if len(bundles) < 2:
        return None
    frame = campaign_frame(
        [_boot(b) for b in bundles], [_boot_id(b.manifest.host) for b in bundles]
    )
    factors = varying_factors(frame)
    if not factors:
        return None
    measured = [r for r in RESPONSES if frame[r].drop_nulls().len() > 0]
    dose = dose_factor(frame, factors)
    if dose is not None:
        return _dose_section(frame, dose, measured)
    return _effects_section(frame, factors, measured)


def _merged(parts: list[tuple[str, Section]], alone: list[str]) -> Section:
    """One section of the groups' sections, each finding and table named by its group."""
    findings = ["bundles that differ in more than the factors are never pooled: effects per group"]
    tables, plots, unknowns = [], [], []
    for label, part in parts:
        findings += [f"[{label}] {line}" for line in part.findings]
        tables += [replace(t, title=f"[{label}] {t.title}") for t in part.tables]
        plots += [replace(p, title=f"[{label}] {p.title}") for p in part.plots]
        unknowns += [f"[{label}] {line}" for line in part.unknowns]
    unknowns += [
        f"[{label}]: no effect, its bundles do not differ in a factor (or it is one bundle)"
        for label in alone
    ]
    title = parts[0][1].title if len({p.title for _, p in parts}) == 1 else _MIXED_TITLE
    return Section(
        key="factorial",
        title=title,
        findings=findings,
        tables=tables,
        plots=plots,
        unknowns=unknowns,
    )


_MIXED_TITLE = "Campaign: effects and dose-responses of the factors (boot = unit)"


def _boot(data: BundleData) -> tuple[str, dict[str, str], dict[str, float | None]]:
    """One bundle as a boot of the campaign: its label, factor levels and responses."""
    levels = factor_levels(data.manifest.options)
    return bundle_label(data), levels, boot_responses(data.latencies, data.probes)


def _boot_id(host: dict[str, object]) -> str | None:
    """The boot a bundle was collected in (host.boot_id), None where it is not recorded."""
    value = host.get("boot_id")
    return value if isinstance(value, str) and value else None


def _counted(frame: pl.DataFrame) -> str:
    """'N bundles from M boots' (boots as the analysis counts them)."""
    bundles, boots = frame.height, frame["boot"].n_unique()
    return f"{bundles} bundle{'s' * (bundles != 1)} from {boots} boot{'s' * (boots != 1)}"


def _effects_section(frame: pl.DataFrame, factors: list[str], measured: list[str]) -> Section:
    """Main effects and interactions of every measured response, as tables and a plot."""
    found = [e for r in measured for e in effects(frame, factors, r)]
    findings = [f"{_counted(frame)} over {', '.join(factors)}; {effect_rule()}"]
    findings += boot_lines(frame, factors)
    findings += [_effect_line(e) for e in found if e.verdict == FOUND]
    if not any(e.verdict == FOUND for e in found):
        findings.append("no main effect or interaction found on any response")
    tested, by_chance = chance_finds(found)
    if tested:
        findings.append(
            f"{tested} effects tested over {len(measured)} responses: a campaign with no"
            f" effect at all would call about {by_chance:.1f} of them found by chance"
            " (each at the rule's own false-positive rate, not adjusted for the number of tests)"
        )
    return Section(
        key="factorial",
        title="Campaign: effects of the factors (after/before ratios, boot = unit)",
        findings=findings,
        tables=[_effects_table(found, r, _counted(frame)) for r in measured],
        plots=[_effects_plot(found, r) for r in measured],
        unknowns=_effect_unknowns(found),
    )


def _effect_line(e: Effect) -> str:
    """One found effect in a sentence."""
    what = f"{e.term} {e.contrast}".strip()
    alias = f" (aliased with {', '.join(e.aliases)})" if e.aliases else ""
    return (
        f"{SHORT[e.response]}: {what} x{e.ratio:.2f} [{e.ci_low:.2f}, {e.ci_high:.2f}]{alias}:"
        f" {e.verdict}"
    )


def _effects_table(found: list[Effect], response: str, counted: str) -> Table:
    """term, contrast, ratio, interval, verdict, aliases: narrow enough for 72 columns."""
    rows = [e for e in found if e.response == response]
    frame = pl.DataFrame(
        {
            "term": [e.term for e in rows],
            "levels": [e.contrast or "-" for e in rows],
            "x": [round(e.ratio, 2) for e in rows],
            "95% CI": [_interval(e) for e in rows],
            "verdict": [e.verdict for e in rows],
            "aliases": [",".join(e.aliases) or "-" for e in rows],
        }
    )
    df = rows[0].df if rows else 0
    return Table(
        f"{response}: effects as factors",
        frame,
        note=f"{counted}, {df} degrees of freedom between boots; x1 = no effect",
    )


def _interval(e: Effect) -> str:
    """An interval as text, '-' without one."""
    return "-" if math.isnan(e.ci_low) else f"{e.ci_low:.2f}-{e.ci_high:.2f}"


def _effects_plot(found: list[Effect], response: str) -> Plot:
    """Each effect's ratio on its interval around x1."""
    rows = [e for e in found if e.response == response]
    frame = pl.DataFrame(
        {
            "term": [f"{e.term} {e.contrast}".strip() for e in rows],
            "ratio": [e.ratio for e in rows],
            "low": [e.ci_low for e in rows],
            "high": [e.ci_high for e in rows],
        }
    )
    return Plot(
        f"{response}: effects with their 95% intervals",
        "intervals",
        frame,
        x="ratio",
        y="term",
        x_label="effect as a factor on the after/before ratio (x1: none)",
    )


def _effect_unknowns(found: list[Effect]) -> list[str]:
    """Aliased effects and missing intervals: what the campaign cannot separate."""
    out = []
    aliased = sorted({e.term for e in found if e.aliases})
    if aliased:
        out.append(
            f"which of each aliased set acts ({', '.join(aliased)}): a fraction estimates them"
            " together; run the other half-fraction or a full factorial to separate them"
        )
    if any(math.isnan(e.ci_low) for e in found):
        out.append(
            "effect intervals: no condition was run on two boots, so there is no spread"
            " between boots; run 2 or more replicates of each condition, each in a boot"
            " of its own"
        )
    return out


def _dose_section(frame: pl.DataFrame, dose: str, measured: list[str]) -> Section:
    """The dose-response of each measured response: shape, fitted curve and band."""
    fits = [dose_response(frame, dose, r) for r in measured]
    findings = [f"{_counted(frame)} over {dose}; {shape_rule()}"]
    findings += boot_lines(frame, [dose])
    findings += [
        f"{SHORT[f.response]} over {dose}: {f.chosen}; highest dose vs lowest x{f.top_ratio:.2f}"
        f" [{f.top_low:.2f}, {f.top_high:.2f}]"
        for f in fits
    ]
    tables = []
    for fit in fits:
        tables.append(Table(f"{fit.response} over {dose}: fitted ratio", _curve_table(fit)))
        tables.append(Table(f"{fit.response} over {dose}: shapes", _shape_table(fit)))
    return Section(
        key="factorial",
        title=f"Campaign: dose-response over {dose} (after/before ratios, boot = unit)",
        findings=findings,
        tables=tables,
        plots=[_dose_plot(frame, fit) for fit in fits],
        unknowns=[
            f"{SHORT[f.response]}: which shape the response follows ({f.chosen})"
            for f in fits
            if f.chosen.startswith("undecided")
        ],
    )


def _curve_table(fit: DoseResponse) -> pl.DataFrame:
    """dose, fitted ratio and its band."""
    return fit.curve.select(
        pl.col("dose"), pl.col("ratio").round(3), pl.col("low").round(3), pl.col("high").round(3)
    )


def _shape_table(fit: DoseResponse) -> pl.DataFrame:
    """Each shape's parameter count, AICc and distance from the best."""
    best = min(f.aicc for f in fit.fits)
    return pl.DataFrame(
        {
            "shape": [f.shape for f in fit.fits],
            "params": [f.parameters for f in fit.fits],
            "AICc": [round(f.aicc, 2) for f in fit.fits],
            "dAICc": [round(f.aicc - best, 2) for f in fit.fits],
        }
    )


def _dose_plot(frame: pl.DataFrame, fit: DoseResponse) -> Plot:
    """The fitted curve, its band, and each dose's mean boot ratio."""
    curve = fit.curve
    observed = (
        frame.filter(pl.col(fit.response).is_not_null())
        .group_by(pl.col(fit.dose).cast(pl.Float64).alias("dose"))
        .agg(pl.col(fit.response).log().mean().exp().alias("ratio"))
    )
    series = {"ratio": f"fit ({fit.chosen})", "low": "band low", "high": "band high"}
    long = pl.concat(
        [
            *(
                curve.select("dose", pl.col(c).alias("ratio"), pl.lit(name).alias("series"))
                for c, name in series.items()
            ),
            observed.select("dose", "ratio", pl.lit("boots (geometric mean)").alias("series")),
        ]
    )
    return Plot(
        f"{fit.response} against {fit.dose}",
        "xy",
        long,
        x="dose",
        y="ratio",
        series="series",
        x_label=fit.dose,
        y_label="after/before ratio",
    )
