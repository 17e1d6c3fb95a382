"""What a simulated cost should add, counted from the ground truth: pure functions.

The plugin (tksim.c) delays a CPU at the first DSB ISH/OSH/SY after a broadcast TLBI
(...IS/OS) on that CPU. The same rule over the ground-truth table counts those
completions, so a probe's expected per-call increase is the model's cost times the
completions per call the ground truth saw on the probe's CPU.

That is the model's intent for the probe's own calls. Under multi-threaded TCG a call
also waits for the other vCPUs' delays: each broadcast TLBI's flush runs in an
exclusive section, which cannot start while another vCPU busy-waits in the plugin. The
ground truth shows that wait as a longer TLBI -> DSB span on the probe's CPU (the log
keeps each DSB's start, before its own delay), so `probe_account` splits a probe's
increase into the intent, the time held up inside its own invalidations, and the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.simulate.simlog import SimEvent

BROADCAST = ("inner", "outer")
OPEN = 2**63 - 1  # a paying window still open when QEMU exited


def completion_spans(rows: pl.DataFrame, cpu: int, clock: str = "ts_host") -> pl.DataFrame:
    """Each DSB (not NSH) on `cpu` that completes a broadcast TLBI: its time (ts, on
    `clock`; ts_host too where the rows have it) and the span from the first broadcast
    TLBI it completes to it (span_ns)."""
    tlbi = pl.col("kind").is_in(["tlbi", "tlbi-nxs"]) & pl.col("shareability").is_in(BROADCAST)
    dsb = pl.col("kind").is_in(["dsb", "dsb-nxs"]) & (pl.col("shareability") != "non-shareable")
    mine = rows.filter((pl.col("cpu") == cpu) & (tlbi | dsb)).sort(clock)
    is_tlbi = mine.select(tlbi.alias("t"))["t"]
    after_tlbi = is_tlbi.shift(1, fill_value=False)
    host = [pl.col("ts_host").cast(pl.Int64)] if "ts_host" in rows.columns else []
    # A DSB right after a TLBI (of those rows) completes the run of TLBIs before it.
    return (
        mine.with_columns(first=is_tlbi & ~after_tlbi, done=~is_tlbi & after_tlbi)
        .with_columns(start=pl.when("first").then(pl.col(clock)).forward_fill())
        .filter("done")
        .select(
            pl.col(clock).cast(pl.Int64).alias("ts"),
            (pl.col(clock) - pl.col("start")).cast(pl.Int64).alias("span_ns"),
            *(host if clock != "ts_host" else []),
        )
    )


def broadcast_completions(rows: pl.DataFrame, cpu: int) -> int:
    """DSBs (not NSH) on `cpu` that complete at least one broadcast TLBI before them."""
    return completion_spans(rows, cpu).height


def expected_increase_ns(cost_ns: int, completions: int, calls: int) -> float:
    """The per-call increase a cost on each completion predicts (0 without calls)."""
    return cost_ns * completions / calls if calls else 0.0


def per_call(
    samples: pl.DataFrame,
    rows: pl.DataFrame,
    cpu: int,
    paying: list[tuple[int, int]] | None = None,
) -> pl.DataFrame:
    """The probe's calls (timestamp_ns, duration_ns: one slot's samples, trace clock) with
    the completions its CPU executed inside each that paid (inside `paying`, the CPU's
    paying windows on the rows' ts_host; None: all) and the TLBI -> DSB spans of all of
    them (held_ns)."""
    spans = completion_spans(rows, cpu, clock="ts")
    starts = samples["timestamp_ns"].to_numpy()
    ends = starts + samples["duration_ns"].to_numpy()
    order = np.argsort(starts)
    at = np.searchsorted(starts[order], spans["ts"].to_numpy(), side="right") - 1
    call = order[np.clip(at, 0, None)]
    inside = (at >= 0) & (spans["ts"].to_numpy() <= ends[call])
    paid = inside if paying is None else inside & _within(spans["ts_host"], paying)
    completions = np.bincount(call[paid], minlength=len(starts))
    held = np.bincount(
        call[inside], weights=spans["span_ns"].to_numpy()[inside], minlength=len(starts)
    )
    return samples.with_columns(
        completions=pl.Series(completions, dtype=pl.Int64),
        held_ns=pl.Series(held.astype(np.int64), dtype=pl.Int64),
    )


def _within(times: pl.Series, windows: list[tuple[int, int]]) -> np.ndarray:
    """Which of `times` fall in any [start, end) window."""
    found = np.zeros(len(times), dtype=bool)
    for lo, hi in windows:
        found |= times.is_between(lo, hi, closed="left").to_numpy()
    return found


@dataclass(frozen=True)
class ProbeAccount:
    """A probe slot's per-call increase (medians, after - before) and where it went."""

    calls: int  # in the after slot
    completions: float  # per call, on the probe's CPU, in the after slot
    intended_ns: float  # the model's cost x completions per call
    observed_ns: float  # p50 duration, after - before
    held_ns: float  # p50 TLBI -> DSB time inside a call, after - before
    rest_ns: float  # observed - intended - held: what neither accounts for
    floor_ns: float  # the fastest call, after - before: the least disturbed one

    def line(self) -> str:
        """One line for a test's message or a note."""
        return (
            f"{self.calls} calls, {self.completions:.2f} paying completions each: observed"
            f" {self.observed_ns / 1e6:+.2f} ms per call (p50) = model's intent"
            f" {self.intended_ns / 1e6:.2f} {self.held_ns / 1e6:+.2f} held up inside its"
            f" own invalidations {self.rest_ns / 1e6:+.2f} rest; fastest call"
            f" {self.floor_ns / 1e6:+.2f} ms"
        )


def probe_account(before: pl.DataFrame, after: pl.DataFrame, cost_ns: int) -> ProbeAccount:
    """Split the increase between two `per_call` frames (the before slot pays nothing)."""
    completions = float(after["completions"].mean() or 0.0)
    observed = _median(after["duration_ns"]) - _median(before["duration_ns"])
    held = _median(after["held_ns"]) - _median(before["held_ns"])
    return ProbeAccount(
        calls=after.height,
        completions=completions,
        intended_ns=cost_ns * completions,
        observed_ns=observed,
        held_ns=held,
        rest_ns=observed - cost_ns * completions - held,
        floor_ns=float(after["duration_ns"].min() or 0) - float(before["duration_ns"].min() or 0),
    )


def _median(values: pl.Series) -> float:
    """The median of a non-empty series, as a float."""
    return float(values.median() or 0.0)


def paying_windows(
    events: list[SimEvent], vcpus: int, scope_every: bool
) -> dict[int, list[tuple[int, int]]]:
    """Per vCPU, the [start, end) times (the log's clock) its broadcasts cost something: while
    it holds the state (`where = "holder"`) or while any CPU does (`every`); an end of
    2**63 - 1 is still open when QEMU exited."""
    dose = [0] * vcpus
    start: list[int | None] = [None] * vcpus
    windows: dict[int, list[tuple[int, int]]] = {v: [] for v in range(vcpus)}
    for event in sorted(events, key=lambda e: e.ts_ns):
        if event.kind == "create":
            dose[event.vcpu] = event.value
        elif event.kind == "clear-local" or (event.kind == "cpu-on" and event.value):
            dose[event.vcpu] = 0
        elif event.kind == "clear-all":
            dose = [0] * vcpus
        for v in range(vcpus):
            pays = (sum(dose) if scope_every else dose[v]) > 0
            if pays and start[v] is None:
                start[v] = event.ts_ns
            elif not pays and start[v] is not None:
                windows[v].append((start[v], event.ts_ns))
                start[v] = None
    for v in range(vcpus):
        if start[v] is not None:
            windows[v].append((start[v], OPEN))
    return windows


def charged_completions(
    records: pl.DataFrame, windows: dict[int, list[tuple[int, int]]]
) -> dict[int, int]:
    """Per vCPU, the completions the ground-truth log (ts_host, vcpu, kind, shareability)
    holds inside its paying windows: what the plugin should have delayed it for."""
    counted = {}
    for vcpu, spans in windows.items():
        done = completion_spans(records.rename({"vcpu": "cpu"}, strict=False), vcpu)["ts"]
        counted[vcpu] = int(_within(done, spans).sum())
    return counted
