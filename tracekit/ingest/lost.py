"""Lost trace events per CPU: the one definition every section and the export use.

A run's losses are said twice over: the manifest's per-CPU count (the instance's
overrun + dropped events when the run ended) and the trace's own loss reports (its
sources: the capture's stats, pages with missed events, LOST markers). The sources
overlap (a page's missed events are also in the stats), so they are never added: per
CPU the loss is the largest count any one of them reports.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl


def lost_per_cpu(lost: pl.DataFrame | None, recorded: Mapping[str, int]) -> dict[int, int]:
    """CPU -> events lost, the largest of the manifest's count and each trace source's sum."""
    per: dict[int, int] = {int(cpu): int(n) for cpu, n in recorded.items() if str(cpu).isdigit()}
    if lost is not None and lost.height:
        by_source = (
            lost.filter(pl.col("cpu").is_not_null())
            .group_by("cpu", "source")
            .agg(pl.col("count").fill_null(0).sum())
            .group_by("cpu")
            .agg(pl.col("count").max())
        )
        for cpu, n in by_source.iter_rows():
            per[int(cpu)] = max(per.get(int(cpu), 0), int(n))
    return dict(sorted(per.items()))
