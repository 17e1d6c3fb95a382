"""`tracekit report`: formats, files, directories of bundles, progress, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_bundles import copy_real_bundle, make_bundle

from tracekit.cli import main


def _run(*args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `tracekit report ...`."""
    result = CliRunner().invoke(main, ["report", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("fmt", ["text", "email", "html", "json"])
def test_every_format_writes_a_file_and_progress_stays_on_stderr(fmt: str, tmp_path: Path) -> None:
    bundle = copy_real_bundle(tmp_path / "bundle")
    out = tmp_path / f"report.{fmt}"
    code, stdout, stderr = _run(str(bundle), "--format", fmt, "-o", str(out), "--progress")
    assert code == 0, stderr
    assert stdout == ""
    assert "report: loading bundle 1/1" in stderr and "report: beforeafter" in stderr
    text = out.read_text()
    assert "report:" not in text.split("\n", 1)[0]
    assert "EMULATED HOST" in text


def test_stdout_holds_only_the_report(tmp_path: Path) -> None:
    bundle = copy_real_bundle(tmp_path / "bundle")
    code, stdout, stderr = _run(str(bundle), "--format", "json", "--progress")
    assert code == 0
    assert json.loads(stdout)["schema_version"] == 2
    assert "report: beforeafter" in stderr


def test_a_directory_of_bundles_is_taken_as_a_whole(tmp_path: Path) -> None:
    campaign = tmp_path / "campaign"
    make_bundle(campaign / "cell-1" / "bundle", runs=2, factor=2.0, guest="mmu-on")
    make_bundle(campaign / "cell-2" / "bundle", runs=2, factor=1.0, guest="mmu-off")
    (campaign / "plan.txt").write_text("not a bundle\n")
    code, stdout, _ = _run(str(campaign), "--format", "email")
    assert code == 0
    flat = " ".join(stdout.split())
    assert "2 bundles; in all:" in flat and "guest CPU 1" in flat
    assert "cell-1/bundle: guest mmu-on" in flat and "cell-2/bundle: guest mmu-off" in flat
    for cell in ("cell-1", "cell-2"):  # one result per bundle
        assert flat.count(f"{cell}/bundle: cyclictest p99.9 ") == 1


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda p: p.mkdir(), [], "holds no tracekit bundle"),
        (lambda p: p.write_text("x"), [], "is not a directory"),
        (lambda p: None, [], "no such file or directory"),
        (lambda p: (p.mkdir(), (p / "manifest.json").write_text("{")), [], "unreadable manifest"),
        (lambda p: copy_real_bundle(p), ["--format", "pdf"], "unknown format 'pdf'"),
    ],
)
def test_bad_input_is_one_clear_line(make, args, message, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "input"
    make(target)
    code, stdout, stderr = _run(str(target), *args)
    assert code == 2
    assert stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("tracekit: error: ")
    assert message in stderr
