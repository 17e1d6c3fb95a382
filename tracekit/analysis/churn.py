"""The teardown fix's cost: per-VM time and the rt CPU's latency of a vm-churn, by switch state.

The brief's figures: 500 VMs created, run and torn down one after another took 32.1 ms
each with the fix and 33.4 ms without, and the isolated CPU's latency meanwhile was 15 us
against 13 us. Here each state of reproducer/kpatch's `teardown_flush` (off, alle1is,
last-ran; a kernel without the series is its own state) is one or more vm-churn runs.

- Which churns compare: only churns of one condition (analysis/conditions.py: kernel,
  KVM mode, cores, emulated or not, guest, placement, protocol, ...; the switch state is
  no condition field, and host freshness is set aside: churn_condition). The no-series
  state is accepted only as the patched kernel's own unpatched twin (`is_twin`: the
  patched release is the twin's followed by "-kp"), never a stock kernel; every churn
  left out is one line saying why. A churn that did not end ok (over its budget, failed,
  interrupted) is left out too, with the VMs it did.
- Per-VM time is the VMM's own: `teardown_end_ns - create_start_ns` of its `record=vm`
  line (KVM_CREATE_VM to the last munmap after the VM's fd closed), one clock
  (CLOCK_BOOTTIME); its phases (create, run, teardown) are compared too, since the fix's
  cost lands in teardown (the ALLE1IS and its DSB) and in the next VM's create and run
  (every EL1&0 entry refilled). `each_ms` is the brief's measure: the whole churn (first
  create to last teardown end, gaps between VMs included) divided by its VMs.
- The distributions leave out the first VM of each VMM invocation (one-time costs, as
  analysis/teardown.steady_state) and VMs that did not run to power-off.
- The unit is the boot (host.boot_id; a bundle without one is a boot of its own): the
  state under study lasts until reboot, and the VMs of one boot share its load, its page
  cache and its first-boot costs. With one boot per state a comparison gives the ratio
  of mean per-VM times and no interval; with two or more on both sides, a two-level
  bootstrap (boots, then VMs within them: compare.nested_bootstrap_ratio_ci) and a rank
  test on the per-boot means.
- The rt CPU's latency is cyclictest's per-loop samples over the churn (the run starts
  it a second before the first VM and stops it after the last). cyclictest skips the
  periods a late wake-up missed (one sample for a stall), so each state's samples are
  set against the periods the churn spanned ((last teardown end - run start) / interval)
  and the loops cyclictest's --json counted; latencies of two states whose coverage
  differs by more than COVERAGE_TOLERANCE are not compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis.compare import (
    DEFAULT_THRESHOLDS,
    Thresholds,
    mean_of_means,
    nested_bootstrap_ratio_ci,
    rank_test,
)
from tracekit.analysis.conditions import FIELD_LABELS, Condition, varying_fields
from tracekit.analysis.teardown import steady_state
from tracekit.errors import TracekitError

BASELINE = "off"
# A kernel without the debug series: accepted only as the patched kernel's unpatched twin.
NO_SERIES = "no debug series"
# The alternative the brief asks about, compared with the broadcast fix.
ALTERNATIVE = ("alle1is", "last-ran")
LATENCY_QUANTILE = 0.99
# Latencies compare only where both states sampled nearly the same share of their periods.
COVERAGE_TOLERANCE = 0.10
# The VMM's phases compared beside the total (StateSummary field, record=vm column, label).
PHASES = (
    ("total", "total_ns", "per-VM time"),
    ("teardown", "teardown_ns", "teardown"),
    ("create", "create_ns", "create"),
    ("run", "run_ns", "run"),
)


def switch_state(kpatch: Any) -> str:
    """The bundle's teardown_flush state from its host fact `kpatch` (preflight's record)."""
    if not isinstance(kpatch, dict):
        return NO_SERIES
    return str(kpatch.get("teardown_flush") or "unknown")


def is_twin(patched: str, unpatched: str) -> bool:
    """Whether `unpatched` is the patched kernel's own unpatched build (same config): the
    series' build appends "-kp<hash>" to the release of the tree it patched."""
    return patched.startswith(unpatched + "-kp")


def per_vm(vms: pl.DataFrame) -> pl.DataFrame:
    """One row per VM of a churn: its create->destroy time and its phases, in ns."""
    if vms.is_empty():
        raise TracekitError("the churn's VMM output holds no VM: nothing to time")
    return vms.select(
        "batch",
        "vm",
        "result",
        "create_start_ns",
        "teardown_end_ns",
        (pl.col("teardown_end_ns") - pl.col("create_start_ns")).alias("total_ns"),
        "create_ns",
        "run_ns",
        "teardown_ns",
    )


@dataclass(frozen=True)
class Churn:
    """One churn run as its bundle recorded it: what the analysis groups and compares."""

    label: str  # the bundle's label and the run, for the report's lines
    state: str  # switch_state of the bundle
    condition: Condition  # conditions.bundle_condition of the bundle
    vms: pl.DataFrame  # per_vm's table
    samples: pl.DataFrame | None  # cyclictest's per-loop samples (latency_ns)
    boot: str | None = None  # host.boot_id (None: unrecorded, a boot of its own)
    status: str = "ok"  # the run's status: ok, over-budget, failed, interrupted
    note: str = ""  # the run's note (an over-budget run's says how far it got)
    start_ns: int | None = None  # the run's start (CLOCK_BOOTTIME); cyclictest began then
    clock: str | None = "boottime"  # the VMM's clock (its run line); start_ns is boottime
    interval_ns: int | None = None  # cyclictest's interval
    counted: int | None = None  # the loops cyclictest's --json counted
    vmid_bits: int | None = None  # the host's VMID width
    guest_cpus: tuple[int, ...] = ()  # the VMM's --cpus: its main thread is on the first
    # The debug series' switch around the churn ({"before": {teardown_flush,
    # teardown_flushes}, "after": ... or None}); None: not recorded (no series, older run).
    switch: dict[str, Any] | None = None

    @property
    def release(self) -> str:
        """The kernel release (the condition's kernel field)."""
        return str(self.condition.kernel)

    def periods(self) -> float | None:
        """The cyclictest periods the churn spanned: run start to last teardown end."""
        if self.start_ns is None or not self.interval_ns or self.clock != "boottime":
            return None
        end = int(self.vms["teardown_end_ns"].max())
        return max(0.0, (end - self.start_ns) / self.interval_ns)


@dataclass(frozen=True)
class Distribution:
    """A set of per-VM times in ms: how many, median, 10th/90th percentiles, mean."""

    n: int
    median: float
    p10: float
    p90: float
    mean: float

    @classmethod
    def of(cls, values_ns: np.ndarray) -> Distribution:
        """The distribution of nanosecond values, in ms."""
        ms = values_ns / 1e6
        p10, median, p90 = np.percentile(ms, [10, 50, 90])
        return cls(len(ms), float(median), float(p10), float(p90), float(ms.mean()))

    @property
    def tail(self) -> float:
        """p90 / median: how long the slow VMs' tail is."""
        return self.p90 / self.median if self.median else math.inf


@dataclass(frozen=True)
class Latency:
    """The rt CPU's cyclictest samples over the churn, in us."""

    samples: int
    median: float
    p99: float
    max: float

    @classmethod
    def of(cls, latency_ns: np.ndarray) -> Latency | None:
        """The summary of per-loop latencies (None: no sample)."""
        if len(latency_ns) == 0:
            return None
        us = latency_ns / 1e3
        median, p99 = np.percentile(us, [50, LATENCY_QUANTILE * 100])
        return cls(len(us), float(median), float(p99), float(us.max()))


@dataclass(frozen=True)
class Coverage:
    """A state's cyclictest samples against the periods its churns spanned and the loops
    cyclictest counted (each None where not every churn records it)."""

    samples: int
    periods: float | None
    counted: int | None

    @property
    def fraction(self) -> float | None:
        """Samples per period spanned."""
        return self.samples / self.periods if self.periods else None

    def line(self, state: str) -> str:
        """One sentence: samples, periods, loops counted and any shortfall."""
        text = f"teardown_flush {state}: {self.samples} rt samples"
        if self.periods is not None:
            text += f" for {self.periods:.0f} periods spanned ({self.fraction:.0%})"
        else:
            text += " (the periods spanned are not known: no run start or interval)"
        if self.counted is None:
            return text + "; no --json count to check them against"
        if self.counted > self.samples:
            missing = self.counted - self.samples
            return text + f"; cyclictest counted {self.counted} loops: {missing} not printed"
        return text + f"; all {self.counted} loops cyclictest counted were recorded"


@dataclass(frozen=True)
class StateSummary:
    """One switch state's churns: VMs, per-VM time and phases, each_ms, the rt latency."""

    state: str
    churns: int
    boots: int  # distinct boots (unrecorded: one per churn)
    vms: int  # every VM recorded
    failed: int  # VMs that did not run to power-off (error, stopped)
    total: Distribution  # create->destroy, steady state
    teardown: Distribution  # the teardown phase alone (closing the fds, unmapping RAM)
    create: Distribution
    run: Distribution
    each_ms: float  # whole churns' span / VMs (the brief's "ms each")
    latency: Latency | None
    coverage: Coverage
    first_vm_ms: float  # the first VM of the first churn (left out of the distributions)
    vmid_bits: int | None  # None: not recorded, or not the same in every churn
    # Per boot, each phase's steady-state values (ns), for comparisons with the boot as unit.
    per_boot: dict[str, list[np.ndarray]] = field(repr=False, compare=False, default_factory=dict)

    @property
    def rollovers(self) -> int | None:
        """VMID rollovers the churn's VMs alone make the allocator do (per churn, most)."""
        if self.vmid_bits is None:
            return None
        return self.vms // self.churns // ((1 << self.vmid_bits) - 1)


def _boots(churns: list[Churn]) -> dict[str, list[Churn]]:
    """The churns of each boot (a churn with no recorded boot is a boot of its own)."""
    boots: dict[str, list[Churn]] = {}
    for n, c in enumerate(churns):
        boots.setdefault(c.boot or f"unrecorded-{n}", []).append(c)
    return boots


def summarize(state: str, churns: list[Churn]) -> StateSummary:
    """One state's summary from its churns."""
    tables = [c.vms for c in churns]
    steady = pl.concat([steady_state(t) for t in tables])
    if steady.is_empty():
        raise TracekitError(
            f"teardown_flush {state}: no VM after the first ran to power-off; run the churn "
            "with --repeat 2 or more"
        )
    span = sum(int(t["teardown_end_ns"].max() - t["create_start_ns"].min()) for t in tables)
    count = sum(t.height for t in tables)
    samples = [c.samples["latency_ns"].to_numpy() for c in churns if c.samples is not None]
    periods = [c.periods() for c in churns]
    counted = [c.counted for c in churns]
    coverage = Coverage(
        samples=sum(len(s) for s in samples),
        periods=None if None in periods else float(sum(p or 0.0 for p in periods)),
        counted=None if None in counted else sum(n or 0 for n in counted),
    )
    per_boot: dict[str, list[np.ndarray]] = {name: [] for name, _, _ in PHASES}
    for boot in _boots(churns).values():
        frame = pl.concat([steady_state(c.vms) for c in boot])
        if frame.is_empty():
            continue
        for name, column, _ in PHASES:
            per_boot[name].append(frame[column].to_numpy().astype(float))
    bits = {c.vmid_bits for c in churns}
    return StateSummary(
        state=state,
        churns=len(churns),
        boots=len(_boots(churns)),
        vms=count,
        failed=sum(t.filter(pl.col("result") != "ok").height for t in tables),
        total=Distribution.of(steady["total_ns"].to_numpy()),
        teardown=Distribution.of(steady["teardown_ns"].to_numpy()),
        create=Distribution.of(steady["create_ns"].to_numpy()),
        run=Distribution.of(steady["run_ns"].to_numpy()),
        each_ms=span / count / 1e6,
        latency=Latency.of(np.concatenate(samples)) if samples else None,
        coverage=coverage,
        first_vm_ms=float(tables[0]["total_ns"][0]) / 1e6,
        vmid_bits=bits.pop() if len(bits) == 1 else None,
        per_boot=per_boot,
    )


@dataclass(frozen=True)
class PhaseComparison:
    """One phase of `state` against `base`: the ratio of (per-boot) means, its interval
    and rank test where both have two boots or more, and the difference of medians."""

    phase: str
    mean_ratio: float
    ci_low: float  # NaN: fewer than two boots on a side
    ci_high: float
    p: float  # rank test on per-boot means; NaN as ci_low
    median_diff_ms: float

    @property
    def disagree(self) -> bool:
        """The mean and the median move in opposite directions."""
        return (self.mean_ratio - 1) * self.median_diff_ms < 0


@dataclass(frozen=True)
class StateComparison:
    """A state against a base state (`off`, or last-ran for alle1is)."""

    state: str
    base: str
    boots: tuple[int, int]  # base's, state's
    phases: list[PhaseComparison]
    each_ratio: float
    latency_max_ratio: float | None  # None: no samples, or not comparable
    latency_p99_ratio: float | None
    latency_note: str  # why the latency is not compared, or what its coverage is
    tails: tuple[float, float]  # per-VM time p90/median: base's, state's
    confidence: float

    @property
    def total(self) -> PhaseComparison:
        """The per-VM time (create start to teardown end)."""
        return self.phases[0]

    def statement(self) -> str:
        """The comparison as one sentence of the report."""
        total = self.total
        text = f"teardown_flush {self.state} vs {self.base}: per-VM time x{total.mean_ratio:.3f}"
        if math.isnan(total.ci_low):
            text += " (one boot per state: no interval across boots)"
        else:
            text += (
                f" ({self.confidence:.0%} CI {total.ci_low:.3f}-{total.ci_high:.3f} over "
                f"{self.boots[0]}+{self.boots[1]} boots, rank test on per-boot means "
                f"p={total.p:.3f})"
            )
        text += f", median {total.median_diff_ms:+.2f} ms"
        for phase in self.phases[1:]:
            text += (
                f", {phase.phase} x{phase.mean_ratio:.3f} (median {phase.median_diff_ms:+.2f} ms)"
            )
        text += f", ms each x{self.each_ratio:.3f}"
        if self.latency_max_ratio is not None:
            text += (
                f"; rt CPU latency max x{self.latency_max_ratio:.2f}, "
                f"p99 x{self.latency_p99_ratio:.2f} (no interval; {self.latency_note})"
            )
        else:
            text += f"; rt CPU latency {self.latency_note}"
        return text

    def disagreement(self) -> str | None:
        """A finding when the per-VM time's mean and median point in opposite directions."""
        total = self.total
        if not total.disagree:
            return None
        base_tail, tail = self.tails
        longer, ratio = (self.base, base_tail) if base_tail > tail else (self.state, tail)
        other = tail if longer == self.base else base_tail
        mean = "higher" if total.mean_ratio > 1 else "lower"
        median = "higher" if total.median_diff_ms > 0 else "lower"
        return (
            f"teardown_flush {self.state} vs {self.base}: the mean per-VM time is {mean} but "
            f"the median {median}: the means follow the slow VMs' tail, and {longer}'s "
            f"p90/median is {ratio:.2f} against {other:.2f}"
        )


def compare_states(
    base: StateSummary, other: StateSummary, thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> StateComparison:
    """`other` against `base`, the boot as the unit (module docstring)."""
    phases = []
    for name, _, label in PHASES:
        base_boots, boots = base.per_boot[name], other.per_boot[name]
        low, high = nested_bootstrap_ratio_ci(base_boots, boots, thresholds)
        p = math.nan
        if not math.isnan(low):
            p, _ = rank_test(
                np.array([b.mean() for b in base_boots]), np.array([b.mean() for b in boots])
            )
        base_d, other_d = getattr(base, name), getattr(other, name)
        phases.append(
            PhaseComparison(
                phase=label,
                mean_ratio=mean_of_means(boots) / mean_of_means(base_boots),
                ci_low=low,
                ci_high=high,
                p=p,
                median_diff_ms=other_d.median - base_d.median,
            )
        )
    max_ratio = p99_ratio = None
    note = _latency_note(base, other)
    if base.latency is not None and other.latency is not None and not note.startswith("not"):
        max_ratio = other.latency.max / base.latency.max
        p99_ratio = other.latency.p99 / base.latency.p99
    return StateComparison(
        state=other.state,
        base=base.state,
        boots=(base.boots, other.boots),
        phases=phases,
        each_ratio=other.each_ms / base.each_ms,
        latency_max_ratio=max_ratio,
        latency_p99_ratio=p99_ratio,
        latency_note=note,
        tails=(base.total.tail, other.total.tail),
        confidence=thresholds.confidence,
    )


def _latency_note(base: StateSummary, other: StateSummary) -> str:
    """Why two states' latencies do not compare ("not ..."), else their coverage."""
    if base.latency is None or other.latency is None:
        return "not compared: a state has no cyclictest sample"
    a, b = base.coverage.fraction, other.coverage.fraction
    if a is None or b is None:
        return "coverage of the periods not known"
    shares = f"samples cover {a:.0%} of {base.state}'s periods and {b:.0%} of {other.state}'s"
    if min(a, b) < (1 - COVERAGE_TOLERANCE) * max(a, b):
        return (
            f"not comparable: {shares} (cyclictest skips the periods a late wake-up missed, "
            f"so the lower one hides its worst stretches)"
        )
    return shares


@dataclass(frozen=True)
class GroupResult:
    """The churns of one condition: every state's summary, the comparisons, the points."""

    label: str  # the condition's varying fields ("" when every churn shares one)
    states: list[StateSummary]
    comparisons: list[StateComparison]
    notes: list[str]  # findings about this group (disagreements, rollovers, last-ran, ...)
    # Per-VM times (steady state) with their state, for the distribution plot.
    points: pl.DataFrame


@dataclass(frozen=True)
class ChurnResult:
    """The comparable groups, and every churn left out with the reason."""

    groups: list[GroupResult]
    left_out: list[str]  # for the report's unknowns
    notes: list[str]  # findings about the bundles as a whole
    contradictions: list[str] = field(default_factory=list)  # the switch not as recorded


def churn_result(churns: list[Churn], thresholds: Thresholds = DEFAULT_THRESHOLDS) -> ChurnResult:
    """Churns grouped by condition, summarised per state, compared within their group."""
    left_out = [
        f"{c.label}: the churn ended {c.status}"
        + (f" ({c.note})" if c.note else f" after {_ok_vms(c)} VMs ran to power-off")
        + ": left out of the comparison"
        for c in churns
        if c.status != "ok"
    ]
    done = [c for c in churns if c.status == "ok"]
    grouped, twins_out = _by_condition(done)
    left_out += twins_out
    varying = varying_fields(list(grouped)) if len(grouped) > 1 else ()
    groups = [
        _group(cond.label(varying) if varying else "", by_state, thresholds)
        for cond, by_state in grouped.items()
    ]
    notes = []
    hosts = {str(cond.host) for cond in grouped}
    if "board" in hosts and len(hosts) > 1:
        notes.append(
            "emulated and board churns are never pooled or compared with each other: each "
            "condition below is compared only within itself"
        )
    conditions = list(grouped)
    for cond, group in list(zip(conditions, groups, strict=True))[1:]:
        notes.append(
            f"{group.label}: differs from {groups[0].label} in "
            + ", ".join(FIELD_LABELS.get(n, n) for n in cond.differing(conditions[0]))
            + ": compared only within itself"
        )
    if not any(BASELINE in {s.state for s in g.states} for g in groups):
        left_out.append(
            f"no comparable churn with teardown_flush {BASELINE}: nothing to compare the "
            "states with"
        )
    contradictions = [text for c in churns if (text := switch_contradiction(c))]
    return ChurnResult(groups, left_out, notes, contradictions)


def switch_contradiction(churn: Churn) -> str | None:
    """A churn whose switch did not do what its state says: changed during the churn, or
    a flush count that did not grow by one per VM that ran (alle1is, last-ran; a VM stopped
    before it ran may not flush) or grew with the switch off, or a local flush of last-ran
    that failed at EL2 (counted by the series since it stopped hiding them)."""
    record = churn.switch
    if not record or not isinstance(record.get("before"), dict):
        return None
    before, after = record["before"], record.get("after")
    if not isinstance(after, dict):
        return f"{churn.label}: the debug series' switch could not be read after the churn"
    if after.get("teardown_flush") != before.get("teardown_flush"):
        return (
            f"{churn.label}: teardown_flush changed during the churn: "
            f"{before.get('teardown_flush')} before, {after.get('teardown_flush')} after"
        )
    failed = before.get("teardown_failures"), after.get("teardown_failures")
    if all(isinstance(n, int) for n in failed) and failed[1] != failed[0]:
        return (
            f"{churn.label}: {failed[1] - failed[0]} of teardown_flush {churn.state}'s local "
            "TLBI ALLE1s failed at EL2 during the churn: its flushes did not all run"
        )
    counts = before.get("teardown_flushes"), after.get("teardown_flushes")
    if not all(isinstance(n, int) for n in counts):
        return None
    grew = counts[1] - counts[0]
    ran, vms = _ok_vms(churn), churn.vms.height
    if churn.state == BASELINE and grew != 0:
        return f"{churn.label}: teardown_flush off, yet its flush count grew by {grew}"
    if churn.state in ALTERNATIVE and not ran <= grew <= vms:
        return (
            f"{churn.label}: teardown_flush {churn.state} flushed {grew} times over {vms} VMs "
            f"({ran} ran to power-off): not one flush per VM"
        )
    return None


def _ok_vms(churn: Churn) -> int:
    """The VMs of a churn that ran to power-off."""
    return churn.vms.filter(pl.col("result") == "ok").height


def churn_condition(condition: Condition) -> Condition:
    """The condition churns are grouped by: the bundle's, host freshness set aside (the
    churn's first VM leaves every host dirty, and the steady-state VMs come after it;
    states churned in one boot are said so by shared_boots)."""
    return replace(condition, freshness="set aside")


def _by_condition(churns: list[Churn]) -> tuple[dict[Condition, dict[str, list[Churn]]], list[str]]:
    """Churns by condition and state; a no-series churn joins the condition of the patched
    kernel it is the unpatched twin of, or is left out (a line saying why)."""
    grouped: dict[Condition, dict[str, list[Churn]]] = {}
    for c in churns:
        if c.state != NO_SERIES:
            grouped.setdefault(churn_condition(c.condition), {}).setdefault(c.state, []).append(c)
    left_out = []
    for c in churns:
        if c.state != NO_SERIES:
            continue
        home = [
            cond
            for cond in grouped
            if is_twin(str(cond.kernel), c.release)
            and replace(churn_condition(c.condition), kernel=cond.kernel) == cond
        ]
        if home:
            grouped[home[0]].setdefault(NO_SERIES, []).append(c)
            continue
        patched = sorted({str(cond.kernel) for cond in grouped})
        twin_of = [k for k in patched if is_twin(k, c.release)]
        why = (
            f"it is the twin of {', '.join(twin_of)} but its condition differs"
            if twin_of
            else "it is not the unpatched twin of "
            + (", ".join(patched) if patched else "any patched kernel here")
            + " (a twin's release is the patched one's before '-kp')"
        )
        left_out.append(
            f"{c.label}: kernel {c.release} has no debug series and {why}: left out (issue "
            "20: patched only against its own unpatched build, never a stock kernel)"
        )
    return grouped, left_out


def _group(label: str, by_state: dict[str, list[Churn]], thresholds: Thresholds) -> GroupResult:
    """Summaries per state (off first), comparisons, the notes, the per-VM points."""
    order = sorted(by_state, key=lambda s: (s != BASELINE, s == NO_SERIES, s))
    states = {state: summarize(state, by_state[state]) for state in order}
    pairs = [(BASELINE, s) for s in order if s != BASELINE] if BASELINE in states else []
    if all(s in states for s in ALTERNATIVE):
        pairs.append((ALTERNATIVE[1], ALTERNATIVE[0]))
    comparisons = [compare_states(states[a], states[b], thresholds) for a, b in pairs]
    notes = [text for c in comparisons if (text := c.disagreement())]
    notes += [s.coverage.line(s.state) for s in states.values()]
    notes += _rollovers(list(states.values()))
    notes += _last_ran(by_state.get(ALTERNATIVE[1], []))
    if BASELINE not in states:
        notes.append(
            f"no churn with teardown_flush {BASELINE} under this condition: nothing to compare "
            "the states with"
        )
    points = pl.concat(
        [
            pl.concat([steady_state(c.vms) for c in by_state[state]]).select(
                pl.lit(state).alias("state"),
                pl.int_range(pl.len(), dtype=pl.Int32).alias("vm_seq"),
                (pl.col("total_ns") / 1e6).alias("vm_ms"),
            )
            for state in order
        ]
    )
    return GroupResult(label, list(states.values()), comparisons, notes, points)


def _rollovers(states: list[StateSummary]) -> list[str]:
    """The VMID width and the rollovers a churn makes: a rollover does the fix's ALLE1IS in
    every state, off included, so part of the fix's effect enters the baseline."""
    bits = {s.vmid_bits for s in states}
    if bits == {None}:
        return ["VMID width not recorded: whether the churns rolled the VMIDs over is unknown"]
    said = ", ".join(
        f"{s.state} {s.vmid_bits}-bit VMIDs, about {s.rollovers} rollovers per churn"
        if s.vmid_bits is not None
        else f"{s.state} VMID width not recorded"
        for s in states
    )
    text = f"VMID rollovers expected from the churn's VMs (VMs / (2^bits - 1)): {said}"
    if any((s.rollovers or 0) >= 1 for s in states):
        text += (
            "; WARNING: a rollover does the same TLBI ALLE1IS in every state, off included, "
            "so part of the fix's effect is in the baseline"
        )
    return [text]


def _last_ran(churns: list[Churn]) -> list[str]:
    """last-ran on one guest CPU sends no IPI: the teardown runs on the only CPU the VM ran
    on (the VMM's main thread and vCPU 0 share --cpus' first), so on_each_cpu_mask runs
    its function locally: the alternative's cheapest case, not its IPI cost."""
    if not churns or any(len(c.guest_cpus) != 1 for c in churns):
        return []
    cpu = churns[0].guest_cpus[0]
    return [
        f"teardown_flush last-ran here sends no IPI: the VMM's main thread and vCPU 0 both "
        f"ran on CPU {cpu}, so the teardown runs on the only CPU in last_vcpu_ran and the "
        "local ALLE1 needs no IPI: this is the alternative's cheapest case, not the IPI cost "
        "the brief asks about"
    ]


def shared_boots(boots: dict[str, set[str | None]]) -> list[str]:
    """One sentence per boot that churned more than one state (host.boot_id), and one for
    states whose bundles do not record their boot: the comparison asks a fresh boot per
    state, since what one churn leaves may weigh on the next."""
    by_boot: dict[str, list[str]] = {}
    unrecorded = sorted(state for state, ids in boots.items() if None in ids)
    for state, ids in boots.items():
        for boot in ids - {None}:
            by_boot.setdefault(boot, []).append(state)
    notes = [
        f"teardown_flush {', '.join(states)} were churned in one boot ({boot[:8]}): not a "
        "fresh boot each, so an order effect is not excluded"
        for boot, states in by_boot.items()
        if len(states) > 1
    ]
    if unrecorded:
        notes.append(
            f"teardown_flush {', '.join(unrecorded)}: bundles without host.boot_id, so "
            "whether each state had a fresh boot is unknown"
        )
    return notes


def churn_boots(churns: list[Churn]) -> dict[str, set[str | None]]:
    """The boots (None if unrecorded) of each state's churns, for shared_boots."""
    boots: dict[str, set[str | None]] = {}
    for c in churns:
        boots.setdefault(c.state, set()).add(c.boot)
    return boots


def summary_frame(states: list[StateSummary]) -> pl.DataFrame:
    """One row per state: VMs, per-VM time and phases, ms each, the rt CPU's latency and
    its coverage, the VMID width."""
    rows = []
    for s in states:
        latency, coverage = s.latency, s.coverage
        rows.append(
            {
                "teardown_flush": s.state,
                "churns": s.churns,
                "boots": s.boots,
                "vms": s.vms,
                "failed": s.failed,
                "vm_median_ms": s.total.median,
                "vm_p10_ms": s.total.p10,
                "vm_p90_ms": s.total.p90,
                "vm_mean_ms": s.total.mean,
                "create_median_ms": s.create.median,
                "run_median_ms": s.run.median,
                "teardown_median_ms": s.teardown.median,
                "each_ms": s.each_ms,
                "first_vm_ms": s.first_vm_ms,
                "rt_samples": latency.samples if latency else None,
                "rt_periods": coverage.periods,
                "rt_counted": coverage.counted,
                "rt_median_us": latency.median if latency else None,
                "rt_p99_us": latency.p99 if latency else None,
                "rt_max_us": latency.max if latency else None,
                "vmid_bits": s.vmid_bits,
                "rollovers": s.rollovers,
            }
        )
    return pl.DataFrame(rows).with_columns(pl.col(pl.Float64).round(2))


def comparison_frame(comparisons: list[StateComparison]) -> pl.DataFrame:
    """One row per comparison: each phase's ratio (with its interval where there is one),
    ms each, the latency ratios (null where not comparable)."""
    rows = []
    for c in comparisons:
        row: dict[str, object] = {
            "teardown_flush": c.state,
            "vs": c.base,
            "boots": f"{c.boots[0]}+{c.boots[1]}",
        }
        for phase, (name, _, _) in zip(c.phases, PHASES, strict=True):
            row[f"{name}_mean_ratio"] = phase.mean_ratio
            if name == "total":
                row["ci_low"] = None if math.isnan(phase.ci_low) else phase.ci_low
                row["ci_high"] = None if math.isnan(phase.ci_high) else phase.ci_high
                row["p"] = None if math.isnan(phase.p) else phase.p
            row[f"{name}_median_diff_ms"] = phase.median_diff_ms
        row |= {
            "each_ratio": c.each_ratio,
            "rt_max_ratio": c.latency_max_ratio,
            "rt_p99_ratio": c.latency_p99_ratio,
        }
        rows.append(row)
    return pl.DataFrame(rows).with_columns(pl.col(pl.Float64).round(3))
