#!/usr/bin/env python3
"""Dataset benchmark: 200 generated bundles -> `tracekit dataset`, queried, and reported.

Generates `--bundles` bundles (tests/bundlegen.py: real cyclictest and probe samples,
a 2x2 knob design with replicates, split over four campaigns), appends them to a
dataset, and prints: the time to build it and its size beside the bundles', a DuckDB
and a polars query's time, and the cross-campaign report's time over the dataset
against the same report over the bundles (which loads every bundle's files).

    python3 benchmarks/dataset.py [--bundles 200] [--keep DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import duckdb
import polars as pl
from bundlegen import Spec, generate

from tracekit.dataset import add_campaigns
from tracekit.ingest.dataset import read_dataset
from tracekit.report.assemble import build_report
from tracekit.report.load import load_bundles

CAMPAIGNS = 4


def make_bundles(root: Path, count: int) -> list[Path]:
    """`count` bundles over CAMPAIGNS campaign directories: mmu x ng, replicated."""
    campaigns = [root / f"camp-{c}" for c in range(CAMPAIGNS)]
    for n in range(count):
        mmu, ng = n % 2, (n // 2) % 2
        spec = Spec(runs=4, factor=2.0 if mmu else 1.0, seed=n, knobs=(f"mmu={mmu}", f"ng={ng}"))
        generate(campaigns[n % CAMPAIGNS] / f"{n:04d}-mmu{mmu}-ng{ng}", spec)
    return campaigns


def size(path: Path) -> int:
    """Bytes of every file under `path`."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(label: str, work):  # type: ignore[no-untyped-def]
    """Run `work`, print its wall time, return its result."""
    start = time.perf_counter()
    result = work()
    print(f"{label:<44} {time.perf_counter() - start:8.2f} s")
    return result


def main() -> None:
    """Build, query and report; print each step's time and the sizes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=int, default=200)
    parser.add_argument("--keep", type=Path, help="Build here and keep it (default: a temp dir).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        campaigns = timed(
            f"generate {args.bundles} bundles", lambda: make_bundles(root, args.bundles)
        )
        out = root / "dataset"
        timed("tracekit dataset (append 4 campaigns)", lambda: add_campaigns(campaigns, out))
        again = timed("append the same campaigns again", lambda: add_campaigns(campaigns, out))
        assert all(a.added == 0 for a in again)
        bundles_size = sum(size(c) for c in campaigns)
        print(f"{'bundles on disk':<44} {bundles_size / 1e6:8.1f} MB")
        print(f"{'dataset on disk':<44} {size(out) / 1e6:8.1f} MB")
        glob = (out / "latencies" / "*" / "*" / "*.parquet").as_posix()
        query = (
            "select campaign, knobs, phase, quantile_disc(latency_ns, 0.999) from"
            f" read_parquet('{glob}', hive_partitioning = true, union_by_name = true)"
            " group by all"
        )
        rows = timed(
            "DuckDB: p99.9 per campaign, knobs, phase", lambda: duckdb.sql(query).fetchall()
        )
        lazy = pl.scan_parquet(
            out / "latencies" / "**" / "*.parquet", hive_partitioning=True, missing_columns="insert"
        )
        timed(
            "polars: the same",
            lambda: (
                lazy.group_by("campaign", "knobs", "phase")
                .agg(pl.col("latency_ns").quantile(0.999, "higher"))
                .collect()
            ),
        )
        print(f"{'  groups':<44} {len(rows):8d}")
        over_dataset = timed("report over the dataset", lambda: build_report(read_dataset(out)))
        over_bundles = timed(
            "report over the bundles (all sections)", lambda: build_report(load_bundles(campaigns))
        )
        keys = [s.key for s in over_dataset.sections]
        same = all(
            s.findings == next(o for o in over_bundles.sections if o.key == s.key).findings
            for s in over_dataset.sections
        )
        print(f"dataset report sections: {', '.join(keys)}; findings equal to the bundles': {same}")


if __name__ == "__main__":
    main()
