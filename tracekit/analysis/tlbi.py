"""Broadcast-TLBI cost per CPU and phase: the probe's samples and the flush paths' durations.

Two views of the same question, "did invalidations get slower after the guest?":
- the probe (reproducer/tlbiprobe) times whole mprotect/munmap syscalls, with the
  kernel's broadcast TLBI and DSB ISH inside, from one CPU per slot; its per-sample file
  gives distributions per CPU, phase and direction (RW->RO and RO->RW are different
  kernel paths, never pooled), and each slot is one run for the before/after comparison.
  A DSB ISH waits for every CPU, so a probe CPU is where the syscall was issued, never
  the CPU that was slow to respond: nothing here says which CPU holds any state;
- when the trace has entry/return probes (kprobe group `tracekit`: `X` + `X_ret`, or
  `p_X` + `r_X`) or function_graph exits, the host's own flush paths get durations.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis.calls import pair_calls, returns_missed, unclosed_note
from tracekit.analysis.compare import Comparison, Thresholds, compare, secondary_family
from tracekit.analysis.requires import require_events
from tracekit.bundle import PROBE_GROUP
from tracekit.errors import TracekitError
from tracekit.ingest.probe import UNKNOWN_DIRECTION

PHASE_ORDER = {"before": 0, "guest": 1, "after": 2}
# What one group of probe slots shares: never pooled across any of these (page counts on
# either side of the by-VA limit take different kernel paths).
SLOT_GROUP = ("mode", "pages", "direction", "cpu")
# Probe metrics compared before/after: the typical call and the tail.
PROBE_METRICS = {"p50": 0.5, "p99": 0.99}
DURATION_SCHEMA = {
    "function": pl.String,
    "cpu": pl.Int32,
    "pid": pl.Int32,
    "start_ns": pl.Int64,
    "duration_ns": pl.Int64,
}
FUNCGRAPH_EXIT = "funcgraph_exit"
FLUSH_EVENTS_HOW = {
    "tracekit/<fn> + tracekit/<fn>_ret": (
        "entry and return kprobes, e.g. `collect --kprobe 'r:tracekit/kvm_free_stage2_pgd_ret"
        " kvm_free_stage2_pgd'` beside the default entry probe"
    ),
    FUNCGRAPH_EXIT: "the function_graph tracer with set_graph_function on the flush paths",
}


def _phase_rank() -> pl.Expr:
    """Phases in protocol order (before, guest, after), others last."""
    return pl.col("phase").replace_strict(PHASE_ORDER, default=9, return_dtype=pl.Int8)


def _check_samples(samples: pl.DataFrame) -> None:
    """Refuse a frame that is not probe samples, naming the missing columns."""
    needed = {"run_id", "phase", "cpu", "mode", "pages", "direction", "duration_ns"}
    missing = needed - set(samples.columns)
    if missing:
        raise TracekitError(
            f"TLBI probe analysis: no column {', '.join(sorted(missing))}; give the frame"
            " tracekit.ingest.probe.probe_samples() returns"
        )


# What one probe sample is (reproducer/tlbiprobe.c), said wherever its numbers are shown;
# {cpu} names where the sample's CPU is ("the cpu column", "CPU 3").
SAMPLE_MEANING = (
    "one whole mprotect/munmap syscall with the kernel's TLBI and DSB ISH inside; the DSB"
    " waits for every CPU, so {cpu} is the issuer, never the slow responder"
)


def probe_label(mode: str, direction: str, pages: int = 1) -> str:
    """How a slot group is named: "page rw-ro", "munmap 511 pages", "page, both pooled"."""
    # Page mode is one page; the others' counts decide the kernel's path (by-VA or ASID).
    what = mode if mode == "page" else f"{mode} {pages} page{'s' * (pages != 1)}"
    if direction == UNKNOWN_DIRECTION:
        # Version-1 files did not record which way each mprotect went.
        return f"{what}, RW->RO and RO->RW pooled"
    return what if direction == mode else f"{what} {direction}"


def probe_percentiles(
    samples: pl.DataFrame, since_guest_ns: dict[str, int | None] | None = None
) -> pl.DataFrame:
    """Per mode, pages, direction, CPU and phase: slots, samples, p50/p99/p99.9/max in us,
    and since_guest_s: how long after the guest ended the group's first slot started.

    `since_guest_ns` maps a slot's run_id to its RunRecord.since_guest_ns (None: the slot
    ran before any guest ended, or its bundle did not record it); without it, null.
    """
    _check_samples(samples)
    d = pl.col("duration_ns")
    since = pl.col("run_id").replace_strict(
        since_guest_ns or {}, default=None, return_dtype=pl.Int64
    )
    return (
        samples.with_columns(since.alias("_since"))
        .group_by(*SLOT_GROUP, "phase")
        .agg(
            pl.col("run_id").n_unique().alias("slots"),
            pl.len().alias("samples"),
            *(
                (d.quantile(q, "higher") / 1000).round(1).alias(name)
                for q, name in ((0.5, "p50_us"), (0.99, "p99_us"), (0.999, "p99_9_us"))
            ),
            (d.max() / 1000).round(1).alias("max_us"),
            (pl.col("_since").min() / 1e9).round(1).alias("since_guest_s"),
        )
        .sort(*SLOT_GROUP, _phase_rank())
    )


def probe_histogram(samples: pl.DataFrame) -> pl.DataFrame:
    """Long format for a histogram plot: mode, pages, direction, cpu, phase, duration_us."""
    _check_samples(samples)
    return samples.select(
        *SLOT_GROUP, "phase", (pl.col("duration_ns") / 1000).alias("duration_us")
    ).sort(*SLOT_GROUP, _phase_rank())


def probe_comparisons(
    samples: pl.DataFrame, thresholds: Thresholds | None = None
) -> list[Comparison]:
    """Per mode, pages, direction and CPU, each slot's p50 and p99 after vs before; Holm.

    A slot is one run: one slot per phase gives an "inconclusive" that says how many
    slots a verdict needs, never a verdict drawn from the samples of a single run.
    """
    _check_samples(samples)
    options = {} if thresholds is None else {"thresholds": thresholds}
    comparisons = []
    groups = samples.group_by(*SLOT_GROUP, maintain_order=True)
    for (mode, pages, direction, cpu), slots in groups:
        phases = {p: slots.filter(pl.col("phase") == p) for p in ("before", "after")}
        if min(f.height for f in phases.values()) == 0:
            continue  # a CPU probed in one phase only has nothing to compare
        for metric, q in PROBE_METRICS.items():
            before, after = (_slot_values(phases[p], q) for p in ("before", "after"))
            comparisons.append(
                compare(
                    before["value"].to_list(),
                    after["value"].to_list(),
                    f"probe {probe_label(mode, direction, pages)} issued on cpu{cpu} {metric}",
                    before_runs=before["run_id"].to_list(),
                    after_runs=after["run_id"].to_list(),
                    **options,
                )
            )
    return secondary_family(comparisons)


def _slot_values(slots: pl.DataFrame, quantile: float) -> pl.DataFrame:
    """One value per slot (run): run_id, value = that quantile of its call durations."""
    return (
        slots.group_by("run_id")
        .agg(pl.col("duration_ns").quantile(quantile, "higher").alias("value"))
        .sort("run_id")
    )


def _entry_return_names(events: list[str]) -> dict[str, tuple[str, str]]:
    """function -> (entry event, return event) for the probe pairs the trace has."""
    have = set(events)
    pairs = {}
    for name in have:
        if name.endswith("_ret") and name[: -len("_ret")] in have:
            pairs[name[: -len("_ret")]] = (name[: -len("_ret")], name)
        elif name.startswith("r_") and "p_" + name[2:] in have:
            pairs[name[2:]] = ("p_" + name[2:], name)
    return pairs


def probe_pair_durations(
    events: pl.DataFrame, probe_misses: dict[str, int] | None = None
) -> tuple[pl.DataFrame, int, list[str]]:
    """Entry/return kprobe pairs as (function, cpu, pid, start_ns, duration_ns), how many
    events are unpaired, and what each function's unclosed calls may be.

    Pairs are matched per task as a call stack (tracekit.analysis.calls), not per CPU: a
    call that migrated keeps its duration. An entry without a return (the trace ended
    inside it, a lost event, or a return its kretprobe missed: `probe_misses`, the run's
    RunRecord.probe_misses) or a return without an entry is not guessed at; the count of
    them is returned, and per function a note saying which of those they can be.
    """
    # Text traces do not name the system (null): their pairs are found by name alone.
    system = pl.col("system").cast(pl.String)
    ours = events.filter((system == PROBE_GROUP) | system.is_null()).with_columns(
        pl.col("event").cast(pl.String)
    )
    pairs = _entry_return_names(sorted(ours["event"].unique().to_list()))
    if not pairs:
        return pl.DataFrame(schema=DURATION_SCHEMA), 0, []
    frames, unpaired, notes = [], 0, []
    for function, (entry, ret) in sorted(pairs.items()):
        missed = returns_missed(probe_misses, function)
        calls, orphans = pair_calls(
            ours.filter(pl.col("event") == entry),
            ours.filter(pl.col("event") == ret),
            missed,
        )
        done = calls.filter(pl.col("end_ts").is_not_null())
        unpaired += orphans + calls.height - done.height
        note = unclosed_note(calls, missed)
        notes += [f"{function}: {note}"] if note else []
        frames.append(
            done.select(
                pl.lit(function).alias("function"),
                "cpu",
                "pid",
                pl.col("start_ts").alias("start_ns"),
                pl.col("dur_ns").alias("duration_ns"),
            )
        )
    return pl.concat(frames).cast(DURATION_SCHEMA), unpaired, notes  # type: ignore[arg-type]


def flush_missed(
    functions: list[str], phase: str, probe_misses: dict[str, int] | None
) -> pl.DataFrame:
    """function, phase, missed_returns: each function's kretprobe misses in one run (null:
    the run did not record them); each is a call the durations cannot include. Functions
    timed in the run and those whose kretprobe the run's misses list are both given, so a
    run that timed no call of a function still adds its misses to the phase's count."""
    prefix, suffix = f"{PROBE_GROUP}/", "_ret"
    listed = [
        key.removeprefix(prefix).removesuffix(suffix)
        for key in probe_misses or {}
        if key.startswith(prefix) and key.endswith(suffix)
    ]
    every = sorted({*functions, *listed})
    return pl.DataFrame(
        {
            "function": every,
            "phase": [phase] * len(every),
            "missed_returns": [returns_missed(probe_misses, f) for f in every],
        },
        schema={"function": pl.String, "phase": pl.String, "missed_returns": pl.Int64},
    )


def funcgraph_durations(exits: pl.DataFrame) -> pl.DataFrame:
    """Durations of the graph's top functions (depth 0: the set_graph_function targets).

    Named by `func_sym` when the trace had kallsyms, else by address; callees at depth > 0
    are left out (their time is inside their caller's).
    """
    if "depth" in exits.columns:
        exits = exits.filter(pl.col("depth") == 0)
    hex_name = pl.format(
        "0x{}",
        pl.col("func").cast(pl.UInt64).map_elements(lambda a: f"{a:x}", return_dtype=pl.String),
    )
    named = pl.col("func_sym").cast(pl.String)  # Categorical in the tables
    name = named.fill_null(hex_name) if "func_sym" in exits.columns else hex_name
    return exits.select(
        name.alias("function"),
        pl.col("cpu").cast(pl.Int32),
        pl.col("common_pid").cast(pl.Int32).alias("pid"),
        pl.col("calltime").cast(pl.Int64).alias("start_ns"),
        (pl.col("rettime").cast(pl.Int64) - pl.col("calltime").cast(pl.Int64)).alias("duration_ns"),
    )


def require_flush_events(event_names: list[str]) -> None:
    """Fail naming the events flush-path durations need when the trace has neither kind."""
    if FUNCGRAPH_EXIT in event_names or _entry_return_names(event_names):
        return
    require_events("flush-path durations", event_names, FLUSH_EVENTS_HOW)


def flush_summary(durations: pl.DataFrame, missed: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per function, phase and CPU: calls, median, max and total time in us, and the
    function's missed returns in the phase's runs (`flush_missed` rows; any CPU: a missed
    return's call is in no CPU's row; null: some run did not record them)."""
    d = pl.col("duration_ns")
    summary = (
        durations.group_by("function", "phase", "cpu")
        .agg(
            pl.len().alias("calls"),
            (d.median() / 1000).round(1).alias("p50_us"),
            (d.max() / 1000).round(1).alias("max_us"),
            (d.sum() / 1000).round(1).alias("total_us"),
        )
        .sort("function", _phase_rank(), "cpu")
    )
    if missed is None:
        return summary.with_columns(pl.lit(None, pl.Int64).alias("missed_returns"))
    count = pl.col("missed_returns")
    # Unknown in one run makes the phase's total unknown, never a low count.
    per_phase = missed.group_by("function", "phase").agg(
        pl.when(count.is_null().any()).then(None).otherwise(count.sum()).alias("missed_returns")
    )
    return summary.join(per_phase, on=["function", "phase"], how="left", maintain_order="left")


def el2_unseen(scenario: dict[str, object]) -> list[str]:
    """What the flush-path probes could not see in the bundle's KVM mode (the manifest's
    scenario.el2_unseen: function -> why), one line each; none recorded: nothing."""
    unseen = scenario.get("el2_unseen")
    if not isinstance(unseen, dict):
        return []
    return [f"{function}: {why}" for function, why in sorted(unseen.items())]
