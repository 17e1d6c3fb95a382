"""The report as plain lines, for the terminal (text) and the mailing list (email).

Both draw the same skeleton: one first line with every warning, the findings that
contradict the setup, then the lead (question, setup, result with its spread, controls,
what is not known), then the details: each section's findings, tables and the
comparisons the lead does not state. Each verdict is said once.
"""

from __future__ import annotations

import textwrap

from tracekit.report.ascii import table_lines
from tracekit.report.gather import comparisons_note, contradiction_lines, lead, warnings_line
from tracekit.report.model import Report, Section

WIDTH = 72


def plain_lines(report: Report, table_width: int | None, plots_note: bool) -> list[str]:
    """Every line of the report; `table_width` bounds tables, `plots_note` names plots."""
    first = [warnings_line(report)] if report.warnings else []
    lines = [w for line in [*first, *contradiction_lines(report)] for w in wrap(line)]
    for title, items in lead(report):
        if not items:
            continue
        heading = title[0].upper() + title[1:]
        if len(items) == 1 and title == "question":
            lines += ["", *wrap(f"{heading}: {items[0]}")]
            continue
        lines += ["", f"{heading}:"]
        lines += [w for item in items for w in wrap(item, bullet=True)]
    if report.sections:
        lines += ["", "Details", "=" * len("Details")]
    for number, section in enumerate(report.sections, 1):
        lines += ["", *_section(number, section, table_width, plots_note)]
    return lines


def _section(number: int, section: Section, width: int | None, plots_note: bool) -> list[str]:
    """One numbered section: findings, tables, its comparisons, plots, lost events."""
    lines = wrap(f"{number}. {section.title}")
    lines.append("-" * min(max(len(line) for line in lines), WIDTH))
    for finding in section.findings:
        lines += wrap(finding, bullet=True)
    for table in section.tables:
        lines += ["", *wrap(f"{table.title}:")]
        lines += table_lines(table.frame, width)
        if table.note:
            lines += wrap(f"({table.note})")
    if section.comparisons:
        lines.append("")
        for comparison in section.comparisons:
            lines += wrap(comparison.brief(), bullet=True)
        lines += wrap(comparisons_note(section))
    if plots_note and section.plots:
        titles = ", ".join(p.title for p in section.plots)
        lines += ["", *wrap(f"plots (in --format html): {titles}")]
    if section.lost_events is not None:
        lines += wrap(f"lost trace events in the data used: {section.lost_events}")
    return lines


def wrap(text: str, bullet: bool = False) -> list[str]:
    """A paragraph wrapped to the width; long words (paths) are broken, never cut."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent="- " if bullet else "",
        subsequent_indent="  ",
        break_on_hyphens=False,
    ) or [""]
