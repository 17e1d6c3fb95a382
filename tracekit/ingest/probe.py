"""The TLBI probe's sample file (probe.bin) as a polars table, one row per timed call.

The format is reproducer/README.md's "Sample file": a 64-byte little-endian header, then
`count` records of (timestamp ns of CLOCK_BOOTTIME, duration ns). The probe's JSON
summary only has percentiles; the per-sample file is what histograms, per-phase
distributions and time windows need. A short or damaged file is refused, never read in
part, so no sample goes missing silently.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from tracekit.bundle import RunKind
from tracekit.errors import TracekitError

if TYPE_CHECKING:
    from tracekit.ingest.bundle import BundleData

MAGIC = b"TKPROBE\0"
VERSION = 1
HEADER = struct.Struct("<8sIIIIIIQQIIQ")
RECORD_SIZE = 16
MODES = {1: "page", 2: "range", 3: "munmap"}
PROBE_SAMPLE_SCHEMA = {
    "run_id": pl.String,
    "phase": pl.String,
    "cpu": pl.Int32,
    "mode": pl.String,
    "timestamp_ns": pl.Int64,
    "duration_ns": pl.Int64,
}


@dataclass(frozen=True)
class ProbeHeader:
    """What the probe wrote about its own measurement."""

    cpu: int
    mode: str
    pages: int
    counter_hz: int
    count: int
    clock_id: int
    helpers: int


def read_probe_header(data: bytes, path: Path) -> ProbeHeader:
    """Decode and check the 64-byte header."""
    if len(data) < HEADER.size:
        raise TracekitError(
            f"{path}: {len(data)} bytes, shorter than the probe's {HEADER.size}-byte header;"
            " the probe did not finish writing it, re-run the probe slot"
        )
    magic, version, header_size, record_size, cpu, mode, pages, hz, count, clock, helpers, _ = (
        HEADER.unpack_from(data)
    )
    if magic != MAGIC:
        raise TracekitError(f"{path}: not a tlbiprobe sample file (magic {magic!r})")
    if version != VERSION or header_size != HEADER.size or record_size != RECORD_SIZE:
        raise TracekitError(
            f"{path}: probe file version {version} (header {header_size} B, record"
            f" {record_size} B); this tracekit reads version {VERSION}: upgrade tracekit"
        )
    if mode not in MODES:
        raise TracekitError(f"{path}: unknown probe mode {mode}; upgrade tracekit")
    return ProbeHeader(cpu, MODES[mode], pages, hz, count, clock, helpers)


def read_probe_file(path: Path) -> tuple[ProbeHeader, pl.DataFrame]:
    """The header and every sample (timestamp_ns, duration_ns) of one probe.bin."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TracekitError(f"probe reader: {path}: {err}") from None
    header = read_probe_header(data, path)
    body = len(data) - HEADER.size
    if body != header.count * RECORD_SIZE:
        raise TracekitError(
            f"{path}: header says {header.count} samples but the file holds"
            f" {body / RECORD_SIZE:g}; the file is truncated or damaged, re-run the probe slot"
        )
    records = np.frombuffer(data, dtype="<u8", offset=HEADER.size).reshape(-1, 2)
    frame = pl.DataFrame(
        {
            "timestamp_ns": records[:, 0].astype(np.int64),
            "duration_ns": records[:, 1].astype(np.int64),
        }
    )
    return header, frame


def probe_samples(data: BundleData) -> pl.DataFrame:
    """Every probe sample of a bundle: run_id, phase, cpu, mode, timestamp_ns, duration_ns."""
    frames = []
    for run in data.manifest.runs:
        probe = data.run(run).probe if run.kind == RunKind.PROBE else None
        if probe is None:
            continue
        header, samples = probe
        frames.append(
            samples.select(
                pl.lit(run.run_id).alias("run_id"),
                pl.lit(run.phase).alias("phase"),
                pl.lit(header.cpu, pl.Int32).alias("cpu"),
                pl.lit(header.mode).alias("mode"),
                "timestamp_ns",
                "duration_ns",
            )
        )
    if not frames:
        return pl.DataFrame(schema=PROBE_SAMPLE_SCHEMA)
    return pl.concat(frames)
