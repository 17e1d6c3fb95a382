"""The Parquet cache is reused while inputs are unchanged and rebuilt when they change."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl

import tracekit
from tracekit.ingest.cache import cache_dir

FIX = Path(__file__).parent / "fixtures" / "ingest"


def test_bare_file_cache_reuse_and_invalidation(tmp_path: Path) -> None:
    """Second open comes from the cache; a touched file too; changed bytes re-parse."""
    dat = tmp_path / "t.dat"
    shutil.copy(FIX / "small.v7zstd.dat", dat)
    first = tracekit.open(dat)
    assert not first.from_cache and (cache_dir(dat) / "events.parquet").exists()
    again = tracekit.open(dat)
    assert again.from_cache and again.events.equals(first.events)
    assert again.event("sched_switch").equals(first.event("sched_switch"))
    assert again.lost.equals(first.lost)
    os.utime(dat, ns=(1, 1))  # same content, new mtime: still valid after hashing
    assert tracekit.open(dat).from_cache
    shutil.copy(FIX / "small.v6.dat", dat)  # different content
    changed = tracekit.open(dat)
    assert not changed.from_cache and changed.meta["reader"] == "trace.dat v6"


def test_directory_cache_lives_inside(tmp_path: Path) -> None:
    """A raw capture's cache is inside it and does not count as one of its inputs."""
    cap = tmp_path / "cap"
    shutil.copytree(FIX / "rawcap", cap)
    tracekit.open(cap)
    assert (cap / ".tracekit-cache" / "cache.json").exists()
    assert tracekit.open(cap).from_cache
    stats = cap / "per_cpu" / "cpu0" / "stats"
    stats.write_text(stats.read_text().replace("overrun: 0", "overrun: 7"))
    reparsed = tracekit.open(cap)
    assert not reparsed.from_cache
    assert reparsed.lost.filter(source="stats_overrun")["count"].to_list() == [7]


def test_salvage_is_part_of_the_key(tmp_path: Path) -> None:
    """A salvaged parse is not served to a strict open (and the reverse)."""
    dat = tmp_path / "t.dat"
    shutil.copy(FIX / "small.v7.dat", dat)
    tracekit.open(dat, salvage=True)
    assert not tracekit.open(dat).from_cache


def test_a_cache_of_the_old_format_is_rebuilt(tmp_path: Path) -> None:
    """Format 3 stored the events' current task as `pid`: such a cache is parsed anew."""
    dat = tmp_path / "t.dat"
    shutil.copy(FIX / "small.v7zstd.dat", dat)
    tracekit.open(dat)
    cdir = cache_dir(dat)
    key = json.loads((cdir / "cache.json").read_text())
    (cdir / "cache.json").write_text(json.dumps({**key, "format": 3}))
    events = pl.read_parquet(cdir / "events.parquet").rename({"common_pid": "pid"})
    events.write_parquet(cdir / "events.parquet")
    reopened = tracekit.open(dat)
    assert not reopened.from_cache
    assert "common_pid" in reopened.events.columns and "pid" not in reopened.events.columns
