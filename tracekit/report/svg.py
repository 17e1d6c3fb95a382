"""Plots drawn as inline SVG, by hand: cdf, histogram, bars, xy, timeline and intervals.

No plotting library and nothing fetched: the SVG text goes straight into the HTML
report. Every string that reaches the SVG (titles, series, labels from traces) is
escaped. Log axes exist for distributions (cdf, histogram) only; bars start at zero
on a linear axis, intervals are points on whiskers against a reference line, and x
labels too many to fit are thinned (said in a note). Values a log axis cannot show
(zero or negative) are counted in a note under the plot, never dropped silently.
"""

from __future__ import annotations

import math
from html import escape

import polars as pl

from tracekit.report.model import Plot
from tracekit.report.scales import Scale, make_scale

WIDTH, HEIGHT = 720, 340
LEFT, RIGHT, TOP, BOTTOM = 72, 20, 16, 44
# Okabe-Ito colours: told apart by colour-blind readers too. The first is the test's
# "plot line colour".
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442")
LINE_POINTS = 400  # points per CDF line: enough for the eye, small in the file
HISTOGRAM_BINS = 40
LEGEND_ROW = 16
CHAR_PX = 7.0  # the widest average glyph of 11 px sans-serif text (digits, lower case)
LABEL_GAP = 8  # px between two tick labels
MARKED_POINTS = 200
NO_SERIES = "(none)"


def render_svg(plot: Plot) -> str:
    """The plot as an <svg> element, with its legend and notes."""
    missing = [c for c in _columns(plot) if c not in plot.frame.columns]
    if missing:
        return _message(f"not drawn: the plot has no column {', '.join(missing)}")
    if plot.frame.height == 0:
        return _message("no data")
    if plot.kind in ("bars", "xy", "timeline", "intervals") and not plot.y:
        return _message(f"not drawn: a {plot.kind} plot needs a y column")
    draw = {
        "cdf": _cdf,
        "histogram": _histogram,
        "bars": _bars,
        "xy": _xy,
        "timeline": _timeline,
        "intervals": _intervals,
    }
    draw_kind = draw.get(plot.kind)
    if draw_kind is None:
        return _message(f"not drawn: unknown plot kind {plot.kind!r}")
    try:
        body, notes = draw_kind(plot)
    except (TypeError, ValueError, pl.exceptions.PolarsError) as err:
        # Shown in place of the plot: a bad column type must not hide the whole report.
        return _message(f"not drawn: {plot.kind} of {plot.x} failed ({err})")
    names = _series_names(plot)
    legend, legend_height = _legend(names if len(names) > 1 or names[0] else [])
    height = HEIGHT + legend_height + LEGEND_ROW * len(notes)
    note_lines = [
        _text(LEFT, HEIGHT + legend_height + LEGEND_ROW * (i + 1) - 4, n, "note")
        for i, n in enumerate(notes)
    ]
    return (
        f'<svg class="plot" role="img" width="{WIDTH}" height="{height}"'
        f' viewBox="0 0 {WIDTH} {height}"><title>{escape(plot.title)}</title>'
        + "".join(body + legend + note_lines)
        + "</svg>"
    )


def _columns(plot: Plot) -> list[str]:
    """The columns this plot reads."""
    needed = [plot.x] + ([plot.y] if plot.y else []) + ([plot.series] if plot.series else [])
    if plot.kind == "timeline":
        needed += ["end", "label"]
    if plot.kind == "intervals":
        needed += ["low", "high"]
    return needed


def _series_names(plot: Plot) -> list[str]:
    """Series in order of first appearance ([""] for a plot without series)."""
    if plot.series is None:
        return [""]
    names = plot.frame.select(_series_text(plot.series)).to_series()
    return names.unique(maintain_order=True).to_list()


def _series_text(column: str) -> pl.Expr:
    """A series column as text; a missing series value is a series of its own."""
    return pl.col(column).cast(pl.String).fill_null(NO_SERIES)


def _split(plot: Plot) -> list[tuple[str, pl.DataFrame]]:
    """The plot's frame, one part per series."""
    if plot.series is None:
        return [("", plot.frame)]
    frame = plot.frame.with_columns(_series_text(plot.series).alias("__series"))
    return [(name, frame.filter(pl.col("__series") == name)) for name in _series_names(plot)]


def _numbers(frame: pl.DataFrame, column: str) -> list[float]:
    """A column as finite floats (nulls and non-numbers left out; the caller counts them)."""
    values = frame[column].cast(pl.Float64, strict=False).drop_nulls().to_list()
    return [v for v in values if math.isfinite(v)]


def _unusable_note(total: int, usable: int, log: bool, axis: str) -> list[str]:
    """A note counting values the plot could not show, if any."""
    if usable == total:
        return []
    why = "zero, negative or missing (log scale)" if log else "missing or not numbers"
    return [f"{total - usable} of {total} values not shown on {axis}: {why}"]


def _cdf(plot: Plot) -> tuple[list[str], list[str]]:
    """One line per series: fraction of values <= x."""
    parts = [(name, sorted(_numbers(f, plot.x))) for name, f in _split(plot)]
    shown = [[v for v in values if v > 0 or not plot.log_x] for _, values in parts]
    x = make_scale([v for s in shown for v in s], LEFT, WIDTH - RIGHT, plot.log_x)
    y = Scale(0.0, 1.0, HEIGHT - BOTTOM, TOP)
    body = _axes(plot, x, y)
    for i, (values, (_, original)) in enumerate(zip(shown, parts, strict=True)):
        if not values:
            continue
        n, skipped = len(original), len(original) - len(values)
        picks = sorted(
            {round(k * (len(values) - 1) / (LINE_POINTS - 1)) for k in range(LINE_POINTS)}
        )
        points = [(x(values[k]), y((skipped + k + 1) / n)) for k in picks]
        body.append(_polyline(points, i))
    total = plot.frame.height
    notes = _unusable_note(total, sum(len(s) for s in shown), plot.log_x, "x")
    return body, notes


def _histogram(plot: Plot) -> tuple[list[str], list[str]]:
    """Counts per bin, one outline per series (log-spaced bins on a log x axis)."""
    parts = []
    for name, frame in _split(plot):
        weights = frame[plot.y].cast(pl.Float64, strict=False) if plot.y else None
        values = frame[plot.x].cast(pl.Float64, strict=False)
        rows = pl.DataFrame({"v": values, "w": weights if weights is not None else 1.0})
        rows = rows.drop_nulls().filter(pl.col("v").is_finite())
        if plot.log_x:
            rows = rows.filter(pl.col("v") > 0)
        parts.append((name, rows))
    everything = [v for _, r in parts for v in r["v"].to_list()]
    x = make_scale(everything, LEFT, WIDTH - RIGHT, plot.log_x)
    edges = _bin_edges(x)
    counts = [_bin_counts(rows, edges, plot.log_x) for _, rows in parts]
    peak = [c for cs in counts for c in cs if c > 0 or not plot.log_y]
    y = make_scale([*peak, 0.0] if not plot.log_y else peak, HEIGHT - BOTTOM, TOP, plot.log_y)
    body = _axes(plot, x, y)
    for i, series_counts in enumerate(counts):
        points = [(x(edges[0]), y(y.low))]
        for k, count in enumerate(series_counts):
            top = y(count) if count > 0 or not plot.log_y else y(y.low)
            points += [(x(edges[k]), top), (x(edges[k + 1]), top)]
        points.append((x(edges[-1]), y(y.low)))
        body.append(_polyline(points, i))
    shown = sum(r.height for _, r in parts)
    return body, _unusable_note(plot.frame.height, shown, plot.log_x, "x")


def _bin_edges(x: Scale) -> list[float]:
    """HISTOGRAM_BINS + 1 edges over the scale, evenly spaced in its own metric."""
    if x.log:
        lo, hi = math.log10(x.low), math.log10(x.high)
        return [10 ** (lo + (hi - lo) * k / HISTOGRAM_BINS) for k in range(HISTOGRAM_BINS + 1)]
    return [x.low + (x.high - x.low) * k / HISTOGRAM_BINS for k in range(HISTOGRAM_BINS + 1)]


def _bin_counts(rows: pl.DataFrame, edges: list[float], log: bool) -> list[float]:
    """Summed weights per bin (the last bin includes its upper edge)."""
    counts = [0.0] * (len(edges) - 1)
    lo, hi = edges[0], edges[-1]
    for value, weight in rows.iter_rows():
        if hi == lo:
            k = 0
        elif log:
            k = int(
                (math.log10(value) - math.log10(lo))
                / (math.log10(hi) - math.log10(lo))
                * len(counts)
            )
        else:
            k = int((value - lo) / (hi - lo) * len(counts))
        counts[min(max(k, 0), len(counts) - 1)] += weight
    return counts


def _bars(plot: Plot) -> tuple[list[str], list[str]]:
    """Grouped bars from zero on a linear axis: one group per x category, one bar per series."""
    assert plot.y is not None  # checked by _columns
    categories = [str(c) for c in plot.frame[plot.x].unique(maintain_order=True).to_list()]
    values = _numbers(plot.frame, plot.y)
    # Zero is always on the axis: a bar's length is its value.
    y = make_scale([*values, 0.0], HEIGHT - BOTTOM, TOP, False)
    body = _axes(plot, None, y)
    slot = (WIDTH - RIGHT - LEFT) / max(1, len(categories))
    base = y(0.0)
    names = _series_names(plot)
    rows = plot.frame.select(
        pl.col(plot.x).cast(pl.String),
        _series_text(plot.series) if plot.series else pl.lit(""),
        pl.col(plot.y).cast(pl.Float64, strict=False),
    ).rows()
    # Bars share their category's slot with the other series present there only.
    present = {
        c: [s for s in names if any(r[0] == c and r[1] == s for r in rows)] for c in categories
    }
    for category, series, value in rows:
        if value is None or not _usable(value, False):
            continue
        here = present[category]
        bar = slot * 0.8 / len(here)
        left = LEFT + categories.index(category) * slot + slot * 0.1 + here.index(series) * bar
        top = y(value)
        body.append(
            f'<rect x="{left:.1f}" y="{min(top, base):.1f}" width="{bar:.1f}"'
            f' height="{abs(base - top):.1f}" fill="{_colour(names.index(series))}">'
            f"<title>{escape(f'{category}: {value:g}')}</title></rect>"
        )
    labels, step = _category_labels(categories, slot)
    notes = _unusable_note(plot.frame.height, len(values), False, "y")
    if step > 1:
        notes.append(
            f"x labels: every {step}th of {len(categories)} shown (each bar's tip names it)"
        )
    return body + labels, notes


def _category_labels(categories: list[str], slot: float) -> tuple[list[str], int]:
    """x labels of a categorical axis, every k-th when the widest would overlap its neighbour."""
    widest = max(label_width(c) for c in categories) + LABEL_GAP
    step = max(1, math.ceil(widest / slot))
    labels = [
        _text(LEFT + (k + 0.5) * slot, HEIGHT - BOTTOM + 14, c, "tick", anchor="middle")
        for k, c in enumerate(categories)
        if k % step == 0
    ]
    return labels, step


def label_width(text: str) -> float:
    """A tick label's width in px, as wide as 11 px sans-serif text gets (a bound, not a fit)."""
    return CHAR_PX * len(text)


def _xy(plot: Plot) -> tuple[list[str], list[str]]:
    """Points joined by lines, one per series, in x order."""
    assert plot.y is not None
    parts = []
    for name, frame in _split(plot):
        pairs = frame.select(
            pl.col(plot.x).cast(pl.Float64, strict=False),
            pl.col(plot.y).cast(pl.Float64, strict=False),
        ).drop_nulls()
        pairs = [(a, b) for a, b in pairs.iter_rows() if _usable(a, False) and _usable(b, False)]
        parts.append((name, sorted(pairs)))
    x = make_scale([a for _, p in parts for a, _ in p], LEFT, WIDTH - RIGHT, False)
    y = make_scale([b for _, p in parts for _, b in p], HEIGHT - BOTTOM, TOP, False)
    body = _axes(plot, x, y)
    for i, (_, pairs) in enumerate(parts):
        points = [(x(a), y(b)) for a, b in pairs]
        body.append(_polyline(points, i))
        if len(points) <= MARKED_POINTS:  # beyond that, markers only hide the line
            body += [
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{_colour(i)}"/>'
                for px, py in points
            ]
    shown = sum(len(p) for _, p in parts)
    return body, _unusable_note(plot.frame.height, shown, False, "the axes")


def _usable(value: float, log: bool) -> bool:
    """Finite, and positive on a log axis."""
    return math.isfinite(value) and (value > 0 or not log)


def _timeline(plot: Plot) -> tuple[list[str], list[str]]:
    """Spans [x, end] in lanes (y), coloured by series, time in ms from the first start."""
    assert plot.y is not None
    lanes = [str(v) for v in plot.frame[plot.y].unique(maintain_order=True).to_list()]
    origin = float(plot.frame[plot.x].min())  # type: ignore[arg-type]
    ends = [float(v) for v in plot.frame["end"].drop_nulls().to_list()]
    x = make_scale([0.0, (max([*ends, origin]) - origin) / 1e6], LEFT + 60, WIDTH - RIGHT, False)
    body = _axes(plot, x, None, x_label=plot.x_label or "ms from the first start")
    lane_height = (HEIGHT - BOTTOM - TOP) / max(1, len(lanes))
    for k, lane in enumerate(lanes):
        body.append(_text(LEFT + 56, TOP + (k + 0.5) * lane_height + 4, lane, "tick", anchor="end"))
    for i, (_, frame) in enumerate(_split(plot)):
        for start, end, lane, label in frame.select(
            plot.x, "end", pl.col(plot.y).cast(pl.String), "label"
        ).iter_rows():
            left, right = (
                x((start - origin) / 1e6),
                x(((end if end is not None else start) - origin) / 1e6),
            )
            top = TOP + lanes.index(lane) * lane_height + lane_height * 0.15
            body.append(
                f'<rect x="{left:.1f}" y="{top:.1f}" width="{max(right - left, 1.5):.1f}"'
                f' height="{lane_height * 0.7:.1f}" fill="{_colour(i)}">'
                f"<title>{escape(str(label))}</title></rect>"
            )
    return body, []


def _intervals(plot: Plot) -> tuple[list[str], list[str]]:
    """One row per y label: the estimate as a point on its whisker, a line at the reference."""
    assert plot.y is not None
    rows = plot.frame.select(
        pl.col(plot.y).cast(pl.String),
        *(pl.col(c).cast(pl.Float64, strict=False) for c in (plot.x, "low", "high")),
    ).rows()
    finite = [tuple(v if v is not None and math.isfinite(v) else None for v in r[1:]) for r in rows]
    every = [v for r in finite for v in r if v is not None]
    x = make_scale([plot.reference, *every], LEFT + 130, WIDTH - RIGHT, False)
    body = _axes(plot, x, None)
    lane = (HEIGHT - BOTTOM - TOP) / max(1, len(rows))
    ref = x(plot.reference)
    body.append(
        f'<line x1="{ref:.1f}" y1="{TOP}" x2="{ref:.1f}" y2="{HEIGHT - BOTTOM}"'
        ' class="reference" stroke="#000" stroke-dasharray="4 3"/>'
    )
    for k, ((label, *_), (value, low, high)) in enumerate(zip(rows, finite, strict=True)):
        py = TOP + (k + 0.5) * lane
        body.append(_text(LEFT + 126, py + 4, label, "tick", anchor="end"))
        if low is not None and high is not None:
            tip = escape(f"{label}: [{low:g}, {high:g}]")
            body.append(
                f'<line x1="{x(low):.1f}" y1="{py:.1f}" x2="{x(high):.1f}" y2="{py:.1f}"'
                f' class="whisker" stroke="{_colour(0)}" stroke-width="2">'
                f"<title>{tip}</title></line>"
            )
        if value is not None:
            body.append(
                f'<circle cx="{x(value):.1f}" cy="{py:.1f}" r="3.5" fill="{_colour(1)}">'
                f"<title>{escape(f'{label}: {value:g}')}</title></circle>"
            )
    notes = []
    if missing := sum(r[0] is None for r in finite):
        notes.append(f"{missing} of {len(rows)} rows have no estimate: not shown")
    if no_interval := sum(r[0] is not None and None in r[1:] for r in finite):
        notes.append(f"{no_interval} of {len(rows)} rows have no interval: point only")
    return body, notes


def _axes(plot: Plot, x: Scale | None, y: Scale | None, x_label: str = "") -> list[str]:
    """Frame, grid lines, ticks and axis labels."""
    parts = [
        f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}"'
        f' height="{HEIGHT - TOP - BOTTOM}" class="frame"/>'
    ]
    if x is not None:
        for value, label in x.ticks():
            px = x(value)
            parts.append(
                f'<line x1="{px:.1f}" y1="{TOP}" x2="{px:.1f}" y2="{HEIGHT - BOTTOM}"'
                ' class="grid"/>'
            )
            parts.append(_text(px, HEIGHT - BOTTOM + 14, label, "tick", anchor="middle"))
    if y is not None:
        for value, label in y.ticks():
            py = y(value)
            parts.append(
                f'<line x1="{LEFT}" y1="{py:.1f}" x2="{WIDTH - RIGHT}" y2="{py:.1f}" class="grid"/>'
            )
            parts.append(_text(LEFT - 4, py + 4, label, "tick", anchor="end"))
    scale_note = " (log)"
    xl = (x_label or plot.x_label or plot.x) + (scale_note if plot.log_x else "")
    yl = (plot.y_label or plot.y or "") + (scale_note if plot.log_y else "")
    parts.append(_text((LEFT + WIDTH - RIGHT) / 2, HEIGHT - 10, xl, "label", anchor="middle"))
    parts.append(
        f'<text class="label" text-anchor="middle"'
        f' transform="translate(14 {(TOP + HEIGHT - BOTTOM) / 2}) rotate(-90)">{escape(yl)}</text>'
    )
    return parts


def _legend(names: list[str]) -> tuple[list[str], int]:
    """Colour swatches with series names, wrapped in rows under the plot."""
    parts, px, row = [], LEFT, 0
    for i, name in enumerate(names):
        width = 24 + 7 * len(name)
        if px + width > WIDTH - RIGHT and px > LEFT:
            px, row = LEFT, row + 1
        py = HEIGHT + row * LEGEND_ROW
        parts.append(f'<rect x="{px}" y="{py + 2}" width="12" height="8" fill="{_colour(i)}"/>')
        parts.append(_text(px + 16, py + 10, name, "legend"))
        px += width
    return parts, (row + 1) * LEGEND_ROW if names else 0


def _polyline(points: list[tuple[float, float]], index: int) -> str:
    """A series' line in its colour (dashed once the palette repeats)."""
    coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
    dash = ' stroke-dasharray="6 3"' if index >= len(PALETTE) else ""
    return (
        f'<polyline points="{coords}" fill="none" stroke="{_colour(index)}"'
        f' stroke-width="2"{dash}/>'
    )


def _colour(index: int) -> str:
    """The series' colour."""
    return PALETTE[index % len(PALETTE)]


def _text(px: float, py: float, text: str, css: str, anchor: str = "start") -> str:
    """An escaped text element."""
    return (
        f'<text x="{px:.1f}" y="{py:.1f}" class="{css}" text-anchor="{anchor}">'
        f"{escape(str(text))}</text>"
    )


def _message(text: str) -> str:
    """A small SVG that says why there is no plot."""
    return (
        f'<svg class="plot" role="img" width="{WIDTH}" height="40" viewBox="0 0 {WIDTH} 40">'
        + _text(LEFT, 24, text, "note")
        + "</svg>"
    )
