"""The JSON report: schema version, every number, frames that rebuild their tables."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import polars as pl
from report_bundles import awkward_section, copy_real_bundle

from tracekit.ingest.bundle import load_bundle
from tracekit.report.assemble import build_report
from tracekit.report.json import SCHEMA_VERSION, render_json
from tracekit.report.model import Report, Table

DTYPES = {str(t): t for t in (pl.Int64, pl.UInt32, pl.Float64, pl.String, pl.Boolean)}


def _frame(data: dict) -> pl.DataFrame:  # type: ignore[type-arg]
    """A table's JSON back into a frame, with the column types it declared."""
    schema = {c["name"]: DTYPES[c["dtype"]] for c in data["columns"]}
    return pl.DataFrame(data["rows"], schema=schema, orient="row")


def test_json_round_trips_tables_and_comparisons(tmp_path: Path) -> None:
    report = build_report([load_bundle(copy_real_bundle(tmp_path / "bundle"))])
    data = json.loads(render_json(report))
    assert data["schema_version"] == SCHEMA_VERSION == 2
    assert data["emulated"] is True
    assert data["header"] == report.header
    by_key = {s["key"]: s for s in data["sections"]}
    for section in report.sections:
        out = by_key[section.key]
        for table, table_data in zip(section.tables, out["tables"], strict=True):
            assert _frame(table_data).equals(table.frame)
        shown = [*zip(section.headline, out["headline"], strict=True)]
        shown += zip(section.comparisons, out["comparisons"], strict=True)
        for comparison, c_data in shown:
            fields = asdict(comparison)
            assert {k: c_data[k] for k in fields} == json.loads(json.dumps(fields))
            assert c_data["rule"] == comparison.thresholds.rule()
        for plot, plot_data in zip(section.plots, out["plots"], strict=True):
            assert len(plot_data["rows"]) == plot.frame.height  # every point, not a sample
    primary = by_key["beforeafter"]["headline"][0]
    # The real emulated bundle's rt CPU is saturated: no run count is asked for.
    assert primary["metric"] == "cyclictest p99.9" and primary["needed_runs"] is None
    assert "saturated" in primary["no_verdict"]


def test_json_is_strict_and_keeps_awkward_values() -> None:
    section = awkward_section()
    nan_table = Table("nan", pl.DataFrame({"x": [1.5, math.nan, math.inf]}))
    sections = [section, type(section)(key="n", title="n", tables=[nan_table])]
    text = render_json(Report(["header"], False, sections))
    data = json.loads(text, parse_constant=lambda name: pytest_fail(name))
    assert data["sections"][1]["tables"][0]["rows"] == [{"x": 1.5}, {"x": None}, {"x": None}]
    assert data["sections"][0]["lost_events"] == 5
    assert data["unknowns"][-1].startswith("what <img")  # raw text: JSON readers escape


def pytest_fail(name: str) -> None:
    """parse_constant hook: NaN/Infinity are not JSON."""
    raise AssertionError(f"non-standard JSON constant {name}")
