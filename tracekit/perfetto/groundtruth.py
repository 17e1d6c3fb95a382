"""The emulated ground truth on the timeline: per CPU, the EL2 (hyp text), KVM and
broadcast invalidations QEMU's plugin saw executed, as instant events beside the ftrace
data. What is drawn is chosen by tracekit.analysis.groundtruth.drawn."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.analysis import groundtruth as gta
from tracekit.analysis.gtsignatures import packaged_signatures
from tracekit.bundle import RunRecord
from tracekit.ingest.bundle import BundleData
from tracekit.perfetto.tracks import TrackWriter

GROUP = "ground truth (QEMU TCG plugin: emulated, not hardware)"
DESCRIPTION = (
    "What the emulated CPUs executed (QEMU TCG plugin), not hardware: EL2 (nVHE hyp text), "
    "KVM's and broadcast TLBI / IC IALLU(IS). where is the code's text, not the EL."
)
ARGS = ("function", "where", "regime", "reach", "run_id")


def write_ground_truth(
    tracks: TrackWriter,
    top: int,
    data: BundleData,
    selected: Sequence[RunRecord],
    window: tuple[int | None, int | None],
) -> int:
    """Instant events per CPU for the selected runs' drawn invalidations; how many."""
    found = data.ground_truth()
    if found is None:
        return 0
    _, given = found
    rows = given.filter(pl.col("run_id").is_in([r.run_id for r in selected]))
    shown = gta.drawn(gta.by_instruction(rows), packaged_signatures().host_functions)
    start, end = window
    if start is not None:
        shown = shown.filter(pl.col("ts") >= start)
    if end is not None:
        shown = shown.filter(pl.col("ts") <= end)
    if shown.is_empty():
        return 0
    group = tracks.track("groundtruth", GROUP, top, description=DESCRIPTION)
    for row in shown.iter_rows(named=True):
        cpu = tracks.track(f"groundtruth-cpu{row['cpu']}", f"CPU {row['cpu']} invalidations", group)
        args = {key: row[key] for key in ARGS if row[key] is not None}
        tracks.instant(cpu, int(row["ts"]), str(row["operation"]), args)
    return shown.height
