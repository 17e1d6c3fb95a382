"""`tracekit dataset`: generated campaigns appended to one Parquet dataset, read by polars
and DuckDB, and the cross-campaign report over it equal to the report over the bundles."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest
from bundlegen import Spec, generate
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.dataset import add_campaigns
from tracekit.ingest.bundle import load_bundle
from tracekit.ingest.dataset import INDEX, read_dataset
from tracekit.report.assemble import TABLE_SECTIONS, TABLES_ONLY_LINE, build_report
from tracekit.report.load import load_bundles
from tracekit.report.text import render_text


def _campaign(root: Path, boot: int) -> Path:
    """A 2x2 knob campaign (mmu x ng), one boot of each cell; mmu=1 doubles the effect."""
    for mmu in ("0", "1"):
        for ng in ("0", "1"):
            seed = 10 * boot + 2 * int(mmu) + int(ng) + 1
            spec = Spec(
                runs=4,
                factor=2.0 if mmu == "1" else 1.0,
                seed=seed,
                knobs=(f"mmu={mmu}", f"ng={ng}"),
                guest_revision=None if (mmu, ng) == ("0", "0") else "1",
            )
            generate(root / f"mmu{mmu}-ng{ng}", spec)
    return root


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two campaigns of the same design: boot 0 and boot 1."""
    base = tmp_path_factory.mktemp("campaigns")
    return _campaign(base / "camp-a", 0), _campaign(base / "camp-b", 1)


@pytest.fixture(scope="module")
def dataset(campaigns: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both campaigns appended, one call each."""
    out = tmp_path_factory.mktemp("dataset")
    for camp in campaigns:
        (added,) = add_campaigns([camp], out)
        assert (added.added, added.skipped) == (4, 0)
    return out


def _files(root: Path) -> dict[Path, int]:
    """Every Parquet file under the dataset with its modification time."""
    return {p: p.stat().st_mtime_ns for p in root.rglob("*.parquet")}


def test_appending_the_same_campaign_again_adds_and_rewrites_nothing(
    dataset: Path, campaigns: tuple[Path, Path]
) -> None:
    before, index = _files(dataset), (dataset / INDEX).read_text()
    (again,) = add_campaigns([campaigns[0]], dataset)
    assert (again.added, again.skipped) == (0, 4)
    assert _files(dataset) == before and (dataset / INDEX).read_text() == index


def test_layout_is_hive_partitioned_by_campaign_and_schema_version(dataset: Path) -> None:
    parts = {p.relative_to(dataset).parts[:3] for p in dataset.rglob("*.parquet")}
    assert ("latencies", "campaign=camp-a", "schema_version=1") in parts
    assert ("probe_samples", "campaign=camp-b", "schema_version=1") in parts
    index = json.loads((dataset / INDEX).read_text())
    assert [b["source"] for b in index["bundles"]][:2] == ["mmu0-ng0", "mmu0-ng1"]
    assert not any(b["source"].startswith("/") for b in index["bundles"])


def test_polars_reads_every_sample_with_conditions_as_columns(
    dataset: Path, campaigns: tuple[Path, Path]
) -> None:
    frame = pl.scan_parquet(
        dataset / "latencies" / "**" / "*.parquet",
        hive_partitioning=True,
        missing_columns="insert",
    ).collect()
    expected = sum(load_bundle(b).latencies.height for c in campaigns for b in c.iterdir())
    assert frame.height == expected
    assert {"campaign", "schema_version", "bundle_id", "variant", "knobs"} <= set(frame.columns)
    assert sorted(frame["campaign"].unique().to_list()) == ["camp-a", "camp-b"]
    # The bundle that recorded no guest revision has null there, never "unknown" text.
    revision = frame.group_by("knobs").agg(pl.col("guest_revision").null_count().alias("n"))
    nulls = dict(revision.iter_rows())
    assert nulls["mmu=0,ng=0"] > 0 and nulls["mmu=1,ng=1"] == 0


def test_duckdb_reads_the_dataset_by_partition(dataset: Path) -> None:
    glob = (dataset / "metrics" / "*" / "*" / "*.parquet").as_posix()
    rows = duckdb.sql(
        f"select campaign, count(distinct bundle_id), count(*) from read_parquet('{glob}',"
        " hive_partitioning = true, union_by_name = true) group by campaign order by campaign"
    ).fetchall()
    assert [(c, b) for c, b, _ in rows] == [("camp-a", 4), ("camp-b", 4)]
    probes = (dataset / "probe_samples" / "*" / "*" / "*.parquet").as_posix()
    ((count,),) = duckdb.sql(f"select count(*) from read_parquet('{probes}')").fetchall()
    assert count > 0


def test_report_over_the_dataset_equals_the_report_over_the_bundles(
    dataset: Path, campaigns: tuple[Path, Path]
) -> None:
    from_dataset = build_report(read_dataset(dataset))
    from_bundles = build_report(load_bundles(list(campaigns)))
    keys = [s.key for s in from_dataset.sections]
    assert "factorial" in keys and "decision" in keys
    assert len(from_dataset.sections) <= len(TABLE_SECTIONS)
    assert from_dataset.header[-1] == TABLES_ONLY_LINE
    for section in from_dataset.sections:
        other = next(s for s in from_bundles.sections if s.key == section.key)
        assert section.findings == other.findings
        assert len(section.tables) == len(other.tables)
        for mine, theirs in zip(section.tables, other.tables, strict=True):
            assert mine.frame.equals(theirs.frame)


def test_report_cli_takes_a_dataset(dataset: Path) -> None:
    result = CliRunner().invoke(main, ["report", str(dataset)])
    assert result.exit_code == 0, result.output
    assert TABLES_ONLY_LINE[:40] in result.output and "factorial" in result.output.lower()
    assert render_text(build_report(read_dataset(dataset)))  # renders as well


def test_cli_appends_and_says_what_it_did(campaigns: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "ds"
    result = CliRunner().invoke(main, ["dataset", str(campaigns[1]), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("camp-b: 4 bundles added, 0 already held (rows: bundles 4,")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no such file or directory"),
        ("not-a-dataset", "not a tracekit dataset index"),
        ("bad-name", "has no usable characters"),
    ],
)
def test_bad_input_is_one_line(
    campaigns: tuple[Path, Path], tmp_path: Path, setup: str, message: str
) -> None:
    out, args = tmp_path / "ds", [str(campaigns[0])]
    if setup == "missing":
        args = [str(tmp_path / "nope")]
    elif setup == "not-a-dataset":
        out.mkdir()
        (out / INDEX).write_text('{"format": "something else"}')
    else:
        args += ["--campaign", "///"]
    result = CliRunner().invoke(main, ["dataset", *args, "-o", str(out)])
    assert result.exit_code != 0
    assert message in result.output and result.output.count("\n") == 1
    assert "Traceback" not in result.output


def test_an_emulated_bundles_ground_truth_counts_are_a_table(tmp_path: Path) -> None:
    """The plugin's invalidations, counted as analysis/groundtruth.py counts them."""
    from test_report_groundtruth import gt_bundle

    from tracekit.analysis import groundtruth as gt

    bundle = gt_bundle(tmp_path / "camp" / "gt")
    add_campaigns([tmp_path / "camp"], tmp_path / "ds")
    (path,) = (tmp_path / "ds" / "groundtruth").rglob("*.parquet")
    table = pl.read_parquet(path)
    _, given = load_bundle(bundle).ground_truth() or (None, pl.DataFrame())
    assert table["count"].sum() == gt.invalidations(given).height > 0
    assert {"run_id", "phase", "cpu", "operation", "where", "reach", "kvm_mode"} <= set(
        table.columns
    )
