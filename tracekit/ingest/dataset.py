"""A results dataset on disk: its layout, its index, and reading it back as BundleData.

`tracekit dataset` (tracekit/dataset.py) writes many campaigns' per-run results as one
hive-partitioned Parquet dataset that DuckDB, polars or Spark read directly:

    DIR/dataset.json                                  the index: every bundle it holds
    DIR/<table>/campaign=<name>/schema_version=<n>/<bundle_id>.parquet

One file per bundle and table, so appending a campaign writes new files and never
rewrites old ones; a bundle's id is the SHA-256 of its manifest.json (which holds every
file's checksum), so the same bundle appended twice is found in the index and skipped.
This module owns that layout; the writer and every reader go through it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.bundle import Manifest
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import (
    CYCLES_SCHEMA,
    LATENCY_SCHEMA,
    STRESS_SCHEMA,
    BundleData,
    recorded_lost,
)

INDEX = "dataset.json"
FORMAT = "tracekit-dataset"
# The tables' schema version: a partition key, so a reader can take one layout at a time.
SCHEMA_VERSION = 1
# The tables, each one file per bundle; the report reads back the first five.
TABLES = (
    "bundles",
    "latencies",
    "stress",
    "probes",
    "cycles",
    "metrics",
    "probe_samples",
    "vm_steps",
    "lost",
    "groundtruth",
)
# A table with no rows has no file; it reads back with the schema load_bundle gives it.
EMPTY = {"latencies": LATENCY_SCHEMA, "stress": STRESS_SCHEMA, "cycles": CYCLES_SCHEMA}
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class DatasetIndex:
    """dataset.json: what the dataset holds, one entry per bundle, in the order added."""

    bundles: list[dict[str, Any]] = field(default_factory=list)
    format: str = FORMAT
    schema_version: int = SCHEMA_VERSION

    def holds(self, bundle_id: str) -> bool:
        """True when the bundle with this id was added before."""
        return any(entry["bundle_id"] == bundle_id for entry in self.bundles)


def is_dataset(path: Path) -> bool:
    """True for a directory `tracekit dataset` wrote (it has the index)."""
    return (path / INDEX).is_file()


def campaign_key(name: str) -> str:
    """A campaign's name as a partition value: safe in a path and in a hive key."""
    key = _SAFE.sub("_", name).strip("._")
    if not key:
        raise TracekitError(f"dataset: campaign name {name!r} has no usable characters")
    return key


def table_file(root: Path, table: str, campaign: str, bundle_id: str) -> Path:
    """Where one bundle's rows of one table live."""
    return (
        root
        / table
        / f"campaign={campaign_key(campaign)}"
        / f"schema_version={SCHEMA_VERSION}"
        / f"{bundle_id}.parquet"
    )


def read_index(root: Path) -> DatasetIndex:
    """The dataset's index; a directory without one is an empty dataset to start."""
    path = root / INDEX
    if not path.exists():
        return DatasetIndex()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TracekitError(
            f"{path}: not a readable dataset index ({err}); name a directory `tracekit"
            " dataset -o` wrote, or a new one"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TracekitError(f"{path}: not a tracekit dataset index (format is not {FORMAT})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise TracekitError(
            f"{path}: dataset schema version {data.get('schema_version')!r}, this tracekit"
            f" reads {SCHEMA_VERSION}; write a new dataset with this version"
        )
    return DatasetIndex(bundles=list(data.get("bundles", [])))


def write_index(root: Path, index: DatasetIndex) -> None:
    """Replace the index atomically: a crash leaves the old one or the new one."""
    path = root / INDEX
    tmp = path.with_name(f".{INDEX}.tmp")
    tmp.write_text(json.dumps(vars(index), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def write_table(path: Path, frame: pl.DataFrame) -> None:
    """Write one bundle's table file atomically (a crash never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    frame.write_parquet(tmp)
    os.replace(tmp, path)


def read_dataset(root: Path) -> list[BundleData]:
    """Each bundle of the dataset as BundleData built from its tables, with no raw files.

    Only what a cross-bundle analysis needs comes back (manifest, latencies, stress,
    probe summaries, cycles); `tables_only` is set so a report runs only the sections that
    need nothing else.
    """
    index = read_index(root)
    if not index.bundles:
        raise TracekitError(f"{root}: the dataset holds no bundles; add some with tracekit dataset")
    return [_bundle(root, entry) for entry in index.bundles]


def _bundle(root: Path, entry: dict[str, Any]) -> BundleData:
    """One bundle back from its table files."""
    campaign, bundle_id = entry["campaign"], entry["bundle_id"]

    def table(name: str) -> pl.DataFrame:
        """The bundle's rows of one table, without the columns the writer added."""
        if entry["rows"].get(name) == 0:
            return pl.DataFrame(schema=EMPTY.get(name, {}))
        path = table_file(root, name, campaign, bundle_id)
        if not path.is_file():
            raise TracekitError(
                f"{path}: missing from the dataset its index lists; re-add the bundle"
                f" {entry['source']} with tracekit dataset"
            )
        frame = pl.read_parquet(path, hive_partitioning=False)
        return frame.drop([c for c in frame.columns if c in entry["added_columns"]])

    row = table("bundles").row(0, named=True)
    manifest = Manifest.from_json(json.loads(row["manifest"]))
    return BundleData(
        path=Path(entry["source"]),
        manifest=manifest,
        latencies=table("latencies"),
        stress=table("stress"),
        probes=table("probes"),
        lost=recorded_lost(manifest),
        cycles=table("cycles"),
        tables_only=True,
    )
