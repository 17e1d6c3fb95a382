"""The TLBI probe's samples (probe.bin) as a counter per probe run and CPU.

Probe runs are not traced: their samples go on tracks of their own, in the run's group,
at the samples' own timestamps (taken just before each timed call, on CLOCK_BOOTTIME,
the trace clock: reproducer/README.md "Sample file"). A file on another clock is placed
from the run's start in the manifest instead, and its track says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracekit.analysis.tlbi import SAMPLE_MEANING, probe_label
from tracekit.perfetto.tracks import TrackWriter

if TYPE_CHECKING:
    import polars as pl

    from tracekit.ingest.probe import ProbeHeader

CLOCK_BOOTTIME = 7


def write_probe_samples(
    tracks: TrackWriter,
    parent: int,
    run_id: str,
    probe: tuple[ProbeHeader, pl.DataFrame],
    start_ns: int | None,
    window: tuple[int | None, int | None],
) -> int:
    """One counter of syscall durations (ns) at each call's start per direction (RW->RO
    and RO->RW are different kernel paths: never one counter); returns samples written."""
    header, samples = probe
    ts = samples["timestamp_ns"].to_numpy()
    description = (
        f"TLBI probe ({header.pages} page(s), {header.helpers} helper thread(s)): each sample"
        f" is {SAMPLE_MEANING.format(cpu=f'CPU {header.cpu}')}; drawn at the call's start"
    )
    if header.clock_id != CLOCK_BOOTTIME and len(ts):
        ts = ts - ts[0] + (start_ns or 0)
        description += (
            f"; APPROXIMATE times: the file's clock {header.clock_id} is not the trace "
            "clock, so the first sample is placed at the run's start"
        )
    keep = (ts >= (window[0] if window[0] is not None else -(2**62))) & (
        ts <= (window[1] if window[1] is not None else 2**62)
    )
    directions = samples["direction"].to_numpy()
    durations = samples["duration_ns"].to_numpy()
    written = 0
    for direction in dict.fromkeys(directions[keep].tolist()):
        label = probe_label(header.mode, direction, header.pages)
        track = tracks.track(
            f"{run_id}/probe-samples:{header.cpu}:{direction}",
            f"TLBI probe on CPU {header.cpu}: {label}: syscall duration ({run_id})",
            parent,
            counter=True,
            description=description,
            unit_ns=True,
        )
        mine = keep & (directions == direction)
        for at, duration in zip(ts[mine], durations[mine], strict=True):
            tracks.counter(track, int(at), float(duration))
        written += int(mine.sum())
    return written
