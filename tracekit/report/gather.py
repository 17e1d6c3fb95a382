"""What every renderer gathers across sections: lost events, unknowns, verdict rules."""

from __future__ import annotations

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


def verdict_rules(section: Section) -> list[str]:
    """The distinct verdict rules the section's comparisons were judged by."""
    return list(dict.fromkeys(c.thresholds.rule() for c in section.comparisons))
