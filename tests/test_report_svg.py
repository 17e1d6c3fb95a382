"""The SVG plots' geometry: bars from zero in proportion, x labels apart, intervals on a
reference line, log axes for distributions only."""

from __future__ import annotations

import itertools
import re
from xml.etree import ElementTree

import polars as pl
import pytest

from tracekit.report.model import Plot
from tracekit.report.svg import BOTTOM, HEIGHT, label_width, render_svg

NS = "{http://www.w3.org/2000/svg}"


def _tree(plot: Plot) -> ElementTree.Element:
    """The plot's SVG, parsed (the renderer writes no namespace; one is added to parse)."""
    svg = render_svg(plot).replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1)
    return ElementTree.fromstring(svg)


def _bars(tree: ElementTree.Element) -> list[ElementTree.Element]:
    """The data bars (rects with a tooltip; the frame and legend swatches have none)."""
    return [r for r in tree.iter(f"{NS}rect") if r.find(f"{NS}title") is not None]


def test_bars_start_at_zero_and_their_heights_are_their_values() -> None:
    frame = pl.DataFrame({"run_id": ["a", "b", "c"], "us": [13196.0, 42118.0, 0.0]})
    tree = _tree(Plot("p99.9", "bars", frame, x="run_id", y="us"))
    bars = _bars(tree)
    heights = [float(b.get("height", "nan")) for b in bars]
    bottoms = {round(float(b.get("y", "nan")) + h, 1) for b, h in zip(bars, heights, strict=True)}
    assert len(bottoms) == 1  # one baseline: zero
    assert heights[2] == 0.0
    assert heights[0] / heights[1] == pytest.approx(13196 / 42118, rel=0.01)
    ticks = [t.text for t in tree.iter(f"{NS}text") if t.get("class") == "tick"]
    assert "0" in ticks  # the axis shows the zero the bars start from


def test_a_log_axis_is_refused_outside_distributions() -> None:
    frame = pl.DataFrame({"x": ["a"], "y": [1.0]})
    for kind in ("bars", "xy", "intervals", "timeline"):
        with pytest.raises(ValueError, match="linear axes only"):
            Plot("t", kind, frame, x="x", y="y", log_y=True)  # type: ignore[arg-type]
    Plot("t", "cdf", frame, x="y", log_x=True)  # distributions may


def test_48_run_labels_do_not_overprint() -> None:
    runs = [f"{p}-quiet-{i}" for p in ("before", "after") for i in range(24)]
    frame = pl.DataFrame({"run_id": runs, "us": [float(i + 1) for i in range(48)]})
    svg = render_svg(Plot("p99.9 per run", "bars", frame, x="run_id", y="us"))
    tree = _tree(Plot("p99.9 per run", "bars", frame, x="run_id", y="us"))
    below = [t for t in tree.iter(f"{NS}text") if t.get("class") == "tick"]
    below = [t for t in below if float(t.get("y", "0")) == HEIGHT - BOTTOM + 14]  # x axis
    half = [(float(t.get("x", "0")), label_width(t.text or "") / 2) for t in below]
    spans = sorted((x - w, x + w) for x, w in half)
    assert 2 <= len(spans) < 48
    assert all(right < left for (_, right), (left, _) in itertools.pairwise(spans))
    assert re.search(r"x labels: every \d+th of 48 shown", svg)
    assert len(_bars(tree)) == 48  # every bar is drawn; only labels are thinned


def test_intervals_are_points_on_whiskers_against_a_line_at_one() -> None:
    frame = pl.DataFrame(
        {
            "condition": ["mmu-on", "mmu-off", "1+1 runs"],
            "ratio": [2.0, 1.0, 1.5],
            "low": [1.5, 0.9, None],
            "high": [2.5, 1.1, None],
        }
    )
    tree = _tree(Plot("ratio", "intervals", frame, x="ratio", y="condition"))
    lines = list(tree.iter(f"{NS}line"))
    reference = next(ln for ln in lines if ln.get("class") == "reference")
    whiskers = [ln for ln in lines if ln.get("class") == "whisker"]
    points = [float(c.get("cx", "nan")) for c in tree.iter(f"{NS}circle")]
    assert len(whiskers) == 2 and len(points) == 3  # the 1+1 row: a point, no whisker
    one = float(reference.get("x1", "nan"))
    assert points[1] == pytest.approx(one, abs=0.1)  # ratio 1.0 sits on the line
    # Linear: 2.0 is as far right of 1.0 as 1.5 is of 1.0, twice over.
    assert points[0] - one == pytest.approx(2 * (points[2] - one), rel=0.01)
    left, right = (float(whiskers[0].get(k, "nan")) for k in ("x1", "x2"))
    assert left < points[0] < right
    assert not _bars(tree)  # no bars for intervals
