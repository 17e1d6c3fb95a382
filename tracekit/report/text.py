"""The terminal report of one bundle: host, protocol, numbers with spread, verdicts.

Reads analysis results and the bundle's tables, never raw files. An emulated host is
said in the first lines, since its timings are not hardware timings.
"""

from __future__ import annotations

import textwrap

import polars as pl

from tracekit.analysis.beforeafter import (
    latency_comparisons,
    phase_summary,
    stress_comparison,
)
from tracekit.ingest.bundle import BundleData


def render_text(data: BundleData) -> str:
    """The whole text report for one bundle."""
    lines = _header(data)
    lines += ["", "cyclictest on the rt CPU, mean of per-run values (us):"]
    lines += _table(phase_summary(data.latencies))
    quiet = data.latencies.filter(pl.col("kind") == "quiet")
    if quiet.filter(pl.col("phase") == "after").height and quiet.height:
        comparisons = latency_comparisons(data.latencies)
        comparisons.sort(key=lambda c: c.role != "primary")
        lines += ["", "before -> after, quiet runs (primary: cyclictest p99.9):"]
        lines += [c.describe() for c in comparisons]
        lines.append(stress_comparison(data.stress).describe())
        rule = comparisons[0].thresholds.rule()
        lines += ["", textwrap.fill(f"verdict rule: {rule}", 72, subsequent_indent="  ")]
    if data.probes.height:
        lines += ["", "broadcast-TLBI probe (mprotect per call, ns), one slot per phase:"]
        lines += _table(
            data.probes.select("phase", "cpu", "mode", "count", "p50_ns", "p99_ns", "max_ns")
        )
    lines += ["", _samples_line(data), _lost_line(data)]
    return "\n".join(lines) + "\n"


def _header(data: BundleData) -> list[str]:
    """Host, kernel, KVM mode and completeness; EMULATED first when it is."""
    host = data.manifest.host
    lines = []
    if host.get("emulated"):
        lines.append("EMULATED HOST (QEMU): timings are not hardware timings.")
    cores = sorted({c.get("name", "?") for c in host.get("cpus", [])})
    kvm = host.get("kvm", {}).get("mode", "unknown")
    lines.append(f"bundle: {data.path}")
    lines.append(f"host: {host.get('kernel_release', '?')}, {', '.join(cores)}, KVM {kvm}")
    options = data.manifest.options
    lines.append(
        f"protocol: rt CPU {options.get('rt_cpu')}, stress CPUs {options.get('stress_cpus')},"
        f" guest CPU {options.get('guest_cpus')}; {options.get('runs')} quiet +"
        f" {options.get('traced_runs')} traced runs of {options.get('duration_s')} s per phase"
    )
    if not data.manifest.complete:
        lines.append(f"INCOMPLETE bundle: {data.manifest.incomplete_reason}")
    return lines


def _table(frame: pl.DataFrame) -> list[str]:
    """A frame as aligned ASCII columns."""
    rows = [frame.columns] + [[str(v) for v in row] for row in frame.iter_rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(frame.columns))]
    return ["  " + "  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]


def _samples_line(data: BundleData) -> str:
    """Samples read against the loops cyclictest counted: a shortfall is shown, not hidden."""
    if data.cycles.height == 0:
        return "cyclictest samples: no --json counts to check them against"
    recorded = data.latencies.group_by("run_id").len()
    joined = data.cycles.join(recorded, on="run_id", how="left").fill_null(0)
    short = joined.filter(pl.col("len") < pl.col("cycles"))
    total = int(joined["cycles"].sum())
    if short.height == 0:
        return f"cyclictest samples: all {total} loops it counted were recorded"
    missing = int((short["cycles"] - short["len"]).sum())
    return textwrap.fill(
        f"cyclictest samples: {missing} of {total} loops it counted were not printed by -v "
        f"({short.height} runs); the verdicts use the {total - missing} recorded",
        72,
        subsequent_indent="  ",
    )


def _lost_line(data: BundleData) -> str:
    """Lost trace events per traced run: they would change any trace-derived number."""
    if data.lost.height == 0:
        return "lost events: no traced runs"
    total = int(data.lost["lost"].sum())
    if total == 0:
        return f"lost events: none in {data.lost.height} traced runs"
    runs = ", ".join(f"{r} ({n})" for r, n in data.lost.select("run_id", "lost").iter_rows() if n)
    return f"lost events: {total} in traced runs: {runs}"
