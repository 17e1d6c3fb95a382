"""The plain-text summary `tracekit ingest` prints: counts, span, losses, skipped data."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracekit.bundle import EMULATED_LINE

if TYPE_CHECKING:
    from tracekit.ingest.trace import Trace


# Said first about a bundle whose collection did not finish (manifest.complete false).
INCOMPLETE_LINE = "INCOMPLETE BUNDLE: the collection was interrupted; runs may be missing"


def _is_bundle(trace: Trace) -> bool:
    """A whole collect bundle (ingest/bundletrace.py): runs' traces and tool tables."""
    return trace.meta.get("reader") == "bundle"


def _is_tool_output(trace: Trace) -> bool:
    """A tool's output (cyclictest, stress-ng, perf stat): tool tables and no events."""
    return bool(trace.tools) and not _is_bundle(trace)


def _header(trace: Trace) -> list[str]:
    """What was read and how."""
    m = trace.meta
    cpus = m.get("cpus") or []
    where = f"instance {m['instance']!r}, " if m.get("instance") else ""
    cached = " (from cache)" if trace.from_cache else ""
    if _is_tool_output(trace):
        return [f"{m.get('reader')} output: {trace.path}{cached}"]
    if _is_bundle(trace):
        emulated = [EMULATED_LINE] if m.get("emulated") else []
        incomplete = [] if m.get("complete") else [INCOMPLETE_LINE]
        return [
            *emulated,
            *incomplete,
            f"bundle: {trace.path}{cached}",
            f"format: bundle of {len(m['runs'])} run trace(s), clock {m.get('clock') or '?'}, "
            f"{len(cpus)} CPU(s) with data",
        ]
    lines = [
        f"trace: {trace.path}{cached}",
        f"format: {m.get('reader', '?')}, {where}clock {m.get('clock') or '?'}, "
        f"{len(cpus)} CPU(s) with data",
    ]
    if "symbols" in m:  # binary readers: where the `_sym` columns' names came from
        lines.append(f"symbols: {m['symbols'] or 'none (no kallsyms copy; give --symbols)'}")
    return lines


def _span(events: pl.DataFrame) -> list[str]:
    """Event count and time span."""
    if events.is_empty():
        return ["events: 0"]
    untimed = events["ts"].null_count()
    if untimed == events.height:  # e.g. function_graph text without funcgraph-abstime
        return [f"events: {events.height}, without timestamps (the text prints none)"]
    if untimed:
        timed = _span(events.filter(pl.col("ts").is_not_null()))
        return [*timed, f"events without a timestamp: {untimed}"]
    first, last = int(events["ts"].min()), int(events["ts"].max())  # type: ignore[arg-type]
    return [
        f"events: {events.height} from {first / 1e9:.6f} s to {last / 1e9:.6f} s "
        f"(span {(last - first) / 1e9:.6f} s)"
    ]


def _per_type(events: pl.DataFrame) -> list[str]:
    """A table of event counts per type (rows) and CPU (columns)."""
    if events.is_empty():
        return []
    # `perf script` without -a prints no CPU: those counts go in a `cpu?` column
    counts = events.group_by(pl.col("event").cast(pl.String), "cpu").len()
    counts = counts.with_columns(pl.col("cpu").cast(pl.String).fill_null("?"))
    cpus = sorted(counts["cpu"].unique().to_list(), key=lambda c: (c == "?", len(c), c))
    wide = counts.pivot(on="cpu", index="event", values="len", sort_columns=True).fill_null(0)
    wide = wide.with_columns(total=pl.sum_horizontal(pl.exclude("event"))).sort("event")
    width = max(5, *(len(e) for e in wide["event"]))
    head = f"  {'event':<{width}}" + "".join(f" {'cpu' + str(c):>8}" for c in cpus)
    lines = ["per type and CPU:", head + f" {'total':>9}"]
    for row in wide.iter_rows(named=True):
        cells = "".join(f" {row[str(c)]:>8}" for c in cpus)
        lines.append(f"  {row['event']:<{width}}{cells} {row['total']:>9}")
    return lines


# What each kind of reader can see of lost events, said when none was reported.
CHECKED = {
    "ftrace text": "`[LOST n EVENTS]` / `EVENTS DROPPED` lines checked",
    "function_graph text": "`[LOST n EVENTS]` lines checked",
    "perf script": "perf reports lost samples on stderr, not in this text",
}


def _lost(lost: pl.DataFrame, reader: str) -> list[str]:
    """Every lost-events report, grouped by CPU and source (never summed across sources)."""
    if lost.is_empty():
        checked = CHECKED.get(
            reader, "page flags, empty pages and per-CPU stats, read events included, checked"
        )
        return [f"lost events: none reported ({checked})"]
    lines = ["lost events (each source counts the same losses its own way; do not add them):"]
    grouped = (
        lost.group_by("cpu", "source")
        .agg(reports=pl.len(), count=pl.col("count").sum(), unknown=pl.col("count").null_count())
        .sort("cpu", "source")
    )
    for r in grouped.iter_rows(named=True):
        known = f"{r['count']} events" if r["count"] else "count unknown"
        extra = (
            f" (+{r['unknown']} report(s) without a count)" if r["unknown"] and r["count"] else ""
        )
        lines.append(f"  cpu{r['cpu']} {r['source']}: {known} in {r['reports']} report(s){extra}")
    return lines


def _runs(trace: Trace) -> list[str]:
    """A bundle's runs in order: phase, kind, events, span and losses of each."""
    runs = trace.meta.get("runs")
    if not runs:
        return ["runs with a trace: none (the bundle's tool results are below)"]
    stats = {
        r["run_id"]: r
        for r in trace.events.group_by(pl.col("run_id").cast(pl.String))
        .agg(n=pl.len(), first=pl.col("ts").min(), last=pl.col("ts").max())
        .iter_rows(named=True)
    }
    lost = {
        r["run_id"]: r["reports"]
        for r in trace.lost.group_by(pl.col("run_id").cast(pl.String))
        .agg(reports=pl.len())
        .iter_rows(named=True)
    }
    width = max(len(r["run_id"]) for r in runs)
    lines = [f"runs ({len(runs)}, phases {', '.join(trace.meta.get('phases') or [])}):"]
    for r in runs:
        s = stats.get(r["run_id"])
        span = f"{(s['last'] - s['first']) / 1e9:9.3f} s" if s else f"{'-':>11}"
        losses = f"{lost[r['run_id']]} loss report(s)" if r["run_id"] in lost else "no losses"
        status = "" if r.get("status", "ok") == "ok" else f"  (run {r['status']})"
        lines.append(
            f"  {r['run_id']:<{width}}  {r['phase']:<8} {r['kind']:<12}"
            f"{s['n'] if s else 0:>10} events {span}  {losses}{status}"
        )
    return lines


def summarise(trace: Trace) -> str:
    """The whole summary as one string."""
    if _is_tool_output(trace):
        lines = _header(trace)
    else:
        lines = _header(trace) + _span(trace.events) + _per_type(trace.events)
        lines += _lost(trace.lost, str(trace.meta.get("reader", "")))
    if _is_bundle(trace):
        lines += _runs(trace)
    unknown = trace.events.filter(pl.col("event").cast(pl.String).str.starts_with("unknown_id_"))
    if unknown.height:
        lines.append(f"events without a format file (kept as unknown_id_N): {unknown.height}")
    for name, table in trace.tools.items():
        lines.append(f"{name}: {table.height} row(s)")
        if table.height <= 12:
            with pl.Config(tbl_rows=12, tbl_cols=12, tbl_hide_dataframe_shape=True):
                lines.append(str(table))
    for note in trace.meta.get("skipped") or []:
        lines.append(f"skipped (salvage): {note}")
    return "\n".join(lines)
