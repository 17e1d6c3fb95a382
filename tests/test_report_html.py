"""The HTML report: one self-contained file, everything escaped, plots really drawn.

The screenshot test renders the page in headless Chromium (Debian's `chromium`, which
scripts/setup.sh installs) and counts pixels of the plot line colours in the PNG,
decoded here with zlib and struct.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import polars as pl
import pytest
from report_bundles import EVIL_COMM, awkward_section, copy_real_bundle, edit_manifest

from tracekit.ingest.bundle import load_bundle
from tracekit.report.assemble import build_report
from tracekit.report.html import render_html
from tracekit.report.model import Plot, Report, Section
from tracekit.report.svg import PALETTE

ESCAPED_COMM = "&lt;img src=x onerror=alert(1)&gt;"


def _evil_report(tmp_path: Path) -> Report:
    """The real bundle with the comm injected into its manifest, plus the awkward section."""
    bundle = copy_real_bundle(tmp_path / "bundle")

    def inject(manifest: dict) -> None:  # type: ignore[type-arg]
        manifest["scenario"]["guest_variant"] = EVIL_COMM
        manifest["host"]["kernel_release"] = EVIL_COMM

    edit_manifest(bundle, inject)
    report = build_report([load_bundle(bundle)])
    return Report(report.header, report.emulated, [*report.sections, awkward_section()])


def test_html_escapes_strings_from_traces_and_manifests(tmp_path: Path) -> None:
    html = render_html(_evil_report(tmp_path))
    assert "<img" not in html
    assert "onerror=alert(1)>" not in html
    # Header (manifest), table cell, finding, timeline label, section title and key.
    assert html.count(ESCAPED_COMM) >= 6
    assert 'id="awkward--section-"' in html


def test_html_is_self_contained(tmp_path: Path) -> None:
    html = render_html(_evil_report(tmp_path))
    assert "://" not in html
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", html)
    assert "url(" not in html and "@import" not in html
    assert not re.search(r"<[^>]*\ssrc\s*=", html)  # no src attribute on any tag
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', html))
    assert "default-src 'none'" in html  # the browser refuses anything fetched anyway


def test_every_plot_is_well_formed_svg(tmp_path: Path) -> None:
    html = render_html(_evil_report(tmp_path))
    svgs = re.findall(r"<svg\b.*?</svg>", html, flags=re.S)
    assert len(svgs) == 2 + len(awkward_section().plots)
    for svg in svgs:
        ElementTree.fromstring(svg)  # raises on unescaped text or broken markup
    assert "not drawn: the plot has no column nope" in html
    assert "Not known" in html and html.count("Not known") == 1  # one list, in the lead


def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of RGB(A) bytes of an 8-bit, non-interlaced PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0
    channels = 4 if colour == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        row = _unfilter(
            raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, channels
        )
        rows.append(bytes(row))
        previous = row
    return width, height, [r if channels == 3 else _rgb(r) for r in rows]


def _unfilter(kind: int, row: bytearray, above: bytearray, bpp: int) -> bytearray:
    """Undo one scanline's PNG filter (None, Sub, Up, Average, Paeth)."""
    if kind == 0:
        return row
    if kind == 2:
        return bytearray((a + b) & 0xFF for a, b in zip(row, above, strict=True))
    for i in range(len(row)):
        left = row[i - bpp] if i >= bpp else 0
        up = above[i]
        if kind == 1:
            row[i] = (row[i] + left) & 0xFF
        elif kind == 3:
            row[i] = (row[i] + (left + up) // 2) & 0xFF
        else:
            corner = above[i - bpp] if i >= bpp else 0
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
            row[i] = (row[i] + pred) & 0xFF
    return row


def _rgb(rgba: bytes) -> bytes:
    """RGBA bytes as RGB bytes."""
    return np.frombuffer(rgba, dtype=np.uint8).reshape(-1, 4)[:, :3].tobytes()


def _count_colour(rows: list[bytes], colour: str, tolerance: int = 24) -> int:
    """Pixels within `tolerance` per channel of a #rrggbb colour."""
    pixels = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(-1, 3).astype(int)
    target = np.frombuffer(bytes.fromhex(colour[1:]), dtype=np.uint8).astype(int)
    return int((np.abs(pixels - target) <= tolerance).all(axis=1).sum())


def _screenshot(html: str, tmp_path: Path, name: str) -> list[bytes]:
    """Render the page in headless Chromium and return its pixel rows."""
    page, png = tmp_path / f"{name}.html", tmp_path / f"{name}.png"
    page.write_text(html)
    subprocess.run(
        [
            "chromium", "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
            f"--screenshot={png}", "--window-size=760,1000", page.as_uri(),
        ],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    width, height, rows = _png_pixels(png)
    assert (width, height) == (760, 1000)
    return rows


@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="Debian's chromium is not installed (scripts/setup.sh installs it; CI runs this)",
)
def test_html_plots_are_drawn_in_chromium(tmp_path: Path) -> None:
    report = build_report([load_bundle(copy_real_bundle(tmp_path / "bundle"))])
    section = report.sections[0]
    # Only the real CDF (before in the first colour, after in the second) on the page.
    cdf = type(section)(key="cdf", title="cdf", plots=section.plots[:1])
    drawn = _screenshot(render_html(Report(["header"], False, [cdf])), tmp_path, "cdf")
    empty = type(section)(key="cdf", title="cdf")
    blank = _screenshot(render_html(Report(["header"], False, [empty])), tmp_path, "blank")
    before, after = PALETTE[0], PALETTE[1]
    assert _count_colour(blank, before) == 0 and _count_colour(blank, after) == 0
    # Each line is 2 px wide across most of the 630 px plot; the legend swatch is 96 px.
    assert _count_colour(drawn, before) > 600
    assert _count_colour(drawn, after) > 600


@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="Debian's chromium is not installed (scripts/setup.sh installs it; CI runs this)",
)
def test_every_plot_kind_is_drawn_in_chromium(tmp_path: Path) -> None:
    """One page per plot kind, screenshot: the right size, and the plot's colour on it."""
    plots = {p.kind: p for p in awkward_section().plots if p.frame.height and p.y != "nope"}
    ratios = pl.DataFrame(
        {"term": ["mmu", "nG"], "ratio": [2.0, 1.0], "low": [1.5, 0.8], "high": [2.6, 1.2]}
    )
    plots["intervals"] = Plot("effects", "intervals", ratios, x="ratio", y="term")
    assert set(plots) == {"cdf", "histogram", "bars", "xy", "timeline", "intervals"}
    blank = _screenshot(
        render_html(Report(["header"], False, [Section("none", "none")])), tmp_path, "blank"
    )
    assert _count_colour(blank, PALETTE[0]) == 0
    for kind, plot in plots.items():
        page = render_html(Report(["header"], False, [Section(kind, kind, plots=[plot])]))
        drawn = _screenshot(page, tmp_path, kind)
        # Every kind draws its first series (or its whiskers) in the first colour.
        assert _count_colour(drawn, PALETTE[0]) > 100, kind
