"""The report as plain ASCII for a mailing-list reply: every line within 72 columns.

Findings are wrapped, tables too wide are split into column groups or shown row by row
(never cut), comparisons carry their interval and test, and a closing part lists what
the data cannot tell. Anything that is not ASCII is written as a \\u escape, so no
mail client can mangle it.
"""

from __future__ import annotations

import textwrap

from tracekit.report.ascii import table_lines
from tracekit.report.gather import lost_events_line, unknowns, verdict_rules
from tracekit.report.model import Report, Section

WIDTH = 72


def render_email(report: Report) -> str:
    """The whole report as a plain-text email body."""
    lines: list[str] = []
    for line in report.lead():
        lines += _wrap(line)
    lines += _wrap(lost_events_line(report))
    for number, section in enumerate(report.sections, 1):
        lines += ["", *_section(number, section)]
    lines += ["", "What is NOT known", "-" * len("What is NOT known")]
    for item in unknowns(report) or ["nothing the sections listed"]:
        lines += _wrap(item, bullet=True)
    text = "\n".join(_ascii(line) for line in lines) + "\n"
    return _fit(text)


def _section(number: int, section: Section) -> list[str]:
    """One numbered section: findings, tables, comparisons and the rule that judged them."""
    lines = _wrap(f"{number}. {section.title}")
    lines.append("-" * min(max(len(line) for line in lines), WIDTH))
    for finding in section.findings:
        lines += _wrap(finding, bullet=True)
    for table in section.tables:
        lines += ["", *_wrap(f"{table.title}:")]
        lines += table_lines(table.frame, WIDTH)
        if table.note:
            lines += _wrap(f"({table.note})")
    if section.comparisons:
        lines.append("")
        for comparison in section.comparisons:
            lines += _wrap(comparison.describe().replace("\n  ", " "))
        for rule in verdict_rules(section):
            lines += _wrap(f"Verdict rule: {rule}")
    if section.lost_events is not None:
        lines += _wrap(f"Lost trace events in the data used: {section.lost_events}")
    return lines


def _wrap(text: str, bullet: bool = False) -> list[str]:
    """A paragraph wrapped to the width; long words (paths) are broken, never cut."""
    return textwrap.wrap(
        _ascii(text),
        WIDTH,
        initial_indent="- " if bullet else "",
        subsequent_indent="  ",
        break_on_hyphens=False,
    ) or [""]


def _ascii(text: str) -> str:
    """Non-ASCII characters as \\uXXXX escapes (a comm may hold any bytes)."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


def _fit(text: str) -> str:
    """Rewrap any line still over the width (an escape can lengthen one): never cut."""
    out = []
    for line in text.splitlines():
        if len(line) <= WIDTH:
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip(" "))
        out += textwrap.wrap(
            line, WIDTH, subsequent_indent=" " * (indent + 2), break_on_hyphens=False
        )
    return "\n".join(out) + "\n"
