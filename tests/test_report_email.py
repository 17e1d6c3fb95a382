"""The email report: within 72 columns, ASCII only, nothing cut, the parts a reply needs."""

from __future__ import annotations

import re
from pathlib import Path

from report_bundles import EVIL_COMM, LONG_CELL, awkward_section, copy_real_bundle, make_bundle

from tracekit.ingest.bundle import load_bundle
from tracekit.report.assemble import build_report
from tracekit.report.email import WIDTH, render_email
from tracekit.report.model import Report


def _assert_fits(text: str) -> None:
    """Every line within the width, and plain ASCII."""
    long = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not long, long
    assert text.isascii()


def _squeezed(text: str) -> str:
    """The text without any whitespace: what wrapping cannot have changed."""
    return re.sub(r"\s+", "", text)


def _unwrapped(text: str) -> str:
    """The text with runs of whitespace (line breaks from wrapping) as one space."""
    return " ".join(text.split())


def test_email_of_the_real_bundle_fits_72_columns(tmp_path: Path) -> None:
    bundle = copy_real_bundle(tmp_path / "bundle")
    text = render_email(build_report([load_bundle(bundle)]))
    _assert_fits(text)
    lines = text.splitlines()
    assert lines[0].startswith("EMULATED HOST (QEMU): timings are not hardware timings.")
    flat = _unwrapped(text)
    assert "4 x Cortex-A76, KVM nvhe, emulated" in flat
    assert "bundle bundle;" in flat and str(tmp_path) not in flat  # relative, not local
    # The lead's skeleton, in order, before the details.
    heads = ["Question:", "Setup:", "Result:", "Controls:", "Not known:", "Details"]
    at = [next(i for i, line in enumerate(lines) if line.startswith(h)) for h in heads]
    assert at == sorted(at) and at[-1] < 60
    lead = _unwrapped("\n".join(lines[: at[-1]]))
    assert "isolated (isolcpus, nohz_full, rcu_nocbs)" in lead and "lost trace events:" in lead
    # The primary comparison with its interval and the rule that judged it, in the lead
    # only: each verdict is said once.
    primary = re.findall(r"cyclictest p99\.9 after/before \d\.\d\dx \[\d\.\d\d,", flat)
    assert len(primary) == 1 and primary[0] in lead
    assert flat.count("verdict rule: present:") == 1 and "verdict rule: present:" in lead
    # One unit for the probe's times; no count shown as a float.
    assert "p50_ns" not in text and "p50_us" in text
    rows = [line for line in lines[at[-1] :] if re.fullmatch(r"  +\S+( {2,}\S+)+", line)]
    assert rows and not [r for r in rows if re.search(r"\b\d+\.\d*0\b", r)]


def test_email_fits_and_cuts_nothing_on_an_awkward_report(tmp_path: Path) -> None:
    bundles = [
        load_bundle(make_bundle(tmp_path / f"cell-{guest}-{'x' * 30}", 2, 1.5, guest=guest))
        for guest in ("mmu-on", "mmu-off")
    ]
    real = build_report(bundles)
    report = Report(real.header, real.emulated, [*real.sections, awkward_section()])
    text = render_email(report)
    _assert_fits(text)
    flat = _squeezed(text)
    # Split tables keep every column and value; the long cell is wrapped, not cut.
    for i in range(9):
        assert f"metric_{i}_latency_ns" in text
    assert _squeezed(LONG_CELL) in flat
    assert _squeezed("/very/long/path" * 8) in flat
    assert _squeezed(EVIL_COMM) in flat
    assert "kworker/\\xe9\\u4e2d" in flat  # non-ASCII escaped, not dropped
    # One header line per bundle naming kernel and condition.
    assert sum("6.1.0-test" in line for line in text.splitlines()[:8]) == 2
    assert "guest mmu-off on CPU 1" in _unwrapped(text)
    # Unknowns of every section are gathered in the lead, before the details.
    tail = _unwrapped(text.split("Not known:", 1)[1].split("Details", 1)[0])
    assert "2+2 quiet runs cannot reach a verdict; the rule needs 4+4" in tail
    assert f"what {EVIL_COMM} did" in tail
