"""The bundle manifest: incomplete until finished, checksums, clear errors."""

import json
from pathlib import Path

import pytest

from tracekit.bundle import (
    BundleWriter,
    Manifest,
    RunRecord,
    files_below,
    read_manifest,
    verify_files,
)
from tracekit.errors import TracekitError


def test_bundle_is_incomplete_until_finished(tmp_path: Path) -> None:
    writer = BundleWriter.create(tmp_path / "b", Manifest(options={"runs": 2}))
    run = writer.start_run(RunRecord("before-quiet-0", "before", "quiet", 0, start_ns=5))
    writer.path("runs/before-quiet-0/cyclictest.txt").write_text("T: 0 ...\n")
    assert read_manifest(tmp_path / "b").complete is False
    writer.end_run(run)
    writer.finish()
    manifest = read_manifest(tmp_path / "b")
    assert manifest.complete
    assert manifest.runs[0].status == "ok"
    assert "runs/before-quiet-0/cyclictest.txt" in manifest.files
    assert verify_files(tmp_path / "b", manifest) == []


def test_every_file_below_is_checksummed_with_its_size(tmp_path: Path) -> None:
    """The listing by directory entries finds what rglob would (nested, empty directories,
    a symlink to a file), and the sizes read while hashing are the files' own."""
    writer = BundleWriter.create(tmp_path / "b", Manifest())
    nested = writer.path("runs/before-traced-0/trace/events/sched/sched_switch/format")
    nested.write_text("name: sched_switch\n")
    writer.path("runs/before-traced-0/trace/per_cpu/cpu0/trace_pipe_raw").write_bytes(
        b"\0" * (3 << 20)  # more than one read chunk
    )
    (tmp_path / "b" / "runs" / "empty").mkdir()
    (tmp_path / "b" / "link").symlink_to(nested)
    root = tmp_path / "b"
    assert sorted(files_below(root)) == sorted(p for p in root.rglob("*") if p.is_file())
    assert files_below(root / "absent") == []
    writer.finish()
    files = read_manifest(root).files
    assert sorted(files) == [
        "link",
        "runs/before-traced-0/trace/events/sched/sched_switch/format",
        "runs/before-traced-0/trace/per_cpu/cpu0/trace_pipe_raw",
    ]
    assert files["runs/before-traced-0/trace/per_cpu/cpu0/trace_pipe_raw"]["size"] == 3 << 20
    assert files["link"] == files["runs/before-traced-0/trace/events/sched/sched_switch/format"]
    assert verify_files(root, read_manifest(root)) == []


def test_interrupted_bundle_says_so(tmp_path: Path) -> None:
    writer = BundleWriter.create(tmp_path / "b", Manifest())
    writer.start_run(RunRecord("after-traced-0", "after", "traced", 0))
    writer.mark_incomplete("interrupted by SIGINT")
    manifest = read_manifest(tmp_path / "b")
    assert not manifest.complete
    assert manifest.incomplete_reason == "interrupted by SIGINT"
    assert manifest.runs[0].status == "interrupted"


def test_changed_file_is_detected(tmp_path: Path) -> None:
    writer = BundleWriter.create(tmp_path / "b", Manifest())
    writer.path("x.txt").write_text("one")
    writer.finish()
    (tmp_path / "b" / "x.txt").write_text("two")
    assert verify_files(tmp_path / "b", read_manifest(tmp_path / "b")) == [
        "x.txt: changed since collection (sha256 differs)"
    ]


def test_refuses_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "other").write_text("")
    with pytest.raises(TracekitError, match="not empty"):
        BundleWriter.create(tmp_path / "b", Manifest())


def test_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(TracekitError, match=r"no manifest\.json"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(TracekitError, match="not a tracekit bundle manifest"):
        read_manifest(tmp_path)


def test_library_takes_a_path_as_text(tmp_path: Path) -> None:
    """A notebook passes str: load_bundle and read_manifest accept it like a Path."""
    from report_bundles import copy_real_bundle

    from tracekit.ingest.bundle import load_bundle

    root = copy_real_bundle(tmp_path / "b")
    assert load_bundle(str(root)).manifest == read_manifest(root)
    assert read_manifest(str(root)).complete


def test_a_saved_manifest_is_the_same_json_without_the_deep_copy() -> None:
    """save() writes fields_for_json(), which copies nothing: the same text as to_json()'s
    on real bundles' manifests (every fixture bundle), and the manifest is left as it was."""
    fixtures = sorted((Path(__file__).parent / "fixtures").rglob("manifest.json"))
    manifests = [read_manifest(path.parent) for path in fixtures if "cache" not in str(path)]
    assert len(manifests) >= 3
    for manifest in manifests:
        before = json.dumps(manifest.to_json(), indent=2, sort_keys=True)
        assert json.dumps(manifest.fields_for_json(), indent=2, sort_keys=True) == before
        assert json.dumps(manifest.to_json(), indent=2, sort_keys=True) == before


def test_a_collectors_finish_takes_each_runs_list_and_walks_the_rest(tmp_path: Path) -> None:
    """finish(runs_listed=True), the collector's: the files its runs listed and every file
    outside runs/ get their checksums, as a whole walk gives them when the lists are
    complete; runs/ itself is not walked (a file no run lists is not taken)."""
    manifests = {}
    for name, listed in (("walked", False), ("listed", True)):
        writer = BundleWriter.create(tmp_path / name, Manifest())
        run = writer.start_run(RunRecord("before-quiet-0", "before", "quiet", 0))
        writer.path("runs/before-quiet-0/cyclictest.txt").write_text("T: 0\n")
        writer.path("runs/before-quiet-0/trace/events/sched/sched_switch/format").write_text("x")
        writer.path("groundtruth/notes.txt").write_text("outside runs/\n")
        run.files = [
            "runs/before-quiet-0/cyclictest.txt",
            "runs/before-quiet-0/trace/events/sched/sched_switch/format",
        ]
        writer.end_run(run)
        if listed:
            writer.path("runs/before-quiet-0/unlisted.txt").write_text("not taken\n")
        writer.finish(runs_listed=listed)
        manifests[name] = read_manifest(tmp_path / name)
    assert manifests["listed"].files == manifests["walked"].files
    assert sorted(manifests["listed"].files) == [
        "groundtruth/notes.txt",
        "runs/before-quiet-0/cyclictest.txt",
        "runs/before-quiet-0/trace/events/sched/sched_switch/format",
    ]
    assert verify_files(tmp_path / "listed", manifests["listed"]) == []
