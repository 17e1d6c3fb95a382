"""The teardown fix's cost: per-VM time and the rt CPU's latency of a vm-churn, by switch state.

The brief's figures: 500 VMs created, run and torn down one after another took 32.1 ms
each with the fix and 33.4 ms without, and the isolated CPU's latency meanwhile was 15 us
against 13 us. Here each state of reproducer/kpatch's `teardown_flush` (off, alle1is,
last-ran; a kernel without the series is its own state) is one or more vm-churn runs.

- Which churns compare: only churns of one condition (analysis/conditions.py: kernel,
  KVM mode, cores, emulated or not, guest, placement, ...; the switch state is no
  condition field, host freshness is set aside, and the protocol is the churn's own: VMs
  per churn, whether an idle VM was held, cyclictest's interval: churn_condition). The
  no-series state is accepted only as the patched kernel's own unpatched twin (`is_twin`:
  the patched release is the twin's followed by "-kp"), never a stock kernel; every churn
  left out is one line saying why. A churn that did not end ok (over its budget, failed,
  interrupted) is left out too, with the VMs it did.
- Per-VM time is the VMM's own: `teardown_end_ns - create_start_ns` of its `record=vm`
  line (KVM_CREATE_VM to the last munmap after the VM's fd closed), one clock
  (CLOCK_BOOTTIME); its phases (create, run, teardown) are compared too. `each_ms` is the
  brief's measure and the primary one: the whole churn (first create to last teardown
  end, first VM and gaps included) divided by its VMs.
- The per-VM distributions leave out the first VM of each VMM invocation (one-time costs,
  as analysis/teardown.steady_state) and VMs that did not run to power-off.
- The unit is the boot (host.boot_id; a bundle without one is a boot of its own): the
  state under study lasts until reboot, and the VMs of one boot share its load, its page
  cache and its first-boot costs. Each metric is one value per boot; a comparison is the
  ratio of the per-boot values' geometric means, a Welch t interval on their logs (two
  boots a side or more: compare.welch_log_ratio_ci; a percentile bootstrap of 2-4 boots
  undercovers), an exact rank test on them, and the project's verdict rule with its
  floor (compare.runs_needed: 4+4) and Holm over every metric but the primary one
  (compare.compare_all). The minimum detectable ratio says what the boots given resolve.
- The rt CPU's latency is cyclictest's per-loop samples within the churn (first create
  start to last teardown end; cyclictest starts a second before the VMM, and those idle
  samples are left out). A late wake-up is recorded whole (its latency runs from the
  missed deadline) and cyclictest then skips the periods it missed, so a sample of
  latency L stands for 1 + floor(L / interval) periods: L, L - I, ... (per_period). The
  quantiles are of those per-period latencies; the max is the recorded max, which
  skipping does not touch, and is always compared. Only periods the samples do not
  account for (lost output lines, a late start) make a state's quantiles not comparable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis.compare import (
    DEFAULT_THRESHOLDS,
    Comparison,
    Thresholds,
    compare_all,
    compare_units,
    min_detectable_ratio,
    min_p_value,
    units_for_ratio,
)
from tracekit.analysis.conditions import FIELD_LABELS, Condition, Unknown, varying_fields
from tracekit.analysis.teardown import steady_state
from tracekit.errors import TracekitError

BASELINE = "off"
# A kernel without the debug series: accepted only as the patched kernel's unpatched twin.
NO_SERIES = "no debug series"
# The alternative the brief asks about, compared with the broadcast fix.
ALTERNATIVE = ("alle1is", "last-ran")
# The comparison whose ms each is the group's primary metric: the fix's cost, the brief's.
PRIMARY = ("alle1is", BASELINE)
# The brief's effect: 33.4 vs 32.1 ms each, for the boots it would take to resolve.
BRIEF_RATIO = 33.4 / 32.1
LATENCY_QUANTILE = 0.99
# A state's quantiles compare only where its samples account for nearly every period of
# the churn (samples + periods their long wake-ups skipped, against the periods spanned).
COVERAGE_TOLERANCE = 0.10
# Why an emulated host's rt latencies get no state ratio. QEMU's TCG does a broadcast TLBI
# (tlbi_aa64_*is_write -> tlb_flush_*_all_cpus_synced, accel/tcg/cputlb.c) as safe work:
# the issuing vCPU's flush is queued with async_safe_run_on_cpu, which runs it only once
# every vCPU has left its execution loop, so each broadcast TLBI in any state (the host's
# munmap VAE1IS, the REPEAT_TLBI repeats, the fix's ALLE1IS) stops the rt vCPU too.
EMULATED_LATENCY = (
    "no state ratio in an emulated host: under QEMU's TCG every broadcast TLBI, in every "
    "state, waits until all vCPUs, the rt CPU's included, have left their execution loop "
    "(safe work), so the rt latency measures the emulator"
)
# The per-boot values compared (key, label): "ms each" first, the primary metric.
METRICS = (
    ("each", "ms each"),
    ("mean", "per-VM mean"),
    ("median", "per-VM median"),
    ("create", "create"),
    ("run", "run"),
    ("teardown", "teardown"),
)
# The VMM's phases (StateSummary field and record=vm column): their per-boot means compare.
PHASES = (("create", "create_ns"), ("run", "run_ns"), ("teardown", "teardown_ns"))


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
class PerPeriod:
    """A churn's cyclictest samples within its window, as the periods they stand for."""

    latency_ns: np.ndarray  # per period: a sample of latency L gives L, L - I, ... (> 0)
    samples: int  # samples recorded within the window
    max_ns: int | None  # their max (None: no sample in the window)
    periods: float  # the periods the window spans


@dataclass(frozen=True)
class Churn:
    """One churn run as its bundle recorded it: what the analysis groups and compares."""

    label: str  # the bundle's label and the run, for the report's lines
    state: str  # switch_state of the bundle
    condition: Condition  # conditions.bundle_condition of the bundle
    vms: pl.DataFrame  # per_vm's table
    samples: pl.DataFrame | None  # cyclictest's per-loop samples (cycle, latency_ns)
    boot: str | None = None  # host.boot_id (None: unrecorded, a boot of its own)
    status: str = "ok"  # the run's status: ok, over-budget, failed, interrupted
    note: str = ""  # the run's note (an over-budget run's says how far it got)
    start_ns: int | None = None  # the run's start (CLOCK_BOOTTIME); cyclictest began then
    clock: str | None = None  # the VMM's clock (its run line; None: not said)
    interval_ns: int | None = None  # cyclictest's interval
    counted: int | None = None  # the loops cyclictest's --json counted
    vmid_bits: int | None = None  # the host's VMID width
    guest_cpus: tuple[int, ...] = ()  # the VMM's --cpus: its main thread is on the first
    # The debug series' switch around the churn ({"before": {teardown_flush,
    # teardown_flushes}, "after": ... or None}); None: not recorded (no series, older run).
    switch: dict[str, Any] | None = None
    repeat: int | None = None  # the VMs asked for (the scenario's parameters)
    # The VMM held an idle, never-run VM over the churn (--hold-vm); False for bundles
    # from before the option, whose VMM could not.
    hold_vm: bool = False

    @property
    def release(self) -> str:
        """The kernel release (the condition's kernel field)."""
        return str(self.condition.kernel)

    def window(self) -> tuple[int, int]:
        """The churn itself: first create start to last teardown end (VMM clock)."""
        return int(self.vms["create_start_ns"].min()), int(self.vms["teardown_end_ns"].max())

    def per_period(self) -> PerPeriod | None:
        """The samples within the window as the periods they stand for (module docstring).

        Sample i's period index, counted from cyclictest's first loop at the run's start,
        is i plus the periods every earlier sample skipped. None: no samples, or the run's
        start, the interval or the VMM's boottime clock not known.
        """
        if self.samples is None or self.start_ns is None or not self.interval_ns:
            return None
        if self.clock != "boottime":
            return None
        interval = self.interval_ns
        frame = self.samples.sort("cycle") if "cycle" in self.samples.columns else self.samples
        latency = frame["latency_ns"].to_numpy().astype(np.int64)
        skipped = np.maximum(latency, 0) // interval
        index = np.arange(len(latency)) + np.cumsum(skipped) - skipped
        at = self.start_ns + (index + 1) * interval
        start, end = self.window()
        inside = (at >= start) & (at <= end)
        kept, skips = latency[inside], skipped[inside]
        reps = skips + 1
        offsets = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
        return PerPeriod(
            latency_ns=np.repeat(kept, reps) - offsets * interval,
            samples=int(inside.sum()),
            max_ns=int(kept.max()) if len(kept) else None,
            periods=(end - start) / interval,
        )


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
    """The rt CPU's latency over the churn, in us: quantiles per period, the recorded max."""

    samples: int  # recorded within the churn
    periods: int  # the periods they stand for
    median: float
    p99: float
    max: float

    @classmethod
    def of(cls, per_period: list[PerPeriod]) -> Latency | None:
        """The summary of churns' per-period latencies (None: no sample in any window)."""
        values = [p.latency_ns for p in per_period if len(p.latency_ns)]
        if not values:
            return None
        us = np.concatenate(values) / 1e3
        median, p99 = np.percentile(us, [50, LATENCY_QUANTILE * 100])
        top = max(p.max_ns for p in per_period if p.max_ns is not None) / 1e3
        samples = sum(p.samples for p in per_period)
        return cls(samples, len(us), float(median), float(p99), float(top))


@dataclass(frozen=True)
class Coverage:
    """A state's cyclictest samples against the churn's periods: how many periods the
    samples within the churns stand for (accounted) out of those the churns spanned, and
    the loops cyclictest counted against the samples printed (each None where not every
    churn records it)."""

    samples: int  # within the churns' windows
    accounted: int | None
    periods: float | None
    printed: int  # every sample printed, lead-in included
    counted: int | None

    @property
    def fraction(self) -> float | None:
        """Periods accounted for per period spanned (about 1 when nothing is missing)."""
        if self.accounted is None or not self.periods:
            return None
        return self.accounted / self.periods

    @property
    def unexplained(self) -> bool:
        """Periods the samples do not account for, or loops counted but not printed, beyond
        COVERAGE_TOLERANCE (cyclictest's last few lines are often lost at its SIGINT,
        after the churn)."""
        lost = self.counted is not None and self.counted - self.printed > (
            COVERAGE_TOLERANCE * self.counted
        )
        frac = self.fraction
        return lost or (frac is not None and frac < 1 - COVERAGE_TOLERANCE)

    def line(self, state: str) -> str:
        """One sentence: samples, the periods they stand for, loops counted, any gap."""
        text = f"teardown_flush {state}: {self.samples} rt samples within the churn"
        if self.fraction is not None:
            text += (
                f" stand for {self.accounted} of its {self.periods:.0f} periods "
                f"({self.fraction:.0%}; each late wake-up also stands for the periods it "
                "made cyclictest skip)"
            )
        else:
            text += " (the periods spanned are not known: no run start, interval or clock)"
        if self.counted is None:
            text += "; no --json count to check them against"
        elif self.counted > self.printed:
            text += (
                f"; cyclictest counted {self.counted} loops: "
                f"{self.counted - self.printed} not printed"
            )
        else:
            text += f"; all {self.counted} loops cyclictest counted were recorded"
        if self.unexplained:
            text += ": periods no sample accounts for, so its quantiles are not compared"
        return text


@dataclass(frozen=True)
class StateSummary:
    """One switch state's churns: VMs, per-VM time and phases, each_ms, the rt latency."""

    state: str
    churns: int
    boots: int  # distinct boots (unrecorded: one per churn)
    vms: int  # every VM recorded
    failed: int  # VMs that did not run to power-off (error, stopped)
    total: Distribution  # create->destroy, steady state, pooled over boots
    teardown: Distribution  # the teardown phase alone (closing the fds, unmapping RAM)
    create: Distribution
    run: Distribution
    each_ms: float  # whole churns' span / VMs (the brief's "ms each"), pooled
    latency: Latency | None
    coverage: Coverage
    first_vm_ms: tuple[float, ...]  # each churn's first VM (left out of the distributions)
    vmid_bits: int | None  # None: not recorded, or not the same in every churn
    # Per boot, each METRICS key's value (ms), for comparisons with the boot as unit.
    per_boot: dict[str, np.ndarray] = field(repr=False, compare=False, default_factory=dict)
    boot_tail: float = math.nan  # the median over boots of each boot's p90/median
    emulated: bool = False  # the churns ran in an emulated host (condition.host known, not board)

    @property
    def rollovers(self) -> int | None:
        """VMID rollovers the churn's VMs alone make the allocator do (per churn, most)."""
        if self.vmid_bits is None:
            return None
        return self.vms // self.churns // ((1 << self.vmid_bits) - 1)

    @property
    def boot_median_ms(self) -> float:
        """The median of the per-boot median per-VM times."""
        return float(np.median(self.per_boot["median"]))


def _boots(churns: list[Churn]) -> dict[str, list[Churn]]:
    """The churns of each boot (a churn with no recorded boot is a boot of its own)."""
    boots: dict[str, list[Churn]] = {}
    for n, c in enumerate(churns):
        boots.setdefault(c.boot or f"unrecorded-{n}", []).append(c)
    return boots


def _span_each_ms(churns: list[Churn]) -> float:
    """Churns' whole spans over their VMs, in ms (the brief's "ms each")."""
    span = sum(c.window()[1] - c.window()[0] for c in churns)
    return span / sum(c.vms.height for c in churns) / 1e6


def _boot_values(churns: list[Churn]) -> dict[str, float] | None:
    """One boot's METRICS values (ms) and its p90/median; None: no steady-state VM."""
    frame = pl.concat([steady_state(c.vms) for c in churns])
    if frame.is_empty():
        return None
    total = frame["total_ns"].to_numpy() / 1e6
    values = {
        "each": _span_each_ms(churns),
        "mean": float(total.mean()),
        "median": float(np.median(total)),
        "tail": float(np.percentile(total, 90) / np.median(total)),
    }
    for name, column in PHASES:
        values[name] = float(frame[column].mean()) / 1e6
    return values


def summarize(state: str, churns: list[Churn]) -> StateSummary:
    """One state's summary from its churns."""
    tables = [c.vms for c in churns]
    steady = pl.concat([steady_state(t) for t in tables])
    if steady.is_empty():
        raise TracekitError(
            f"teardown_flush {state}: no VM after the first ran to power-off; run the churn "
            "with --repeat 2 or more"
        )
    per_period = [p for c in churns if (p := c.per_period()) is not None]
    known = len(per_period) == len(churns)
    counted = [c.counted for c in churns]
    coverage = Coverage(
        samples=sum(p.samples for p in per_period),
        accounted=sum(len(p.latency_ns) for p in per_period) if known else None,
        periods=sum(p.periods for p in per_period) if known else None,
        printed=sum(c.samples.height for c in churns if c.samples is not None),
        counted=None if None in counted else sum(n or 0 for n in counted),
    )
    boots = [v for boot in _boots(churns).values() if (v := _boot_values(boot)) is not None]
    per_boot = {key: np.array([b[key] for b in boots]) for key, _ in METRICS}
    bits = {c.vmid_bits for c in churns}
    return StateSummary(
        state=state,
        churns=len(churns),
        boots=len(_boots(churns)),
        vms=sum(t.height for t in tables),
        failed=sum(t.filter(pl.col("result") != "ok").height for t in tables),
        total=Distribution.of(steady["total_ns"].to_numpy()),
        teardown=Distribution.of(steady["teardown_ns"].to_numpy()),
        create=Distribution.of(steady["create_ns"].to_numpy()),
        run=Distribution.of(steady["run_ns"].to_numpy()),
        each_ms=_span_each_ms(churns),
        latency=Latency.of(per_period),
        coverage=coverage,
        first_vm_ms=tuple(float(t["total_ns"][0]) / 1e6 for t in tables),
        vmid_bits=bits.pop() if len(bits) == 1 else None,
        per_boot=per_boot,
        boot_tail=float(np.median([b["tail"] for b in boots])),
        emulated=all(_emulated(c.condition) for c in churns),
    )


def _emulated(condition: Condition) -> bool:
    """The condition's host is known to be an emulation (not a board, not unknown)."""
    return not isinstance(condition.host, Unknown) and condition.host != "board"


@dataclass(frozen=True)
class StateComparison:
    """A state against a base state (`off`, or last-ran for alle1is)."""

    state: str
    base: str
    boots: tuple[int, int]  # base's, state's
    metrics: list[Comparison]  # METRICS order; Holm-adjusted over the group (holm_group)
    detectable: float | None  # ms each's minimum detectable ratio (80% power, two-sided)
    brief_boots: int | None  # boots per state ms each would need to resolve the brief's ratio
    median_diff_ms: float  # median of per-boot medians: state's - base's
    latency_max_ratio: float | None  # None: a state has no sample in its churns
    latency_p99_ratio: float | None  # None: as the max, or periods unaccounted for
    latency_note: str  # the coverage, or why the quantiles are not compared
    tails: tuple[float, float]  # per-VM p90/median, median over boots: base's, state's
    confidence: float

    @property
    def each(self) -> Comparison:
        """ms each, the primary metric."""
        return self.metrics[0]

    @property
    def mean(self) -> Comparison:
        """The per-VM time's per-boot means."""
        return self.metrics[1]

    def metric_name(self, key: str) -> str:
        """The name a metric's Comparison carries (unique in the group, for Holm)."""
        label = dict(METRICS)[key]
        return f"{self.state} vs {self.base}: {label}"

    def statement(self) -> str:
        """The comparison as one sentence of the report."""
        k1, k2 = self.boots
        each = self.each
        text = (
            f"teardown_flush {self.state} vs {self.base}, {k1}+{k2} boots: "
            f"ms each x{each.ratio:.3f}{self._interval(each)}: {self._verdict(each)}"
        )
        if self.detectable is not None:
            text += (
                f"; at the between-boot spread seen, {k1}+{k2} boots detect about "
                f"x{self.detectable:.2f} (80% power)"
            )
            if self.brief_boots is not None:
                text += f", the brief's x{BRIEF_RATIO:.2f} about {self.brief_boots} boots a state"
        text += "; " + ", ".join(self._secondary(c) for c in self.metrics[1:])
        text += f" (Holm over the group); median of boot medians {self.median_diff_ms:+.2f} ms"
        if self.latency_max_ratio is None:
            return text + f"; rt CPU latency {self.latency_note}"
        text += f"; rt CPU latency max x{self.latency_max_ratio:.2f}"
        if self.latency_p99_ratio is not None:
            text += f", p99 per period x{self.latency_p99_ratio:.2f}"
        return text + f" (no interval; {self.latency_note})"

    def _interval(self, c: Comparison) -> str:
        """The interval and rank test, or why there is none."""
        if min(c.n_before, c.n_after) < 2:
            return " (one boot on a side: no interval across boots)"
        floor = min_p_value(c.n_before, c.n_after)
        ci = (
            "no interval (no spread between boots)"
            if math.isnan(c.ci_low)
            else f"{self.confidence:.0%} Welch t interval on log per-boot values "
            f"{c.ci_low:.2f}-{c.ci_high:.2f}"
        )
        return (
            f" ({ci}; exact rank test p={c.p_value:.2g}, the smallest it can give at "
            f"{c.n_before}+{c.n_after} boots is {floor:.2g})"
        )

    @staticmethod
    def _verdict(c: Comparison) -> str:
        """The verdict, with the boots it needs when the floor decided it."""
        if c.needed_runs is not None:
            return f"no verdict (needs {c.needed_runs}+{c.needed_runs} boots)"
        return c.verdict

    def _secondary(self, c: Comparison) -> str:
        """'per-VM mean x1.27 [0.75-2.08] p(Holm)=1'."""
        label = c.metric.split(": ", 1)[1]
        text = f"{label} x{c.ratio:.3f}"
        if not math.isnan(c.ci_low):
            text += f" [{c.ci_low:.2f}-{c.ci_high:.2f}]"
        if not math.isnan(c.p_adjusted):
            text += f" p(Holm)={c.p_adjusted:.2g}"
        if c.needed_runs is None and not math.isnan(c.p_adjusted):
            text += f" {c.verdict}"
        return text

    def disagreement(self) -> str | None:
        """A finding when the per-VM time's mean and median point in opposite directions
        (both per boot: the mean's ratio, the median of boot medians)."""
        if (self.mean.ratio - 1) * self.median_diff_ms >= 0:
            return None
        base_tail, tail = self.tails
        longer, ratio = (self.base, base_tail) if base_tail > tail else (self.state, tail)
        other = tail if longer == self.base else base_tail
        mean = "higher" if self.mean.ratio > 1 else "lower"
        median = "higher" if self.median_diff_ms > 0 else "lower"
        return (
            f"teardown_flush {self.state} vs {self.base}: the mean per-VM time is {mean} but "
            f"the median {median}: the means follow the slow VMs' tail, and {longer}'s "
            f"p90/median is {ratio:.2f} against {other:.2f} (medians over boots)"
        )


def compare_states(
    base: StateSummary, other: StateSummary, thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> StateComparison:
    """`other` against `base`, the boot as the unit (module docstring); Holm comes later,
    over the group (holm_group)."""
    name = f"{other.state} vs {base.state}"
    metrics = [
        compare_units(base.per_boot[key], other.per_boot[key], f"{name}: {label}", thresholds)
        for key, label in METRICS
    ]
    b_each, a_each = base.per_boot["each"], other.per_boot["each"]
    max_ratio = p99_ratio = None
    note = _latency_note(base, other)
    if base.emulated or other.emulated:
        note = "no state ratio (EMULATED host: see the group's note)"
    elif base.latency is not None and other.latency is not None:
        max_ratio = other.latency.max / base.latency.max
        if not (base.coverage.unexplained or other.coverage.unexplained):
            p99_ratio = other.latency.p99 / base.latency.p99
    return StateComparison(
        state=other.state,
        base=base.state,
        boots=(base.boots, other.boots),
        metrics=metrics,
        detectable=min_detectable_ratio(b_each, a_each, thresholds.alpha),
        brief_boots=units_for_ratio(b_each, a_each, BRIEF_RATIO, thresholds.alpha),
        median_diff_ms=other.boot_median_ms - base.boot_median_ms,
        latency_max_ratio=max_ratio,
        latency_p99_ratio=p99_ratio,
        latency_note=note,
        tails=(base.boot_tail, other.boot_tail),
        confidence=thresholds.confidence,
    )


def holm_group(comparisons: list[StateComparison]) -> list[StateComparison]:
    """Holm over every metric of a group's comparisons but the primary one (alle1is vs
    off's ms each, else the first comparison's): compare.compare_all's rule."""
    if not comparisons:
        return comparisons
    primary = next(
        (c for c in comparisons if (c.state, c.base) == PRIMARY), comparisons[0]
    ).metric_name("each")
    flat = compare_all([m for c in comparisons for m in c.metrics], primary)
    out, at = [], 0
    for c in comparisons:
        out.append(replace(c, metrics=flat[at : at + len(c.metrics)]))
        at += len(c.metrics)
    return out


def _latency_note(base: StateSummary, other: StateSummary) -> str:
    """The latency comparison's coverage, or why a part of it is not made."""
    if base.latency is None or other.latency is None:
        return "not compared: a state has no cyclictest sample within its churns"
    a, b = base.coverage.fraction, other.coverage.fraction
    if a is None or b is None:
        return "the periods spanned are not known"
    shares = (
        f"per-period quantiles; samples and the periods they made cyclictest skip account "
        f"for {a:.0%} of {base.state}'s periods and {b:.0%} of {other.state}'s"
    )
    gaps = [s.state for s in (base, other) if s.coverage.unexplained]
    if gaps:
        return (
            f"{shares}: {' and '.join(gaps)} has periods no sample accounts for (lost "
            "lines or a late start), so p99 is not compared; the max is, as a lower bound"
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


def churn_condition(churn: Churn) -> Condition:
    """The condition churns are grouped by: the bundle's, host freshness set aside (the
    churn's first VM leaves every host dirty, and the steady-state VMs come after it;
    states churned in one boot are said so by shared_boots), and the protocol the churn's
    own: VMs per churn (not the run length: a churn's is its budget), whether the VMM held
    an idle VM (it decides whether each VM brings EL2 up and down on every CPU), and
    cyclictest's interval."""
    condition = churn.condition
    interval = str(condition.protocol).partition("@")[2] or "interval unknown"
    vms = f"{churn.repeat} VMs" if churn.repeat else "VMs unknown"
    held = "idle VM held" if churn.hold_vm else "no VM held"
    return replace(condition, freshness="set aside", protocol=f"{vms}, {held}, @{interval}")


def _by_condition(churns: list[Churn]) -> tuple[dict[Condition, dict[str, list[Churn]]], list[str]]:
    """Churns by condition and state; a no-series churn joins every condition of a patched
    kernel it is the unpatched twin of (two series revisions on one base: both), or is
    left out (a line saying why)."""
    grouped: dict[Condition, dict[str, list[Churn]]] = {}
    for c in churns:
        if c.state != NO_SERIES:
            grouped.setdefault(churn_condition(c), {}).setdefault(c.state, []).append(c)
    left_out = []
    for c in churns:
        if c.state != NO_SERIES:
            continue
        home = [
            cond
            for cond in grouped
            if is_twin(str(cond.kernel), c.release)
            and replace(churn_condition(c), kernel=cond.kernel) == cond
        ]
        for cond in home:
            grouped[cond].setdefault(NO_SERIES, []).append(c)
        if home:
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
    comparisons = holm_group([compare_states(states[a], states[b], thresholds) for a, b in pairs])
    notes = [text for c in comparisons if (text := c.disagreement())]
    notes += [s.coverage.line(s.state) for s in states.values()]
    notes += _rollovers(list(states.values()))
    notes += _last_ran(by_state.get(ALTERNATIVE[1], []))
    notes += _held(by_state)
    if any(s.emulated for s in states.values()):
        notes.append(f"rt CPU latency: {EMULATED_LATENCY}")
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


def _idle_note(idle: set[str]) -> str:
    """6.12 nVHE: an exit from a power-down idle state re-runs ___kvm_hyp_init on that CPU,
    a local TLBI ALLE1 (conditions.Condition.guest_idle): last-ran's flush, in any state."""
    if idle <= {"wfi-only"}:
        return "; the guest CPUs idle in WFI only, so no idle exit re-runs the EL2 init"
    if idle == {"not recorded"}:
        return (
            "; the guest CPUs' idle states were not recorded: an exit from a power-down one "
            "re-runs ___kvm_hyp_init (a local TLBI ALLE1, last-ran's flush) in every state"
        )
    return (
        f"; the guest CPUs have power-down idle states ({', '.join(sorted(idle))}): each exit "
        "from one re-runs ___kvm_hyp_init, a local TLBI ALLE1, so off too gets last-ran's "
        "flush whenever a guest CPU idles that deep"
    )


def no_verdict(group: GroupResult) -> str | None:
    """The lead's line when the rule's floor kept every comparison of a group from a
    verdict: the boots there were, the boots it needs, the rank test's smallest p."""
    short = [c for c in group.comparisons if c.each.needed_runs is not None]
    if not short or len(short) < len(group.comparisons):
        return None
    needed = short[0].each.needed_runs
    boots = sorted({f"{c.boots[0]}+{c.boots[1]}" for c in short})
    floors = sorted({min_p_value(*c.boots) for c in short})
    prefix = f"{group.label}: " if group.label else ""
    return (
        f"{prefix}vm-churn: no comparison reaches a verdict with {', '.join(boots)} boots "
        f"(the rule needs {needed}+{needed}; the exact rank test's smallest p here is "
        f"{', '.join(f'{p:.2g}' for p in floors)})"
    )


def _held(by_state: dict[str, list[Churn]]) -> list[str]:
    """What each churn VM did to EL2 here: with no other VM alive, a kernel that does not
    keep virtualisation enabled from module load (6.1: kvm.enable_virt_at_load absent;
    6.12 with it 0) enables it on every CPU at each KVM_CREATE_VM and disables it at each
    destroy (EL2 init and reset, one IPI each to every CPU, the rt CPU included); the
    brief's kernel (enable_virt_at_load=1) keeps it up. The VMM's --hold-vm keeps one idle
    VM open (no vCPU, so no VMID and no teardown flush) so that it stays up."""
    churns = [c for group in by_state.values() for c in group]
    at_load = {str(c.condition.enable_virt_at_load) for c in churns}
    held = {c.hold_vm for c in churns}
    if at_load == {"yes"}:
        return [
            "kvm.enable_virt_at_load=1: EL2 stays initialised with no VM alive, as on the "
            "brief's kernel, so no churn VM brings it up or down"
            + ("; the VMM's idle held VM changes nothing here" if True in held else "")
            + _idle_note({str(c.condition.guest_idle) for c in churns})
        ]
    kernel = "kvm.enable_virt_at_load " + "/".join(sorted(at_load))
    if held == {True}:
        return [
            f"{kernel}: without a VM alive this kernel disables virtualisation, so the VMM "
            "held one idle VM (no vCPU, never run: no VMID, so no teardown flush either) "
            "over each churn; EL2 stayed initialised between VMs, as on the brief's kernel"
        ]
    cost = (
        "every churn VM brought EL2 up and down on every CPU (hardware_enable_all/"
        "disable_all with no other VM alive: EL2 init and reset, two IPIs to the rt CPU "
        "per VM, in every state); the brief's kernel keeps EL2 up"
    )
    if held == {False}:
        return [f"{kernel}: no idle VM was held, so {cost}"]
    return [f"{kernel}: some churns held an idle VM and some did not; where not, {cost}"]


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
    if len(states) > 1 and len({(s.vmid_bits, s.rollovers) for s in states}) == 1:
        said = f"every state {states[0].vmid_bits}-bit VMIDs, about {states[0].rollovers} "
        said += "rollovers per churn"
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
    """One row per state: VMs, per-VM time and phases, ms each (pooled, and per boot), the
    rt CPU's latency and its coverage, the VMID width."""
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
                "vm_median_per_boot_ms": _per_boot(s.per_boot["median"]),
                "create_median_ms": s.create.median,
                "run_median_ms": s.run.median,
                "teardown_median_ms": s.teardown.median,
                "each_ms": s.each_ms,
                "each_ms_per_boot": _per_boot(s.per_boot["each"]),
                "first_vm_ms": _range(s.first_vm_ms),
                "rt_samples": latency.samples if latency else None,
                "rt_periods": coverage.periods,
                "rt_accounted": coverage.accounted,
                "rt_counted": coverage.counted,
                "rt_median_us": latency.median if latency else None,
                "rt_p99_us": latency.p99 if latency else None,
                "rt_max_us": latency.max if latency else None,
                "vmid_bits": s.vmid_bits,
                "rollovers": s.rollovers,
            }
        )
    return pl.DataFrame(rows).with_columns(pl.col(pl.Float64).round(2))


def _per_boot(values: np.ndarray) -> str:
    """'7.89/6.50/12.74': one value per boot, in boot order."""
    return "/".join(f"{v:.2f}" for v in values)


def _range(values: tuple[float, ...]) -> str:
    """'27.7' or '27.7-52.8': one value, or the range over churns."""
    low, high = min(values), max(values)
    return f"{low:.1f}" if low == high else f"{low:.1f}-{high:.1f}"


def comparison_frame(comparisons: list[StateComparison]) -> pl.DataFrame:
    """One row per comparison: ms each's ratio, interval, p and verdict; every other
    metric's ratio and Holm p; the detectable ratio; the latency ratios."""
    rows = []
    for c in comparisons:
        each = c.each
        row: dict[str, object] = {
            "teardown_flush": c.state,
            "vs": c.base,
            "boots": f"{c.boots[0]}+{c.boots[1]}",
            "each_ratio": each.ratio,
            "ci_low": _finite(each.ci_low),
            "ci_high": _finite(each.ci_high),
            "p": _finite(each.p_value),
            "verdict": StateComparison._verdict(each),
            "detectable_ratio": c.detectable,
        }
        for (key, _), metric in list(zip(METRICS, c.metrics, strict=True))[1:]:
            row[f"{key}_ratio"] = metric.ratio
            row[f"{key}_p_holm"] = _finite(metric.p_adjusted)
        row |= {
            "median_diff_ms": c.median_diff_ms,
            "rt_max_ratio": c.latency_max_ratio,
            "rt_p99_ratio": c.latency_p99_ratio,
        }
        rows.append(row)
    return pl.DataFrame(rows).with_columns(pl.col(pl.Float64).round(3))


def _finite(value: float) -> float | None:
    """None for NaN (no interval, no test)."""
    return None if math.isnan(value) else value
