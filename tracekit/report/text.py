"""The terminal report: the lead (warnings first), then the details.

Draws a `Report` (tracekit/report/assemble.py) with the skeleton of plain.py; tables keep
their natural width, plots are named (they are drawn in --format html).
"""

from __future__ import annotations

from tracekit.report.model import Report
from tracekit.report.plain import plain_lines


def render_text(report: Report) -> str:
    """The whole text report."""
    return "\n".join(plain_lines(report, table_width=None, plots_note=True)) + "\n"
