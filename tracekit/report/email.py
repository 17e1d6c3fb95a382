"""The report as plain ASCII for a mailing-list reply: every line within 72 columns.

The skeleton of plain.py: the lead a maintainer reads first (warnings, contradictions,
question, setup, result with its spread, controls, what is not known), then the details.
Tables too wide are split into column groups or shown row by row (never cut). Anything
that is not ASCII is written as a \\u escape, so no mail client can mangle it.
"""

from __future__ import annotations

import textwrap

from tracekit.report.model import Report
from tracekit.report.plain import WIDTH, plain_lines


def render_email(report: Report) -> str:
    """The whole report as a plain-text email body."""
    lines = plain_lines(report, table_width=WIDTH, plots_note=False)
    text = "\n".join(_ascii(line) for line in lines) + "\n"
    return _fit(text)


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
