"""The load a guest's broadcast TLBIs put on the host (the 2020 RFC in the brief).

The guest-broadcast scenario measures in three phases: before, during (a tlbi-loop guest
issues TLBI VMALLE1IS in a loop on the guest CPU; HCR_EL2.FB makes every one of them
broadcast) and after. The question is the during/before ratio: the rt CPU's wake-up
latency (quiet runs, per-run metrics, the primary declared up front) and the probe's
broadcast-TLBI cost per CPU (one value per probe slot). after/before is the control:
this load should stop with the guest, unlike the main case's lasting effect.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis.compare import Comparison, compare, compare_all, secondary_family
from tracekit.analysis.runs import RUN_METRICS, metric_values, run_metrics
from tracekit.analysis.tlbi import SLOT_GROUP, probe_label

PRIMARY = "p99.9"
BASELINE = "before"
# Probe slot metrics: name -> quantile of the slot's call durations.
PROBE_METRICS = {"p50": 0.5, "p99": 0.99}


def has_during(phases: list[str]) -> bool:
    """True when a bundle measured while a guest ran (the guest-broadcast scenario)."""
    return "during" in phases


def latency_comparisons(
    latencies: pl.DataFrame, phase: str = "during", kind: str = "quiet", primary: str = PRIMARY
) -> list[Comparison]:
    """cyclictest metrics of PHASE's runs against the before runs; `primary` declared."""
    runs = latencies.filter(pl.col("kind") == kind)
    per = {p: run_metrics(runs.filter(pl.col("phase") == p)) for p in (BASELINE, phase)}
    found = [
        compare(
            metric_values(per[BASELINE], metric),
            metric_values(per[phase], metric),
            f"{phase}/{BASELINE} cyclictest {metric}",
            before_runs=per[BASELINE]["run_id"].to_list(),
            after_runs=per[phase]["run_id"].to_list(),
            ratio_label="",  # the name says f"{phase}/{BASELINE}"
        )
        for metric in RUN_METRICS
    ]
    return compare_all(found, f"{phase}/{BASELINE} cyclictest {primary}")


def _slot_values(slots: pl.DataFrame, quantile: float) -> pl.DataFrame:
    """One value per probe slot (a run): run_id, value."""
    return (
        slots.group_by("run_id")
        .agg(pl.col("duration_ns").quantile(quantile, "higher").alias("value"))
        .sort("run_id")
    )


def probe_comparisons(samples: pl.DataFrame, phase: str = "during") -> list[Comparison]:
    """Per CPU, mode and direction, slot p50/p99 of PHASE against before; Holm over all."""
    found = []
    groups = samples.group_by(*SLOT_GROUP, maintain_order=True)
    for (mode, pages, direction, cpu), slots in groups:
        base, test = (slots.filter(pl.col("phase") == p) for p in (BASELINE, phase))
        if base.is_empty() or test.is_empty():
            continue  # a CPU probed in one of the two phases only
        for metric, q in PROBE_METRICS.items():
            b, t = _slot_values(base, q), _slot_values(test, q)
            found.append(
                compare(
                    b["value"].to_list(),
                    t["value"].to_list(),
                    f"{phase}/{BASELINE} probe {probe_label(mode, direction, pages)}"
                    f" issued on cpu{cpu} {metric}",
                    before_runs=b["run_id"].to_list(),
                    after_runs=t["run_id"].to_list(),
                    ratio_label="",
                )
            )
    return secondary_family(found) if found else []


def probe_by_phase(samples: pl.DataFrame) -> pl.DataFrame:
    """Per CPU, mode, pages, direction and phase (before, during, after): p50, p99 in us."""
    order = {"before": 0, "during": 1, "after": 2}
    d = pl.col("duration_ns")
    return (
        samples.group_by("cpu", "mode", "pages", "direction", "phase")
        .agg(
            pl.col("run_id").n_unique().alias("slots"),
            (d.quantile(0.5, "higher") / 1000).round(1).alias("p50_us"),
            (d.quantile(0.99, "higher") / 1000).round(1).alias("p99_us"),
        )
        .sort(
            "cpu",
            "mode",
            "pages",
            "direction",
            pl.col("phase").replace_strict(order, default=9, return_dtype=pl.Int8),
        )
    )


def unprobed_guest_cpus(
    samples: pl.DataFrame, guest_cpus: list[int], phase: str = "during"
) -> list[int]:
    """The guest CPUs without a probe slot in PHASE (collect leaves them out while they
    run the background guest; before and after it probes them)."""
    probed = set(samples.filter(pl.col("phase") == phase)["cpu"].to_list())
    return sorted(cpu for cpu in set(guest_cpus) if cpu not in probed)
