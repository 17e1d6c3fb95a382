"""`tracekit dataset`: many campaigns' per-run results as one Parquet dataset.

Each bundle becomes one file per table (layout: tracekit/ingest/dataset.py), its rows
tagged with the bundle's id and its condition's fields as columns (analysis/conditions.py
is their one owner; a field the bundle did not record is null, never "unknown" text).
The tables hold what the cross-campaign analyses and a query need without the raw traces:
every cyclictest sample, stress-ng rates, probe summaries and samples, the VMM's VM steps,
per-run metrics and lost events per CPU.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from tracekit.analysis import groundtruth as gt
from tracekit.analysis.conditions import Condition, Unknown
from tracekit.analysis.runs import run_metrics
from tracekit.bundle import MANIFEST, RunRecord, find_bundles
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData, load_bundle
from tracekit.ingest.dataset import (
    TABLES,
    campaign_key,
    read_index,
    table_file,
    write_index,
    write_table,
)
from tracekit.ingest.probe import probe_samples
from tracekit.report.header import bundle_condition_of

# Table columns renamed where a condition field has the same name (the VMM's per-VM
# variant and backing are what that VM ran with; the condition's are the bundle's).
_RENAMED = {"vm_steps": {"variant": "vmm_variant", "backing": "vmm_backing"}}


@dataclass(frozen=True)
class Added:
    """What one `tracekit dataset` call did for one campaign."""

    campaign: str
    added: int  # bundles written
    skipped: int  # bundles the dataset held already (same manifest)
    rows: dict[str, int]  # rows written per table


def add_campaigns(
    sources: list[Path],
    out: Path,
    campaign: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Added]:
    """Append each source (a campaign directory or a bundle) to the dataset at `out`."""
    out.mkdir(parents=True, exist_ok=True)
    index = read_index(out)
    results = []
    for source in sources:
        name = campaign or _campaign_name(source)
        campaign_key(name)  # refuse an unusable name before writing anything
        added, skipped, rows = 0, 0, dict.fromkeys(TABLES, 0)
        for bundle in find_bundles(source):
            bundle_id = bundle_identity(bundle)
            if index.holds(bundle_id):
                skipped += 1
                continue
            if progress is not None:
                progress(f"dataset: {name}: adding {bundle}")
            counts = _write_bundle(out, name, bundle_id, load_bundle(bundle), source)
            counts["manifest_sha256"] = manifest_sha256(bundle)
            index.bundles.append(counts)
            write_index(out, index)  # after the bundle's files: a crash never lists half
            for table, n in counts["rows"].items():
                rows[table] += n
            added += 1
        results.append(Added(name, added, skipped, rows))
    return results


def manifest_sha256(bundle: Path) -> str:
    """The SHA-256 of a bundle's manifest, which holds every file's checksum."""
    try:
        return hashlib.sha256((bundle / MANIFEST).read_bytes()).hexdigest()
    except OSError as err:
        raise TracekitError(f"dataset: cannot read {bundle / MANIFEST} ({err.strerror})") from None


def bundle_identity(bundle: Path) -> str:
    """A bundle's id in the dataset: its manifest's SHA-256, shortened to 128 bits."""
    return manifest_sha256(bundle)[:32]


def _campaign_name(source: Path) -> str:
    """A campaign's name: its directory's (a lone bundle: the directory holding it)."""
    resolved = source.resolve()
    return (resolved.parent if (resolved / MANIFEST).is_file() else resolved).name


def condition_columns(condition: Condition) -> dict[str, str | None]:
    """The condition's fields as column values: an unrecorded field is null."""
    values = {}
    for f in fields(condition):
        value = getattr(condition, f.name)
        values[f.name] = None if isinstance(value, Unknown) else str(value)
    return values


def bundle_tables(data: BundleData) -> dict[str, pl.DataFrame]:
    """Every table of one bundle, before the id and condition columns are added."""
    runs = pl.DataFrame(
        [(r.run_id, r.phase, r.kind) for r in data.manifest.runs],
        schema={"run_id": pl.String, "phase": pl.String, "kind": pl.String},
        orient="row",
    )
    metrics = (
        run_metrics(data.latencies).join(runs, on="run_id", how="left")
        if data.latencies.height
        else pl.DataFrame()
    )
    return {
        "bundles": _bundle_row(data),
        "latencies": data.latencies,
        "stress": data.stress,
        "probes": data.probes,
        "cycles": data.cycles,
        "metrics": metrics,
        "probe_samples": probe_samples(data),
        "vm_steps": _vm_steps(data),
        "lost": _lost(data),
        "groundtruth": _ground_truth(data),
    }


def _bundle_row(data: BundleData) -> pl.DataFrame:
    """One row: the manifest itself (what the report rebuilds the bundle from) and its state."""
    manifest = data.manifest
    return pl.DataFrame(
        {
            "manifest": [json.dumps(manifest.to_json(), sort_keys=True)],
            "complete": [manifest.complete],
            "created": [manifest.created],
            "bundle_schema_version": [manifest.schema_version],
            "tracekit_version": [manifest.tracekit_version],
            "problems": [len(data.problems)],
        }
    )


def _vm_steps(data: BundleData) -> pl.DataFrame:
    """Every VM the VMM reported (create, run, teardown times), by run."""
    frames = []
    for run in data.manifest.runs:
        vmm = data.run(run).vmm
        if vmm is None or vmm.vms.height == 0:
            continue
        frames.append(
            vmm.vms.with_columns(
                pl.lit(run.run_id).alias("run_id"), pl.lit(run.phase).alias("phase")
            )
        )
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def _lost(data: BundleData) -> pl.DataFrame:
    """Lost events per run and CPU, as ingest/lost.py counts them (trace and manifest)."""
    rows = []
    for run in data.manifest.runs:
        per_cpu = data.run(run).lost_per_cpu if run.lost_events or _traced(data, run) else {}
        rows += [(run.run_id, run.phase, run.kind, cpu, n) for cpu, n in sorted(per_cpu.items())]
    schema = {"run_id": pl.String, "phase": pl.String, "kind": pl.String}
    return pl.DataFrame(rows, schema=schema | {"cpu": pl.Int32, "lost": pl.Int64}, orient="row")


def _ground_truth(data: BundleData) -> pl.DataFrame:
    """An emulated bundle's executed invalidations counted per run, phase, CPU, operation,
    where and reach (analysis/groundtruth.py); none without the plugin's log."""
    found = data.ground_truth()
    if found is None:
        return pl.DataFrame()
    _, given = found
    keys = ["run_id", "phase", "cpu", "operation", "where", "regime", "reach", "function"]
    return gt.counts(gt.by_instruction(given), keys)


def _traced(data: BundleData, run: RunRecord) -> bool:
    """True when the run left a trace to count losses in."""
    return data.run(run).trace_path is not None


def _write_bundle(
    out: Path, campaign: str, bundle_id: str, data: BundleData, source: Path
) -> dict[str, object]:
    """Write the bundle's non-empty tables; its index entry (rows per table)."""
    tagged = {"bundle_id": bundle_id} | condition_columns(bundle_condition_of(data))
    rows = {}
    for table, frame in bundle_tables(data).items():
        rows[table] = frame.height
        if frame.height == 0:
            continue  # no file: the index says 0 rows, and no reader meets an empty schema
        frame = frame.rename(_RENAMED.get(table, {}))
        clash = set(frame.columns) & set(tagged)
        if clash:
            raise TracekitError(f"dataset: table {table} already has columns {sorted(clash)}")
        columns = [pl.lit(v, pl.String).alias(k) for k, v in tagged.items()]
        write_table(table_file(out, table, campaign, bundle_id), frame.with_columns(columns))
    return {
        "bundle_id": bundle_id,
        "campaign": campaign,
        "source": _relative_source(data.path, source),
        "added": datetime.now(UTC).isoformat(timespec="seconds"),
        "added_columns": sorted(tagged),
        "rows": rows,
    }


def _relative_source(bundle: Path, source: Path) -> str:
    """The bundle's path inside its campaign directory (never a machine's absolute path)."""
    root = source.resolve()
    if (root / MANIFEST).is_file():
        return root.name
    return bundle.resolve().relative_to(root).as_posix()
