"""What every renderer gathers across sections: lost events, unknowns, verdict rules."""

from __future__ import annotations

from tracekit.analysis.compare import Comparison
from tracekit.report.model import Report, Section


def warnings_line(report: Report) -> str:
    """The report's first line: every warning that applies, or "" when none does."""
    return " ".join(report.warnings)


def contradiction_lines(report: Report) -> list[str]:
    """Findings that contradict the setup, each said as such (they follow the warnings)."""
    return [f"CONTRADICTS THE SETUP: {c}" for c in report.contradictions]


def lost_events_line(report: Report) -> str:
    """Lost trace events of every section that used traces, or that none did."""
    used = [(s.title, s.lost_events) for s in report.sections if s.lost_events is not None]
    if not used:
        return "lost trace events: no section used traces"
    # A run whose trace two sections used is counted once; sections without a per-run
    # account add their own total.
    per_run: dict[str, int] = {}
    for s in report.sections:
        per_run |= s.lost_by_run
    unkeyed = (s.lost_events or 0 for s in report.sections if not s.lost_by_run)
    total = sum(per_run.values()) + sum(unkeyed)
    if total == 0:
        return f"lost trace events: none (in the traces of {len(used)} section(s))"
    parts = "; ".join(f"{title}: {n}" for title, n in used if n)
    return f"lost trace events: {total} ({parts})"


def unknowns(report: Report) -> list[str]:
    """Every section's unknowns, in report order, each said once."""
    seen: dict[str, None] = {}
    for section in report.sections:
        for item in section.unknowns:
            seen.setdefault(item, None)
    return list(seen)


def verdict_rules(report: Report) -> list[str]:
    """The distinct verdict rules the report's comparisons were judged by (said once)."""
    every = (c for s in report.sections for c in (*s.headline, *s.comparisons))
    return list(dict.fromkeys(c.thresholds.rule() for c in every))


def lead(report: Report) -> list[tuple[str, list[str]]]:
    """The lead every format draws after the warnings and contradictions, in this order."""
    return [
        ("question", [report.question] if report.question else []),
        ("setup", list(report.header)),
        ("result", result_lines(report)),
        ("controls", list(report.controls)),
        ("not known", unknowns(report) or ["nothing the sections listed"]),
    ]


def result_lines(report: Report) -> list[str]:
    """The headline comparisons with their spread, the rule that judged them, lost events."""
    lines = [" ".join(c.describe().split()) for c in headline(report)]
    if not lines:
        lines = ["no before/after verdict in these bundles: the details give their numbers"]
    return [*lines, *result_notes(report)]


def headline(report: Report) -> list[Comparison]:
    """Every section's headline comparisons, in report order."""
    return [c for s in report.sections for c in s.headline]


def result_notes(report: Report) -> list[str]:
    """What qualifies the result: the verdict rules, then the lost events."""
    return [*(f"verdict rule: {r}" for r in verdict_rules(report)), lost_events_line(report)]


def comparisons_note(section: Section) -> str:
    """What the details' comparison lines leave out: their tests and the runs they need."""
    tests = ", ".join(dict.fromkeys(c.test for c in section.comparisons))
    needed = sorted({c.needed_runs for c in section.comparisons if c.needed_runs})
    needs = ", ".join(f"{n}+{n}" for n in needed)
    return f"({tests}" + (f"; a verdict needs {needs} runs" if needs else "") + ")"
