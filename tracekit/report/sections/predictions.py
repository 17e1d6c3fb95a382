"""Which simulated-mechanism models the data rules out: each shipped model's predictions
held against the decision table's verdicts (tracekit/simulate/predict.py).

Thin: verdicts come from tracekit/analysis/decision.py, predictions and the check from
tracekit/simulate/predict.py. Only bundles that can test a model take part (a board's, a
simulated one's; conditions.tests_models): none, or none with quiet runs before and after:
None.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis.conditions import (
    UNTESTED_BY,
    Condition,
    simulated_label,
    tests_models,
    varying_fields,
)
from tracekit.analysis.decision import condition_effects
from tracekit.ingest.bundle import BundleData
from tracekit.report.header import bundle_label, is_emulated
from tracekit.report.model import Section, Table
from tracekit.report.sections.decision import condition_groups
from tracekit.simulate.model import load_model, shipped_models
from tracekit.simulate.predict import OBSERVABLES, RT_WAKEUPS, ModelCheck, check_model

UNPREDICTED = (
    "the models' predictions follow from the instructions each kernel executes"
    " (tracekit/simulate/predict.py, EXECUTED); an action on a kernel not counted"
    " there is predicted unknown"
)
NOT_AS_MODELLED = (
    "its model clears by cpu-on and the plugin did not see its power-ons where the kernel"
    " enters (the simulated-effect section says why), so its data answer to no model"
)
NOTE = (
    "the verdicts are the decision table's, on the rt CPU's cyclictest, so each model's"
    " prediction is for that CPU, which issues no broadcast TLBI: a model whose cost only"
    " issuers pay predicts no effect there;"
    " a model is refuted by a condition whose verdict is the opposite of its prediction;"
    " inconclusive conditions and conditions it cannot predict decide nothing; consistent"
    " means no condition refutes it and at least one agrees, never that it is the cause"
)


def section(bundles: list[BundleData]) -> Section | None:
    """Per shipped model: consistent, refuted (by which conditions) or untested."""
    # Split once, not by `in` afterwards (BundleData's == would compare its tables).
    can = [tests_models(is_emulated(b), simulated_label(b.manifest)) for b in bundles]
    unapplied = [b.not_as_modelled() for b in bundles]
    testing = [b for b, yes, no in zip(bundles, can, unapplied, strict=True) if yes and not no]
    groups, unknowns = condition_groups(testing, "the model predictions")
    if not groups:
        return None
    unknowns += [
        f"{bundle_label(b)}: left out of the model predictions: "
        + (NOT_AS_MODELLED if no else UNTESTED_BY)
        for b, yes, no in zip(bundles, can, unapplied, strict=True)
        if no or not yes
    ]
    effects = condition_effects(groups)
    observed = [(e.condition, e.comparison.verdict) for e in effects]
    varying = _shown_fields(list(groups))
    checks = [check_model(load_model(name), observed, RT_WAKEUPS) for name in shipped_models()]
    findings = [_finding(c, varying) for c in checks]
    refuted = [c.model.name for c in checks if c.status == "refuted"]
    if refuted:
        findings.insert(
            0,
            f"The data rules out {len(refuted)} model(s): {', '.join(refuted)}, each by its"
            " predictions on the rt CPU's wake-ups (below: what each predicted, and why).",
        )
    return Section(
        key="predictions",
        title="Simulated-mechanism models against the data",
        findings=findings,
        tables=[
            Table(
                f"prediction and verdict per model and condition, on {OBSERVABLES[RT_WAKEUPS]}",
                _table(checks, varying),
                NOTE,
            )
        ],
        unknowns=[*unknowns, UNPREDICTED],
        lost_events=None,
    )


def _shown_fields(conditions: list[Condition]) -> tuple[str, ...]:
    """The fields whose recorded values differ (unknown everywhere is not a difference)."""
    varying = varying_fields(conditions)
    shown = tuple(f for f in varying if len({str(getattr(c, f)) for c in conditions}) > 1)
    return shown or ("variant", "after_guest")


def _finding(check: ModelCheck, varying: tuple[str, ...]) -> str:
    """One sentence per model: its status and the conditions that decide it."""
    by = [c.prediction.condition.label(varying) for c in check.refuting]
    agree = [c.prediction.condition.label(varying) for c in check.cells if c.outcome == "agrees"]
    parts = [f"{check.model.label}: {check.status}"]
    if by:
        # Why the first refuting cell's prediction was what it was: a model is ruled out
        # by where its cost lands as much as by what creates or clears its state.
        first = check.refuting[0].prediction
        parts.append(f"refuted by {', '.join(by)} (it predicted {first.verdict}: {first.why})")
    if agree:
        parts.append(f"agrees with {', '.join(agree)}")
    return "; ".join(parts) + "."


def _table(checks: list[ModelCheck], varying: tuple[str, ...]) -> pl.DataFrame:
    """model, condition, predicted, size, observed, outcome."""
    rows = [
        {
            "model": check.model.name,
            "condition": cell.prediction.condition.label(varying),
            "predicted": cell.prediction.verdict,
            "size": cell.prediction.size,
            "observed": cell.observed,
            "outcome": cell.outcome,
        }
        for check in checks
        for cell in check.cells
    ]
    return pl.DataFrame(
        rows,
        schema={
            k: pl.String for k in ("model", "condition", "predicted", "size", "observed", "outcome")
        },
    )
