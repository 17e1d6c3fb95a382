"""The terminal report: header, then each section's findings, tables and verdicts.

Draws a `Report` (tracekit/report/assemble.py); an emulated host is said in the first
line, since its timings are not hardware timings.
"""

from __future__ import annotations

import textwrap

from tracekit.report.ascii import table_lines
from tracekit.report.gather import lost_events_line, verdict_rules
from tracekit.report.model import Report, Section

WIDTH = 72


def render_text(report: Report) -> str:
    """The whole text report."""
    lines = [_wrap(line) for line in report.lead()]
    for section in report.sections:
        lines += ["", *_section(section)]
    lines += ["", lost_events_line(report)]
    return "\n".join(lines) + "\n"


def _section(section: Section) -> list[str]:
    """One section: title, findings, tables, comparisons with their rule, unknowns."""
    lines = [section.title, "=" * min(len(section.title), WIDTH)]
    lines += [_wrap(f) for f in section.findings]
    for table in section.tables:
        lines += ["", f"{table.title}:", *table_lines(table.frame)]
        if table.note:
            lines.append(_wrap(f"({table.note})"))
    if section.comparisons:
        lines += ["", *(c.describe() for c in section.comparisons)]
        lines += ["", *(_wrap(f"verdict rule: {rule}") for rule in verdict_rules(section))]
    if section.plots:
        titles = ", ".join(p.title for p in section.plots)
        lines += ["", _wrap(f"plots (in --format html): {titles}")]
    if section.unknowns:
        lines += ["", "not known:", *(_wrap(f"- {u}") for u in section.unknowns)]
    if section.lost_events is not None:
        lines.append(f"lost trace events in this section's traces: {section.lost_events}")
    return lines


def _wrap(text: str) -> str:
    """A paragraph wrapped to 72 columns, continuation lines indented."""
    return textwrap.fill(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
