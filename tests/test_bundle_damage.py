"""Damaged bundles: a manifest of the wrong shape is one line; missing or changed files are
said by `tracekit verify`, first in every report, and in the Perfetto export's notes."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main

REPORT_FIXTURE = Path(__file__).parent / "fixtures" / "report" / "nvhe-a76"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A copy of a real emulated-host bundle."""
    root = tmp_path / "b"
    shutil.copytree(REPORT_FIXTURE, root)
    return root


def _rewrite(root: Path, change) -> None:  # type: ignore[no-untyped-def]
    """Apply `change` to the manifest's JSON data and write it back."""
    path = root / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps(change(data)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: [d], "a JSON list, not an object"),
        (lambda d: d | {"runs": "before-quiet-0"}, "runs is 'before-quiet-0'"),
        (lambda d: d | {"host": None}, "host is None"),
        (lambda d: d | {"options": None}, "options is None"),
        (lambda d: d | {"schema_version": "1"}, "schema_version is '1'"),
        (lambda d: d | {"schema_version": None}, "schema_version is None"),
        (lambda d: d | {"complete": "false"}, "complete is 'false'"),
        (lambda d: d | {"runs": [{"phase": "x"}]}, "runs[0] has no run_id"),
        (lambda d: d | {"runs": [d["runs"][0] | {"run_id": "../../x"}]}, "not a plain name"),
        (lambda d: d | {"runs": [d["runs"][0] | {"probe_misses": 3}]}, "probe_misses is 3"),
        (lambda d: d | {"runs": [d["runs"][0] | {"since_guest_ns": "1"}]}, "since_guest_ns is"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_one_line(bundle: Path, change, message: str) -> None:  # type: ignore[no-untyped-def]
    _rewrite(bundle, change)
    for command in (["report", str(bundle)], ["verify", str(bundle)], ["ingest", str(bundle)]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2, (command, result.output)
        assert message in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_verify_says_ok_then_every_missing_or_changed_file(bundle: Path) -> None:
    result = CliRunner().invoke(main, ["verify", str(bundle)])
    assert result.exit_code == 0 and "ok (every file as collected)" in result.output
    (bundle / "runs" / "before-quiet-1" / "cyclictest.txt").unlink()
    probe = next(bundle.glob("runs/*/probe.json"))
    data = bytearray(probe.read_bytes())
    data[-1] ^= 0xFF  # same size: only the hash can tell
    probe.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["verify", str(bundle)])
    assert result.exit_code == 1
    assert "runs/before-quiet-1/cyclictest.txt: missing" in result.output
    assert f"{probe.relative_to(bundle)}: changed since collection" in result.output


def test_a_report_says_first_what_is_missing_and_never_reads_a_resized_file(
    bundle: Path,
) -> None:
    (bundle / "runs" / "before-quiet-1" / "cyclictest.txt").unlink()
    stress = bundle / "runs" / "after-quiet-0" / "stress-ng.yaml"
    stress.write_text(stress.read_text() + "# edited\n")
    text = CliRunner().invoke(main, ["report", str(bundle)]).output
    assert "DAMAGED bundle: 2 file(s) missing, changed or cut" in _first_line(text)
    header = json.loads(CliRunner().invoke(main, ["report", "-f", "json", str(bundle)]).output)
    damaged = next(line for line in header["warnings"] if line.startswith("DAMAGED"))
    assert "cyclictest.txt: missing" in damaged and "stress-ng.yaml: " in damaged
    # A hash change is found on request only.
    probe = next(bundle.glob("runs/*/probe.json"))
    data = bytearray(probe.read_bytes())
    data[-1] ^= 0xFF
    probe.write_bytes(bytes(data))
    verified = CliRunner().invoke(main, ["report", "--verify", str(bundle)]).output
    assert "DAMAGED bundle: 3 file(s)" in _first_line(verified)


def _first_line(text: str) -> str:
    """A text report's first line, unwrapped (its continuation lines are indented)."""
    lines = text.splitlines()
    rest = [line.strip() for line in lines[1:]]
    ends = next((i for i, line in enumerate(lines[1:]) if not line.startswith("  ")), len(rest))
    return " ".join([lines[0], *rest[:ends]])


def test_a_damaged_trace_is_one_line_not_read(tmp_path: Path) -> None:
    """A run whose trace has a changed file: opening it says so (it was an assert)."""
    from tracekit.errors import TracekitError
    from tracekit.ingest.bundle import load_bundle, open_run_trace

    root = tmp_path / "b"
    shutil.copytree(Path(__file__).parent / "fixtures" / "perfetto" / "nvhe-a76-kprobes", root)
    capture = root / "runs" / "guest" / "trace" / "capture.json"
    capture.write_text(capture.read_text() + " ")
    data = load_bundle(root)
    guest = next(r for r in data.manifest.runs if r.run_id == "guest")
    with pytest.raises(TracekitError, match="guest's trace is damaged and not read"):
        open_run_trace(data, guest)


@pytest.mark.parametrize(
    ("fixture", "removed", "said"),
    [
        ("report/nvhe-a76", "runs/before-quiet-1", "runs/before-quiet-1/cyclictest.txt"),
        ("perfetto/nvhe-a76-kprobes", "runs/guest/trace", "runs/guest/trace/capture.json"),
        (
            "perfetto/nvhe-a76-kprobes",
            "runs/guest/trace/capture.json",
            "runs/guest/trace/capture.json",
        ),
        (
            "perfetto/nvhe-a76-kprobes",
            "runs/guest/trace/per_cpu/cpu0/trace_pipe_raw",
            "runs/guest/trace/per_cpu/cpu0/trace_pipe_raw",
        ),
    ],
    ids=["run-directory", "trace", "capture-json", "cpu-file"],
)
def test_a_removed_run_trace_or_cpu_file_is_said_by_verify_report_and_perfetto(
    tmp_path: Path, fixture: str, removed: str, said: str
) -> None:
    # Issue 16 point 5: each of these once removed its run or section silently (exit 0).
    root = tmp_path / "b"
    shutil.copytree(Path(__file__).parent / "fixtures" / fixture, root)
    gone = root / removed
    shutil.rmtree(gone) if gone.is_dir() else gone.unlink()
    for argv, code in (
        (["verify", str(root)], 1),
        (["report", "--no-progress", str(root)], 0),
        (["perfetto", str(root), "-o", str(tmp_path / "out.pftrace")], 0),
    ):
        result = CliRunner().invoke(main, argv)
        assert not isinstance(result.exception, Exception), (argv, result.exception)
        assert result.exit_code == code, (argv, result.output)
        assert f"{said}: missing (the manifest lists it)" in " ".join(result.output.split()), argv
        if argv[0] == "report":
            assert "DAMAGED bundle" in _first_line(result.output)


def test_files_behind_symlinks_are_checked_as_before(bundle: Path, tmp_path: Path) -> None:
    """The one-walk listing takes only files reached through no symlink; a file behind a
    symlink inside the bundle is resolved and checked, one outside is refused."""
    from tracekit.bundle import damaged_files, read_manifest
    from tracekit.errors import TracekitError

    manifest = read_manifest(bundle)
    rel = next(r for r in sorted(manifest.files) if r.startswith("runs/") and r.count("/") == 2)
    assert damaged_files(bundle, manifest, full=True) == {}
    run_dir, name = rel.rsplit("/", 1)
    (bundle / "moved").mkdir()
    (bundle / rel).rename(bundle / "moved" / name)
    (bundle / rel).symlink_to(bundle / "moved" / name)  # still the same bytes, inside
    assert damaged_files(bundle, manifest, full=True) == {}
    (bundle / rel).unlink()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / name).write_bytes((bundle / "moved" / name).read_bytes())
    shutil.rmtree(bundle / run_dir)
    (bundle / run_dir).symlink_to(outside)  # the run's directory leaves the bundle
    with pytest.raises(TracekitError, match="outside the bundle"):
        damaged_files(bundle, manifest)
    (bundle / run_dir).unlink()
    assert "missing (the manifest lists it)" in damaged_files(bundle, manifest).values()
