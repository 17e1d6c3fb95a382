"""The wake-up and correlation sections on a small real bundle (fixtures/analysis/wakeup-bundle).

The bundle is a page-cut of the demo bundle's traced runs (README.md there says how);
it is copied to a temporary directory because opening a trace writes its cache.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis import wakeup as wakeup_analysis
from tracekit.ingest.bundle import BundleData, load_bundle
from tracekit.report.model import Report
from tracekit.report.render import render
from tracekit.report.sections import correlation, wakeup

BUNDLE = Path(__file__).parent / "fixtures" / "analysis" / "wakeup-bundle"


def copy_bundle(tmp_path: Path, name: str = "bundle") -> Path:
    """A writable copy of the small bundle."""
    where = tmp_path / name
    shutil.copytree(BUNDLE, where)
    return where


@pytest.fixture
def data(tmp_path: Path) -> BundleData:
    """The small bundle, loaded."""
    return load_bundle(copy_bundle(tmp_path))


def test_wakeup_section_on_real_traced_runs(data: BundleData) -> None:
    section = wakeup.section([data])
    assert section is not None and section.key == "wakeup"
    assert section.findings[0].startswith("EMULATED host")
    assert section.lost_events == 0
    parts = section.tables[0].frame
    assert parts["part"].to_list()[-1] == "total"
    assert {"before_p50_us", "after_p99_us"} <= set(parts.columns)
    worst = next(t for t in section.tables if "slowest" in t.title).frame
    assert worst["total_us"].is_sorted(descending=True) and 0 < worst.height <= wakeup.WORST
    # The cut holds only part of each run: no loop-by-loop pairing is claimed.
    assert any("compared as distributions only" in f for f in section.findings)
    assert {p.kind for p in section.plots} == {"cdf", "bars"}
    # nohz_full moved some of cyclictest's timers onto a stress CPU: the finding says so.
    assert any("their timers fired on CPU 0 (a stress CPU)" in f for f in section.findings)
    # irq_delay is one number: no finding names what the interrupt waited for, which the
    # section's unknowns say it cannot tell.
    assert any("what the timer interrupt waited for" in u for u in section.unknowns)
    said = " ".join(section.findings) + " " + wakeup_analysis.COMPONENTS["irq_delay_ns"]
    assert "irqs off" not in said and "late interrupt" not in said


def test_a_run_whose_rt_cpu_lost_events_is_left_out_and_said(tmp_path: Path) -> None:
    where = copy_bundle(tmp_path)
    stats = where / "runs" / "before-traced-0" / "trace" / "per_cpu" / "cpu3" / "stats"
    stats.write_text(stats.read_text().replace("overrun: 0\n", "overrun: 7\n", 1))
    section = wakeup.section([load_bundle(where)])
    assert section is not None
    assert any("before-traced-0 left out" in f and "lost 7 events" in f for f in section.findings)
    worst = next(t for t in section.tables if "slowest" in t.title).frame
    assert set(worst["run_id"]) == {"after-traced-0"}


def test_correlation_section_shows_other_cpus_and_the_guest(data: BundleData) -> None:
    section = correlation.section([data])
    assert section is not None and section.key == "correlation"
    overview = next(t for t in section.tables if t.title.startswith("activity")).frame
    assert {"before-traced-0", "after-traced-0", "guest"} <= set(overview["run_id"])
    guest = overview.filter(pl.col("run_id") == "guest")
    running = guest.filter(pl.col("activity") == "guest")
    assert running["cpu"].to_list() == [1] and running["n"].item() > 0
    # "Other CPUs", but for the rt CPU's IPIs to itself, which the note names.
    table = next(t for t in section.tables if t.title.startswith("activity"))
    rt_rows = overview.filter(pl.col("cpu") == 3)
    assert set(rt_rows["activity"]) <= {"ipi_to_rt"}
    assert "the IPIs it raised to itself" in table.note
    timelines = [p for p in section.plots if p.kind == "timeline"]
    assert len(timelines) == 2
    assert all(p.frame["lane"][0] == "cpu3 wake-up" for p in timelines)
    assert "broadcast" in section.findings[0]


def test_both_sections_fit_the_email_width(data: BundleData) -> None:
    sections = [wakeup.section([data]), correlation.section([data])]
    report = Report(header=["test"], emulated=True, sections=[s for s in sections if s])
    text = render(report, "email")
    assert max(len(line) for line in text.splitlines()) <= 72
    assert "What the other CPUs did" in text


def test_no_traced_runs_means_no_section(tmp_path: Path) -> None:
    where = copy_bundle(tmp_path)
    for run in ("before-traced-0", "after-traced-0", "guest"):
        shutil.rmtree(where / "runs" / run / "trace")
    data = load_bundle(where)
    assert wakeup.section([data]) is None
    assert correlation.section([data]) is None
