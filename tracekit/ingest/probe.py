"""The TLBI probe's sample file (probe.bin) as a polars table, one row per timed call.

The format is reproducer/README.md's "Sample file": a 64-byte little-endian header, then
`count` records of (timestamp ns of CLOCK_BOOTTIME, duration ns, direction). A sample is
one whole syscall (mprotect RW->RO, RO->RW, or munmap) with the kernel's TLBI and DSB
ISH inside; the two mprotect directions are different kernel paths and stay apart.
Version 1 files have no direction: their mprotect samples read as "unknown". The probe's
JSON summary only has percentiles; the per-sample file is what histograms, per-phase
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
VERSION = 2
HEADER = struct.Struct("<8sIIIIIIQQIIQ")
# Record size per format version: version 2 added the u32 direction and a u32 pad.
RECORD_SIZES = {1: 16, 2: 24}
RECORD_SIZE = RECORD_SIZES[VERSION]
MODES = {1: "page", 2: "range", 3: "munmap"}
UNKNOWN_DIRECTION = "unknown"
DIRECTIONS = {1: "rw-ro", 2: "ro-rw", 3: "munmap"}
PROBE_SAMPLE_SCHEMA = {
    "run_id": pl.String,
    "phase": pl.String,
    "cpu": pl.Int32,
    "mode": pl.String,
    "direction": pl.String,
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
    version: int = VERSION


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
    if (
        version not in RECORD_SIZES
        or header_size != HEADER.size
        or record_size != RECORD_SIZES[version]
    ):
        raise TracekitError(
            f"{path}: probe file version {version} (header {header_size} B, record"
            f" {record_size} B); this tracekit reads versions"
            f" {', '.join(map(str, RECORD_SIZES))}: upgrade tracekit"
        )
    if mode not in MODES:
        raise TracekitError(f"{path}: unknown probe mode {mode}; upgrade tracekit")
    return ProbeHeader(cpu, MODES[mode], pages, hz, count, clock, helpers, version)


def read_probe_file(path: Path) -> tuple[ProbeHeader, pl.DataFrame]:
    """The header and every sample (timestamp_ns, duration_ns) of one probe.bin."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TracekitError(f"probe reader: {path}: {err}") from None
    header = read_probe_header(data, path)
    size = RECORD_SIZES[header.version]
    body = len(data) - HEADER.size
    if body != header.count * size:
        raise TracekitError(
            f"{path}: header says {header.count} samples but the file holds"
            f" {body / size:g}; the file is truncated or damaged, re-run the probe slot"
        )
    records = np.frombuffer(data, dtype="<u8", offset=HEADER.size).reshape(-1, size // 8)
    frame = pl.DataFrame(
        {
            "timestamp_ns": records[:, 0].astype(np.int64),
            "duration_ns": records[:, 1].astype(np.int64),
            "direction": _directions(header, records, path),
        }
    )
    return header, frame


def _directions(header: ProbeHeader, records: np.ndarray, path: Path) -> pl.Series:
    """Each sample's direction: from the record (version 2) or what version 1 implies."""
    if header.version == 1:
        # A munmap is a munmap; which way a version-1 mprotect went was not written.
        implied = "munmap" if header.mode == "munmap" else UNKNOWN_DIRECTION
        return pl.Series([implied] * len(records), dtype=pl.String)
    codes = (records[:, 2] & 0xFFFFFFFF).astype(np.int64)  # the u32 after the duration
    bad = sorted(set(codes.tolist()) - set(DIRECTIONS))
    if bad:
        raise TracekitError(
            f"{path}: sample direction {bad[0]} is not one this tracekit knows"
            f" ({', '.join(f'{k} {v}' for k, v in DIRECTIONS.items())}); the file is damaged"
            " or newer: upgrade tracekit"
        )
    return pl.Series(codes).replace_strict(DIRECTIONS, return_dtype=pl.String)


def probe_samples(data: BundleData) -> pl.DataFrame:
    """Every probe sample of a bundle, one row per syscall: PROBE_SAMPLE_SCHEMA's columns."""
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
                "direction",
                "timestamp_ns",
                "duration_ns",
            )
        )
    if not frames:
        return pl.DataFrame(schema=PROBE_SAMPLE_SCHEMA)
    return pl.concat(frames)
