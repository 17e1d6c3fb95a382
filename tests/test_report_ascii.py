"""Frames as ASCII tables (tracekit/report/ascii.py): split to fit, rows kept matchable."""

import polars as pl

from tracekit.report.ascii import table_lines


def test_a_split_table_whose_first_column_repeats_is_led_by_row_numbers() -> None:
    """Two parts, each led by '#': a row's parts are matched by its number, not by a
    first column that several rows share."""
    frame = pl.DataFrame(
        {
            "where": ["kernel", "kernel"],
            "operation": ["TLBI ASIDE1IS", "TLBI VALE1IS"],
            "function": ["tlb_flush" + "_" * 20, "ptep_clear_flush" + "_" * 13],
            "count": [3, 4],
        }
    )
    lines = table_lines(frame, width=50)
    assert all(len(line) <= 50 for line in lines)
    first, second = "\n".join(lines).split("\n\n")
    assert first.splitlines()[0].split()[0] == "#" == second.splitlines()[0].split()[0]
    assert first.splitlines()[2].split()[:2] == ["2", "kernel"]
    assert second.splitlines()[2].split()[0] == "2"


def test_a_split_table_with_a_unique_first_column_repeats_it() -> None:
    """Its first column tells the rows apart: no row number."""
    frame = pl.DataFrame({"run": ["a", "b"], "x" * 30: [1, 2], "y" * 30: [3, 4]})
    lines = table_lines(frame, width=40)
    assert lines[0].split()[0] == "run" and "#" not in lines[0]
    assert sum(line.split()[:1] == ["run"] for line in lines) == 2
