"""The decision table across bundles: the effect per condition and the conclusions it allows.

Thin: conditions come from tracekit/analysis/conditions.py, effects and rules from
tracekit/analysis/decision.py. One bundle has nothing to decide between: None.
"""

from __future__ import annotations

import math
from dataclasses import replace

import polars as pl

from tracekit.analysis.beforeafter import PRIMARY, saturated
from tracekit.analysis.compare import ABSENT, INCONCLUSIVE, PRESENT, runs_to_decide
from tracekit.analysis.conditions import (
    FIELD_LABELS,
    Condition,
    varying_fields,
)
from tracekit.analysis.decision import (
    Conclusion,
    ConditionEffect,
    conclusions,
    condition_effects,
    decision_table,
    describe_conclusion,
    field_names,
)
from tracekit.bundle import RunKind
from tracekit.ingest.bundle import BundleData
from tracekit.report.header import bundle_condition_of, bundle_label
from tracekit.report.model import Plot, Section, Table
from tracekit.report.sections.beforeafter import interval_of


def section(bundles: list[BundleData]) -> Section | None:
    """Per condition the primary metric's effect; conclusions stated with their rules."""
    if len(bundles) < 2:
        return None
    groups, unknowns = condition_groups(bundles, "the decision table")
    if not groups:
        return None
    effects = condition_effects(groups, saturated=saturated_labels(bundles))
    varying = varying_fields(list(groups))
    found = conclusions(effects)
    findings = [_summary(effects, varying)]
    findings += [describe_conclusion(c, varying) for c in found if c.settled]
    findings += _where(found)
    findings += [describe_conclusion(c, varying) for c in found if not c.settled]
    findings += _short(effects, varying)
    if not found:
        unknowns.append(
            "no two conditions differ in exactly one field with verdicts a rule names, so no"
            " conclusion follows; record bundles that vary one thing at a time"
        )
    return Section(
        key="decision",
        title=f"Decision table: effect on cyclictest {PRIMARY} per condition",
        findings=findings,
        comparisons=[
            replace(e.comparison, metric=f"{e.condition.label(varying)}: {e.comparison.metric}")
            for e in effects
        ],
        tables=[
            Table(
                "effect after/before per condition (quiet runs)",
                decision_table(effects, varying),
                note=_note(effects, varying),
            )
        ],
        plots=[_plot(effects, varying)],
        unknowns=unknowns,
        lost_events=None,
    )


def condition_groups(
    bundles: list[BundleData], what: str
) -> tuple[dict[Condition, list[tuple[str, pl.DataFrame]]], list[str]]:
    """The bundles with quiet runs before and after, by condition; the others, said."""
    groups: dict[Condition, list[tuple[str, pl.DataFrame]]] = {}
    unknowns = []
    for data in bundles:
        if _has_quiet_phases(data):
            groups.setdefault(bundle_condition_of(data), []).append(
                (bundle_label(data), data.latencies)
            )
        else:
            unknowns.append(
                f"{bundle_label(data)}: left out of {what} (no quiet runs both"
                " before and after the guest)"
            )
    return groups, unknowns


def saturated_labels(bundles: list[BundleData]) -> list[str]:
    """The bundles whose quiet runs saturated the rt CPU (analysis.beforeafter.saturated)."""
    return [
        bundle_label(data)
        for data in bundles
        if saturated(
            data.latencies.filter(pl.col("kind") == RunKind.QUIET.value), interval_of(data)
        )
    ]


def _has_quiet_phases(data: BundleData) -> bool:
    """Whether the bundle has quiet runs before and after the guest."""
    quiet = data.latencies.filter(pl.col("kind") == RunKind.QUIET.value)
    return {"before", "after"} <= set(quiet["phase"].unique())


def _summary(effects: list[ConditionEffect], varying: tuple[str, ...]) -> str:
    """Which conditions show the effect, which do not, which cannot tell yet."""
    parts = []
    for verdict in (PRESENT, ABSENT, INCONCLUSIVE):
        names = [e.condition.label(varying) for e in effects if e.comparison.verdict == verdict]
        if names:
            parts.append(f"{verdict}: {', '.join(names)}")
    return f"Effect on cyclictest {PRIMARY} by condition: " + "; ".join(parts) + "."


def _where(found: list[Conclusion]) -> list[str]:
    """What the settled conclusions imply, each only what its own contrast shows."""
    implied = list(dict.fromkeys(c.implies for c in found if c.settled))
    if not implied:
        return []
    return ["What the settled rules above imply, each no more: " + "; ".join(implied) + "."]


def _short(effects: list[ConditionEffect], varying: tuple[str, ...]) -> list[str]:
    """Inconclusive conditions, and how many runs a verdict would need."""
    out = []
    for e in effects:
        c = e.comparison
        if c.no_verdict:
            out.append(
                f"{e.condition.label(varying)}: {c.verdict} with {c.n_before}+{c.n_after}"
                f" {e.unit}; no run count makes this a verdict: {c.no_verdict}"
            )
        elif c.needed_runs is not None:
            out.append(
                f"{e.condition.label(varying)}: {INCONCLUSIVE} with {c.n_before}+{c.n_after}"
                f" {e.unit}; the rule needs {c.needed_runs}+{c.needed_runs}"
            )
        elif c.verdict == INCONCLUSIVE and (n := runs_to_decide(c)) is not None:
            out.append(
                f"{e.condition.label(varying)}: {INCONCLUSIVE} with {c.n_before}+{c.n_after}"
                f" {e.unit}; about {n}+{n} would decide it if the spread stays as measured"
            )
    return out


def _note(effects: list[ConditionEffect], varying: tuple[str, ...]) -> str:
    """How to read the table: what the condition column shows, the rest held equal."""
    fixed = [
        f"{label} {getattr(effects[0].condition, name)}"
        for name, label in FIELD_LABELS.items()
        if name not in varying
    ]
    text = f"condition: {field_names(varying)}; each row is its own primary comparison"
    return text + (f"; same in all: {', '.join(fixed)}" if fixed else "")


def _plot(effects: list[ConditionEffect], varying: tuple[str, ...]) -> Plot:
    """Ratio per condition as a point on its interval, against the line of no change."""
    rows = [
        (
            e.condition.label(varying),
            e.comparison.ratio,
            # A 1+1 comparison has no interval: its point is drawn alone.
            *(v if math.isfinite(v) else None for v in (e.comparison.ci_low, e.comparison.ci_high)),
        )
        for e in effects
    ]
    frame = pl.DataFrame(rows, schema=["condition", "ratio", "low", "high"], orient="row")
    return Plot(
        f"cyclictest {PRIMARY} after/before per condition, with its 95% CI",
        "intervals",
        frame,
        x="ratio",
        y="condition",
        x_label="after/before (1 = no change)",
    )
