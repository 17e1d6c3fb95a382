"""The report as one self-contained HTML file: tables, verdicts and inline SVG plots.

Nothing is fetched when it is viewed (no scripts, no external styles, fonts or images;
a Content-Security-Policy forbids them as well), and every string that comes from a
trace or a manifest is escaped.
"""

from __future__ import annotations

import re
from html import escape

from tracekit.analysis.compare import Comparison
from tracekit.report.ascii import cell
from tracekit.report.gather import (
    NOT_KNOWN_PART,
    contradiction_lines,
    headline,
    lead,
    result_notes,
    unknowns_by_section,
    warnings_line,
)
from tracekit.report.model import Plot, Report, Section, Table
from tracekit.report.svg import render_svg

VERDICTS = ("present", "absent", "inconclusive")
CSP = "default-src 'none'; style-src 'unsafe-inline'"
STYLE = """
body { font-family: sans-serif; max-width: 60rem; margin: 1rem auto; padding: 0 1rem;
       color: #222; line-height: 1.4; }
.warning { background: #fff3cd; border: 1px solid #e0b000; padding: .4rem .6rem;
            font-weight: bold; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .15rem .5rem; text-align: right; }
th { background: #f2f2f2; }
td.text { text-align: left; }
caption { text-align: left; font-weight: bold; padding: .2rem 0; }
td.present { background: #f8d7da; } td.absent { background: #d4edda; }
td.inconclusive { background: #eee; }
figure { margin: 1rem 0; } figcaption { font-weight: bold; }
svg.plot { display: block; background: #fff; }
svg .frame { fill: none; stroke: #888; } svg .grid { stroke: #e4e4e4; }
svg text { font-size: 11px; fill: #333; } svg .note { fill: #a00; }
.note { color: #555; font-size: .9rem; }
p, li, caption { overflow-wrap: anywhere; }
.scroll { overflow-x: auto; }
"""


def render_html(report: Report) -> str:
    """The whole report as an HTML document."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        "<title>tracekit report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>tracekit report</h1>",
        _lead(report),
        _contents(report),
        *(_section(s) for s in report.sections),
        _not_known(report),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _lead(report: Report) -> str:
    """Warnings and contradictions (they stand out), then the lead's parts in order."""
    lines = [f'<p class="warning">{escape(warnings_line(report))}</p>'] if report.warnings else []
    lines += [f'<p class="warning">{escape(c)}</p>' for c in contradiction_lines(report)]
    for title, items, note in lead(report):
        if not items and not note:
            continue
        lines.append(f'<h2 id="{_anchor(title)}">{escape(title[0].upper() + title[1:])}</h2>')
        if note and title == "not known":  # where the part is said in full: a link to it
            lines.append(f'<p class="note"><a href="#{NOT_KNOWN_ID}">{escape(note)}</a></p>')
        elif note:
            lines.append(f'<p class="note">{escape(note)}</p>')
        if title == "result" and headline(report):
            lines.append(_comparisons(headline(report)))
            items = result_notes(report)
        if items:
            lines.append("<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>")
    return "<header>" + "\n".join(lines) + "</header>"


# The details' part listing every unknown (the lead's not-known part links to it).
NOT_KNOWN_ID = "what-is-not-known"


def _contents(report: Report) -> str:
    """Links to the details' sections, then to the list of every unknown."""
    links = [(_anchor(s.key), s.title) for s in report.sections]
    links += [(NOT_KNOWN_ID, NOT_KNOWN_PART)] if unknowns_by_section(report) else []
    items = "".join(f'<li><a href="#{key}">{escape(title)}</a></li>' for key, title in links)
    return f"<nav><h2>Details</h2><ol>{items}</ol></nav>"


def _not_known(report: Report) -> str:
    """Every section's unknowns in full, under the section's number and title."""
    groups = unknowns_by_section(report)
    if not groups:
        return ""
    parts = [f'<section id="{NOT_KNOWN_ID}"><h2>{escape(NOT_KNOWN_PART)}</h2>']
    for number, section, items in groups:
        link = f'<a href="#{_anchor(section.key)}">{number}. {escape(section.title)}</a>'
        parts.append(f"<h3>{link}</h3>")
        parts.append("<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>")
    return "\n".join(parts) + "</section>"


def _section(section: Section) -> str:
    """A section: findings, comparisons, tables, plots, lost events (unknowns: at the end)."""
    parts = [f'<section id="{_anchor(section.key)}"><h2>{escape(section.title)}</h2>']
    if section.findings:
        parts.append("<ul>" + "".join(f"<li>{escape(f)}</li>" for f in section.findings) + "</ul>")
    if section.comparisons:
        parts.append(_comparisons(section.comparisons))  # its columns name test and runs
    parts += [_table(t) for t in section.tables]
    parts += [_plot(p) for p in section.plots]
    if section.lost_events is not None:
        parts.append(
            f'<p class="note">Lost trace events in the data used: {section.lost_events}</p>'
        )
    return "\n".join(parts) + "</section>"


def _comparisons(comparisons: list[Comparison]) -> str:
    """Comparisons as a table: ratio, interval, test, runs, verdict."""
    head = ("metric", "ratio", "CI", "p", "test", "runs", "verdict", "note")
    rows = []
    for c in comparisons:
        note = f"needs {c.needed_runs}+{c.needed_runs} runs" if c.needed_runs else ""
        if c.excluded:
            note += "; excluded: " + ", ".join(
                f"{e.phase} {e.run} ({e.lost} lost)" for e in c.excluded
            )
        p = f"{c.p_adjusted:.3g}" + (" (Holm)" if c.role == "secondary" else "")
        cells = [
            _td(c.metric, text=True),
            _td(f"{c.ratio:.2f}x" + (f" {c.ratio_label}" if c.ratio_label else "")),
            _td(c.interval()),
            _td(p),
            _td(c.test, text=True),
            _td(f"{c.n_before}+{c.n_after}"),
            f'<td class="{_verdict_class(c.verdict)}">{escape(c.verdict)}</td>',
            _td(note.lstrip("; "), text=True),
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    header = "".join(f"<th>{h}</th>" for h in head)
    caption = "<caption>Comparisons between groups of runs</caption>"
    return f'<div class="scroll"><table>{caption}<tr>{header}</tr>{"".join(rows)}</table></div>'


def _table(table: Table) -> str:
    """A frame as an HTML table; verdict cells are coloured."""
    frame = table.frame
    header = "".join(f"<th>{escape(c)}</th>" for c in frame.columns)
    text_columns = {n for n, t in frame.schema.items() if not t.is_numeric()}
    rows = []
    for row in frame.iter_rows(named=True):
        cells = []
        for name, value in row.items():
            shown = cell(value)
            if shown in VERDICTS:
                cells.append(f'<td class="{shown}">{escape(shown)}</td>')
            else:
                cells.append(_td(shown, text=name in text_columns))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    note = f'<p class="note">{escape(table.note)}</p>' if table.note else ""
    if frame.height == 0:
        rows.append(f'<tr><td colspan="{max(1, frame.width)}">(no rows)</td></tr>')
    caption = f"<caption>{escape(table.title)}</caption>"
    return (
        f'<div class="scroll"><table>{caption}<tr>{header}</tr>{"".join(rows)}</table></div>{note}'
    )


def _plot(plot: Plot) -> str:
    """A figure holding the plot's inline SVG."""
    return f"<figure><figcaption>{escape(plot.title)}</figcaption>{render_svg(plot)}</figure>"


def _td(value: str, text: bool = False) -> str:
    """An escaped table cell; text is left-aligned, numbers right."""
    css = ' class="text"' if text else ""
    return f"<td{css}>{escape(value)}</td>"


def _verdict_class(verdict: str) -> str:
    """A CSS class for a verdict (only known ones)."""
    return verdict if verdict in VERDICTS else ""


def _anchor(key: str) -> str:
    """A section key as a safe HTML id."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", key) or "section"
