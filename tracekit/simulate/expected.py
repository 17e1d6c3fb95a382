"""What a simulated cost should add, counted from the ground truth: pure functions.

The plugin (tksim.c) delays a CPU at the first DSB ISH/OSH/SY after a broadcast TLBI
(...IS/OS) on that CPU. The same rule over the ground-truth table counts those
completions, so a probe's expected per-call increase is the model's cost times the
completions per call the ground truth saw on the probe's CPU.
"""

from __future__ import annotations

import polars as pl

BROADCAST = ("inner", "outer")


def broadcast_completions(rows: pl.DataFrame, cpu: int) -> int:
    """DSBs (not NSH) on `cpu` that complete at least one broadcast TLBI before them."""
    mine = rows.filter(pl.col("cpu") == cpu).sort("ts_host")
    pending, count = False, 0
    for kind, share in mine.select("kind", "shareability").iter_rows():
        if kind in ("tlbi", "tlbi-nxs") and share in BROADCAST:
            pending = True
        elif kind in ("dsb", "dsb-nxs") and share != "non-shareable" and pending:
            count, pending = count + 1, False
    return count


def expected_increase_ns(cost_ns: int, completions: int, calls: int) -> float:
    """The per-call increase a cost on each completion predicts (0 without calls)."""
    return cost_ns * completions / calls if calls else 0.0
