"""One Report, any format: the name -> renderer table the CLI uses."""

from __future__ import annotations

from collections.abc import Callable

from tracekit.errors import TracekitError
from tracekit.report.model import Report

FORMATS = ("text", "email", "html", "json")


def render(report: Report, fmt: str) -> str:
    """The report in one format (text, email, html, json)."""
    return _renderer(fmt)(report)


def _renderer(fmt: str) -> Callable[[Report], str]:
    """The render function of a format, imported only when asked for."""
    if fmt == "text":
        from tracekit.report.text import render_text

        return render_text
    if fmt == "email":
        from tracekit.report.email import render_email

        return render_email
    if fmt == "html":
        from tracekit.report.html import render_html

        return render_html
    if fmt == "json":
        from tracekit.report.json import render_json

        return render_json
    raise TracekitError(f"report: unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
