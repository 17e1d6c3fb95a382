"""Lost trace events per CPU: the one definition every section and the export use.

A run's losses are said several times over: the manifest's per-CPU count (the
instance's overrun + dropped events when the run ended) and the trace's own loss
reports. Some report the same loss and are never added: a page's missed events are
part of the ring buffer's overrun count, and a text trace's LOST line is that page flag.
Others are losses of their own and add up: dropped events (non-overwrite mode), commit
overruns (nested writes past a page), events read out but missing from the capture
(stats_read) or left in the buffer (stats_unread; the larger of these two is taken, as
they may overlap). A loss whose count is unknown (a missed page without a stored count)
adds 0 here; the lost table keeps the report.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

# Sources that count their own losses, added to the overrun; the rest count overrun.
ADDED = ("stats_dropped", "stats_commit_overrun")
LEFT_BEHIND = ("stats_read", "stats_unread")  # may overlap each other: the larger


def lost_per_cpu(lost: pl.DataFrame | None, recorded: Mapping[str, int]) -> dict[int, int]:
    """CPU -> events lost: the overrun (largest of its reports) plus the losses of their own;
    never below the manifest's count."""
    per: dict[int, int] = {}
    if lost is not None and lost.height:
        sums = (
            lost.filter(pl.col("cpu").is_not_null())
            .group_by("cpu", "source")
            .agg(pl.col("count").fill_null(0).sum())
        )
        by_cpu: dict[int, dict[str, int]] = {}
        for cpu, source, n in sums.iter_rows():
            by_cpu.setdefault(int(cpu), {})[str(source)] = int(n)
        for cpu, sources in by_cpu.items():
            overrun = max((n for s, n in sources.items() if s not in (*ADDED, *LEFT_BEHIND)),
                          default=0)  # fmt: skip
            added = sum(sources.get(s, 0) for s in ADDED)
            behind = max((sources.get(s, 0) for s in LEFT_BEHIND), default=0)
            per[cpu] = overrun + added + behind
    for cpu, n in recorded.items():
        if str(cpu).isdigit():
            per[int(cpu)] = max(per.get(int(cpu), 0), int(n))
    return dict(sorted(per.items()))
