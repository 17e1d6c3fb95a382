"""The bundle's layout has one owner (tracekit/bundle.py): run directories, file names,
where a run's trace is, and adding a file to a finished bundle."""

import ast
import re
from pathlib import Path

import pytest

from tracekit.bundle import (
    BundleWriter,
    Manifest,
    RunFile,
    RunRecord,
    add_file,
    bundle_of,
    check_run_id,
    read_manifest,
    run_file,
    run_trace_path,
    verify_files,
)
from tracekit.errors import TracekitError

PACKAGE = Path(__file__).resolve().parents[1] / "tracekit"


def _finished(root: Path) -> Path:
    """A finished bundle with one traced run holding a trace.dat."""
    writer = BundleWriter.create(root, Manifest())
    run = writer.start_run(RunRecord("before-traced-0", "before", "traced", 0))
    writer.path(run_file(run.run_id, RunFile.TRACE_DAT)).write_bytes(b"\x17\x08Dtracing")
    writer.end_run(run)
    writer.finish()
    return root


@pytest.mark.parametrize("run_id", ["../../x", "a/b", "..", ".hidden", "", 5, None])
def test_a_run_id_that_leaves_its_directory_is_refused(run_id: object) -> None:
    with pytest.raises(TracekitError, match="not a plain name"):
        check_run_id(run_id)


def test_run_files_and_the_trace_are_found_by_name(tmp_path: Path) -> None:
    root = _finished(tmp_path / "b")
    trace = run_trace_path(root, "before-traced-0")
    assert trace == root / "runs" / "before-traced-0" / "trace.dat"
    assert bundle_of(trace) == root
    assert run_trace_path(root, "after-traced-0") is None
    # A raw capture directory comes first, also when its capture.json is missing (damage
    # is then said by the reader, not hidden by skipping the run).
    (root / "runs" / "before-traced-0" / "trace").mkdir()
    assert run_trace_path(root, "before-traced-0").name == "trace"


def test_add_file_records_it_with_checksum_and_origin(tmp_path: Path) -> None:
    root = _finished(tmp_path / "b")
    log = tmp_path / "groundtruth.log"
    log.write_bytes(b"tk-gt v1\n")
    add_file(root, run_file("before-traced-0", "groundtruth.log"), log, "vhost", "emulated")
    manifest = read_manifest(root)
    entry = manifest.files["runs/before-traced-0/groundtruth.log"]
    assert entry["added_by"] == "vhost" and entry["note"] == "emulated"
    assert entry["size"] == 9 and manifest.complete
    assert verify_files(root, manifest) == []
    assert not list(root.rglob("*.adding"))
    with pytest.raises(TracekitError, match="already exists"):
        add_file(root, "runs/before-traced-0/groundtruth.log", log, "vhost")
    with pytest.raises(TracekitError, match="outside the bundle"):
        add_file(root, "../escape.log", log, "vhost")
    assert not (tmp_path / "escape.log").exists()


def test_no_second_spelling_of_the_run_layout() -> None:
    """Outside bundle.py, no code spells runs/<id>/... or a run file's name as a literal."""
    names = {str(f) for f in RunFile} - {"trace"}  # "trace" is also a word in messages
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "bundle.py" and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree) if _has_docstring(n)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            text = node.value
            if id(node) not in docstrings and (text in names or re.search(r"(^|/)runs/", text)):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {text!r}")
    assert offenders == []


def _has_docstring(node: ast.AST) -> bool:
    """A module, class or function whose first statement is a string (its docstring)."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return isinstance(node, kinds) and ast.get_docstring(node, clean=False) is not None
