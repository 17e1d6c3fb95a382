"""The report as JSON: every number, machine-readable, with a schema version.

Frames become lists of row objects (with their column types, so an empty frame keeps
its shape); comparisons keep every field, their thresholds and the rule in words.
NaN and infinities, which JSON cannot hold, become null.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import asdict
from typing import Any

import polars as pl

from tracekit.analysis.compare import Comparison
from tracekit.report.gather import lead, lost_events_line, unknowns, unknowns_by_section
from tracekit.report.model import Plot, Report, Section, Table

SCHEMA = "tracekit-report"
SCHEMA_VERSION = 2  # 2: tables say run_id and common_pid (were run, pid)


def render_json(report: Report) -> str:
    """The report as one JSON document (indented, keys in a fixed order)."""
    return json.dumps(report_data(report), indent=1, allow_nan=False) + "\n"


def report_data(report: Report) -> dict[str, Any]:
    """The report as plain JSON data."""
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "emulated": report.emulated,
        "warnings": list(report.warnings),
        "contradictions": list(report.contradictions),
        "question": report.question,
        "header": list(report.header),
        "controls": list(report.controls),
        "lead": {part.title: part.items for part in lead(report)},
        # What a lead part's title says with it (where the part is said in full).
        "lead_notes": {part.title: part.note for part in lead(report) if part.note},
        "lost_events": lost_events_line(report),
        "sections": [_section(s) for s in report.sections],
        "unknowns": unknowns(report),
        # The details' last part: each section's unknowns (not said by an earlier one).
        "not_known": [
            {"section": section.key, "number": number, "items": items}
            for number, section, items in unknowns_by_section(report)
        ],
    }


def _section(section: Section) -> dict[str, Any]:
    """One section with all its parts."""
    return {
        "key": section.key,
        "title": section.title,
        "findings": list(section.findings),
        "headline": [comparison_data(c) for c in section.headline],
        "comparisons": [comparison_data(c) for c in section.comparisons],
        "contradictions": list(section.contradictions),
        "controls": list(section.controls),
        "tables": [_table(t) for t in section.tables],
        "plots": [_plot(p) for p in section.plots],
        "unknowns": list(section.unknowns),
        "lost_events": section.lost_events,
    }


def comparison_data(c: Comparison) -> dict[str, Any]:
    """Every field of a comparison, plus its verdict rule in words."""
    data = _clean(asdict(c))
    data["rule"] = c.thresholds.rule()
    return data


def _table(table: Table) -> dict[str, Any]:
    """A table: title, note, typed columns, rows."""
    return {"title": table.title, "note": table.note, **frame_data(table.frame)}


def _plot(plot: Plot) -> dict[str, Any]:
    """A plot's description and the long-format rows it is drawn from."""
    return {
        "title": plot.title,
        "kind": plot.kind,
        "x": plot.x,
        "y": plot.y,
        "series": plot.series,
        "log_x": plot.log_x,
        "log_y": plot.log_y,
        "x_label": plot.x_label,
        "y_label": plot.y_label,
        **frame_data(plot.frame),
    }


def frame_data(frame: pl.DataFrame) -> dict[str, Any]:
    """A frame as typed columns and row objects."""
    return {
        "columns": [{"name": n, "dtype": str(t)} for n, t in frame.schema.items()],
        "rows": [_clean(row) for row in frame.to_dicts()],
    }


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> null, times -> ISO text, durations -> ns, tuples -> lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, dt.timedelta):
        return value // dt.timedelta(microseconds=1) * 1000
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)
