"""Frames as plain ASCII tables, for the terminal and for email.

Numbers are shown with three or four significant digits (the JSON report has them
whole). A table too wide for the width asked is split into column groups that repeat
the first column; when even that does not fit, each row becomes a block of
"column: value" lines. Nothing is ever cut.
"""

from __future__ import annotations

import math
import textwrap

import polars as pl


def cell(value: object) -> str:
    """One value as table text: '-' for missing, floats to about 4 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value)
    # A newline would break the table's rows; the text itself is kept.
    return " ".join(str(value).splitlines())


def _float_text(value: float) -> str:
    """A float short enough for a table column, precise enough to read."""
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e7 or magnitude < 1e-3:
        return f"{value:.3e}"
    digits = math.floor(math.log10(magnitude)) + 1
    if digits >= 4:
        return f"{value:.0f}"
    # Trailing zeros claim a precision the value does not have (0.500, -1.00).
    text = f"{value:.{max(0, 3 - digits)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def table_lines(frame: pl.DataFrame, width: int | None = None, indent: int = 2) -> list[str]:
    """The frame as aligned columns; with `width`, split or transposed to fit within it."""
    if frame.width == 0:
        return [" " * indent + "(no columns)"]
    rows = [[cell(v) for v in row] for row in frame.iter_rows()]
    if frame.height == 0:
        rows = []
    lines = _aligned(frame.columns, rows, indent)
    if width is None or max(len(line) for line in lines) <= width:
        return lines if rows else [*lines, " " * indent + "(no rows)"]
    columns = frame.columns
    if len({r[0] for r in rows}) < len(rows):
        # Each part of a split table repeats the first column: where it does not tell the
        # rows apart, a row number leads instead, so the parts' rows can be matched.
        columns = ["#", *columns]
        rows = [[str(n), *r] for n, r in enumerate(rows, 1)]
    groups = _column_groups(columns, rows, width, indent)
    if groups is None:
        return _records(frame.columns, [r[-frame.width :] for r in rows], width, indent)
    out: list[str] = []
    for group in groups:
        if out:
            out.append("")
        out += _aligned([columns[i] for i in group], [[r[i] for i in group] for r in rows], indent)
    return out


def _aligned(columns: list[str], rows: list[list[str]], indent: int) -> list[str]:
    """Header and rows, right-aligned in columns two spaces apart."""
    table = [columns, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    pad = " " * indent
    return [pad + "  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in table]


def _column_groups(
    columns: list[str], rows: list[list[str]], width: int, indent: int
) -> list[list[int]] | None:
    """Column index groups, each led by column 0, that fit the width; None if one cannot."""
    widths = [max([len(columns[i])] + [len(r[i]) for r in rows]) for i in range(len(columns))]
    budget = width - indent - widths[0]
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in range(1, len(columns)):
        need = widths[i] + 2
        if need > budget:
            return None
        if used + need > budget:
            groups.append([0, *current])
            current, used = [], 0
        current.append(i)
        used += need
    groups.append([0, *current])
    return groups


def _records(columns: list[str], rows: list[list[str]], width: int, indent: int) -> list[str]:
    """Each row as a block of 'column: value' lines; long ones wrap under the name."""
    pad = " " * indent
    out: list[str] = []
    for n, row in enumerate(rows):
        if n:
            out.append("")
        for name, value in zip(columns, row, strict=True):
            line = f"{pad}{name}: {value}"
            if len(line) <= width:
                out.append(line)
                continue
            out += _wrap(f"{name}:", width, pad)
            out += _wrap(value, width, pad * 2)
    return out


def _wrap(text: str, width: int, pad: str) -> list[str]:
    """Text wrapped to the width with this indent; long words are broken, never cut."""
    return textwrap.wrap(
        text or "''",
        width,
        initial_indent=pad,
        subsequent_indent=pad,
        break_long_words=True,
        break_on_hyphens=False,
    )
