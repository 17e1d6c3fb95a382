"""What every renderer gathers across sections: lost events, unknowns, verdict rules."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from tracekit.analysis.compare import Comparison
from tracekit.report.model import Report, Section

# The details' last part, where every section's unknowns are listed in full.
NOT_KNOWN_PART = "What is not known"
# The result's own unknowns the lead states in full; the rest are counted in one line.
LEAD_RESULT_UNKNOWNS = 3


class LeadPart(NamedTuple):
    """One part of the lead: its title, its lines, and a note said with the title."""

    title: str
    items: list[str]
    note: str = ""


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
    return [item for _, _, items in unknowns_by_section(report) for item in items]


def unknowns_by_section(report: Report) -> list[tuple[int, Section, list[str]]]:
    """Each section's unknowns not said by an earlier one, with its number in the details."""
    seen: set[str] = set()
    out = []
    for number, section in enumerate(report.sections, 1):
        items = [u for u in dict.fromkeys(section.unknowns) if u not in seen]
        seen.update(items)
        if items:
            out.append((number, section, items))
    return out


def not_known_number(report: Report) -> int:
    """The number of the details' part that lists every unknown: after the sections."""
    return len(report.sections) + 1


def not_known_lines(report: Report) -> list[str]:
    """The lead's not-known part: what bears on the result, then one line per section.

    The result's sections (those with headline comparisons) give their unknowns in full,
    up to LEAD_RESULT_UNKNOWNS, but not one the result already says; every other section
    is one line with its count. The details' last part lists them all.
    """
    lines: list[str] = []
    for number, section, items in unknowns_by_section(report):
        own = [u for u in items if not said_by_result(u, section)]
        shown = own[:LEAD_RESULT_UNKNOWNS] if section.headline else []
        lines += shown
        if len(own) > len(shown):
            lines.append(f"{number}. {section.title}: {_count_items(own, shown)}")
    return lines


def _count_items(own: list[str], shown: list[str]) -> str:
    """How many of a section's items the lead leaves to the details: "2 items", "1 more"."""
    rest = len(own) - len(shown)
    if shown:
        return f"{rest} more"
    return f"{rest} item" + ("s" if rest > 1 else "")


def said_by_result(item: str, section: Section) -> bool:
    """True when the item is a headline comparison's shortfall its result line states.

    Each verdict once: "2+2 quiet runs cannot reach a verdict; the rule needs 4+4" says
    again what "(..., 2+2 runs): inconclusive; needs 4+4 runs to show an effect" said,
    and a saturated rt CPU's reason (no_verdict) is said by its result line too.
    """
    return any(
        (c.no_verdict and c.no_verdict in item)
        or (
            c.needed_runs is not None
            and f"{c.n_before}+{c.n_after} " in item
            and f"needs {c.needed_runs}+{c.needed_runs}" in item
        )
        for c in section.headline
    )


def not_known_note(report: Report) -> str:
    """Where the lead's not-known part is said in full, with how many items it has."""
    count = len(unknowns(report))
    if not count:
        return ""
    items = "item" if count == 1 else "items"
    return f"{count} {items}, all in Details, {not_known_number(report)}. {NOT_KNOWN_PART}"


def verdict_rules(report: Report) -> list[str]:
    """The distinct verdict rules the report's comparisons were judged by (said once)."""
    every = (c for s in report.sections for c in (*s.headline, *s.comparisons))
    return list(dict.fromkeys(c.thresholds.rule() for c in every))


def lead(report: Report) -> list[LeadPart]:
    """The lead every format draws after the warnings and contradictions, in this order."""
    known = not unknowns(report)
    return [
        LeadPart("question", [report.question] if report.question else []),
        LeadPart("setup", list(report.header)),
        LeadPart("result", result_lines(report), result_note(report)),
        LeadPart("controls", list(report.controls)),
        LeadPart(
            "not known",
            ["nothing the sections listed"] if known else not_known_lines(report),
            not_known_note(report),
        ),
    ]


def result_lines(report: Report) -> list[str]:
    """The headline comparisons with their spread, the rule that judged them, lost events.

    Several bundles' comparisons that share their test, runs and ratio are one line per
    bundle, the shared parts said once in the part's note (`result_note`).
    """
    grouped = _by_subject(headline(report))
    if grouped is not None:
        lines = [f"{subject}: " + "; ".join(c.terse() for c in cs) for subject, cs in grouped]
    else:
        lines = [" ".join(c.describe().split()) for c in headline(report)]
    if not lines:
        lines = ["no before/after verdict in these bundles: the details give their numbers"]
    return [*lines, *result_notes(report)]


def result_note(report: Report) -> str:
    """What every result line shares when they are one line per bundle, else ""."""
    if _by_subject(headline(report)) is None:
        return ""
    c = headline(report)[0]
    needs = f"; a verdict needs {c.needed_runs}+{c.needed_runs}" if c.needed_runs else ""
    return f"{c.ratio_label}, {c.test}, {c.n_before}+{c.n_after} runs per bundle{needs}"


def _by_subject(found: list[Comparison]) -> list[tuple[str, list[Comparison]]] | None:
    """The comparisons by bundle (the `label: ` their metric starts with), each without
    it, when they are of several bundles and share test, runs, ratio and runs needed."""
    shared = {(c.test, c.n_before, c.n_after, c.ratio_label, c.needed_runs) for c in found}
    split = [(c.metric.rpartition(": ")[0], c) for c in found]
    if len(shared) != 1 or len({s for s, _ in split}) < 2 or not all(s for s, _ in split):
        return None
    groups: dict[str, list[Comparison]] = {}
    for subject, c in split:
        groups.setdefault(subject, []).append(replace(c, metric=c.metric[len(subject) + 2 :]))
    return list(groups.items())


def headline(report: Report) -> list[Comparison]:
    """Every section's headline comparisons, in report order."""
    return [c for s in report.sections for c in s.headline]


def result_notes(report: Report) -> list[str]:
    """What qualifies the result: the verdict rules, then the lost events."""
    return [*(f"verdict rule: {r}" for r in verdict_rules(report)), lost_events_line(report)]


def comparisons_note(section: Section) -> str:
    """What the details' comparison lines leave out: their tests and the runs they need."""
    tests = ", ".join(dict.fromkeys(c.test for c in section.comparisons))
    ordered = sorted((c for c in section.comparisons if c.needed_runs), key=_needed)
    needs = ", ".join(dict.fromkeys(str(c.needs()) for c in ordered))
    return f"({tests}" + (f"; a verdict needs {needs}" if needs else "") + ")"


def _needed(comparison: Comparison) -> int:
    """The runs a comparison needs (sorting key)."""
    return comparison.needed_runs or 0
