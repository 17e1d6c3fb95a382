"""Stage-2 teardown time versus the requested IPA size (the 7.4-rc1 series in the brief).

Three measures of each VM's teardown, from independent sources:
- the VMM's own clock (`teardown_ns` of its `record=vm` line: closing the vCPU and VM fds,
  which frees the stage 2, and unmapping RAM);
- the trace markers around that same code (`teardown-start`..`teardown-end`): the VMM's
  number plus the cost of writing the two markers, so the two must agree within
  AGREEMENT's tolerance, which the report states;
- the kernel's own stage-2 teardown function, from entry/return kprobes
  (`<function>` and `<function>_ret` in the `tracekit` group, as the collector names them).

The growth per added IPA bit is exp(slope) of a least-squares fit of ln(teardown time) on
the IPA bits, with a percentile bootstrap over VMs (resampled within each IPA size, so
every size stays in each resample). A growth of 2 per bit means proportional to the IPA
space; 1 means independent of it (then teardown follows what is mapped, which the
reproducer keeps the same at every size: the same guest and RAM).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analysis.calls import pair_calls
from tracekit.errors import TracekitError

# Kernel functions on the stage-2 teardown path, preferred first (names differ by version).
TEARDOWN_FUNCTIONS = (
    "kvm_free_stage2_pgd",
    "kvm_pgtable_stage2_destroy",
    "kvm_uninit_stage2_mmu",
    "kvm_arch_destroy_vm",
)
PROBE_HOW = (
    "entry and return kprobes on the kernel's stage-2 teardown function, named "
    "tracekit/<function> and tracekit/<function>_ret (tracekit collect defines them for "
    "kvm_free_stage2_pgd and kvm_arch_destroy_vm)"
)


@dataclass(frozen=True)
class Tolerance:
    """How far the marker span may be from the VMM's own teardown time and still agree."""

    relative: float = 0.10  # of the VMM's value
    absolute_ns: int = 1_000_000  # whichever of the two is larger

    def rule(self) -> str:
        """The rule as one phrase, for the report."""
        return f"within max({self.relative:.0%} of the VMM's value, {self.absolute_ns / 1e6:g} ms)"


AGREEMENT = Tolerance()


@dataclass(frozen=True)
class Growth:
    """Teardown time's growth factor per added IPA bit, with its bootstrap interval."""

    factor: float
    low: float
    high: float
    confidence: float
    vms: int
    sizes: tuple[int, ...]  # the IPA sizes fitted

    def verdict(self, min_effect: float = 1.05) -> str:
        """'ipa-space', 'mapped' or 'inconclusive', by where the interval lies."""
        if self.low > min_effect:
            return "ipa-space"
        if self.low >= 1 / min_effect and self.high <= min_effect:
            return "mapped"
        return "inconclusive"

    def statement(self, min_effect: float = 1.05) -> str:
        """The plain-language conclusion, with the rule that produced it."""
        ci = (
            f"x{self.factor:.3f} per IPA bit ({self.confidence:.0%} CI "
            f"{self.low:.3f}-{self.high:.3f})"
        )
        sizes = ",".join(str(s) for s in self.sizes)
        rule = (
            f"rule: CI above x{min_effect:g} grows; "
            f"CI inside [1/{min_effect:g}, {min_effect:g}] flat"
        )
        verdict = self.verdict(min_effect)
        if verdict == "ipa-space":
            what = "teardown grows with the IPA space"
        elif verdict == "mapped":
            what = (
                f"teardown does not grow materially with the IPA space (under x{min_effect:g}"
                " per bit): it follows what is mapped, the same at every size here"
            )
        else:
            what = "cannot tell whether teardown grows with the IPA space"
        return f"{what}: {ci} over {self.vms} VMs at IPA {sizes} bits ({rule})"


def function_spans(entries: pl.DataFrame, returns: pl.DataFrame) -> pl.DataFrame:
    """A kprobed function's calls that returned: pid, start_ts, end_ts, dur_ns.

    Paired per thread as a call stack (tracekit.analysis.calls); an entry without its
    return (trace ended, event lost) is left out, so `unmatched_entries` must be
    reported by the caller.
    """
    calls, _orphans = pair_calls(entries, returns)
    return calls.filter(pl.col("end_ts").is_not_null()).select(
        "pid", "start_ts", "end_ts", "dur_ns"
    )


def unmatched_entries(entries: pl.DataFrame, spans: pl.DataFrame) -> int:
    """Entries that found no return: the trace ended inside the function, or lost events."""
    return entries.height - spans.height


def spans_in_windows(spans: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """vm_seq, kernel_ns: the function's time inside each VM's teardown markers (summed)."""
    joined = spans.sort("start_ts", maintain_order=True).join_asof(
        windows.select("vm_seq", "vmm_pid", "teardown_start_ts", "teardown_end_ts").sort(
            "teardown_start_ts", maintain_order=True
        ),
        left_on="start_ts",
        right_on="teardown_start_ts",
        by_left="pid",
        by_right="vmm_pid",
        check_sortedness=False,
    )
    inside = joined.filter(pl.col("end_ts") <= pl.col("teardown_end_ts"))
    return inside.group_by("vm_seq").agg(pl.col("dur_ns").sum().alias("kernel_ns"))


def match_vmm(windows: pl.DataFrame, vmm_vms: pl.DataFrame) -> pl.DataFrame:
    """Pair the trace's VMs with the VMM's `vm` records in order; counts must be equal.

    Both list the VMs in the order they were created (the VMM runs them one after
    another); the VM index and IPA size of each pair must also agree, else the two come
    from different runs.
    """
    if windows.height != vmm_vms.height:
        raise TracekitError(
            f"teardown: the trace has {windows.height} VMs (create markers) but the VMM "
            f"output has {vmm_vms.height} `vm` records; give the VMM output of the same run "
            "(and a trace whose buffer held the whole run)"
        )
    pairs = windows.sort("vm_seq").hstack(
        vmm_vms.select(
            pl.col("vm").alias("vmm_vm"),
            pl.col("ipa_bits").alias("vmm_ipa_bits"),
            "teardown_ns",
            "ram_mb",
            "vcpus",
            pl.col("result") if "result" in vmm_vms.columns else pl.lit("ok").alias("result"),
        ).rename({"vcpus": "vmm_vcpus"})
    )
    bad = pairs.filter(
        (pl.col("vm") != pl.col("vmm_vm")) | (pl.col("ipa_bits") != pl.col("vmm_ipa_bits"))
    )
    if not bad.is_empty():
        first = bad.row(0, named=True)
        raise TracekitError(
            f"teardown: trace VM {first['vm_seq']} (vm={first['vm']}, {first['ipa_bits']} "
            f"bits) does not match the VMM's record (vm={first['vmm_vm']}, "
            f"{first['vmm_ipa_bits']} bits); give the VMM output of the same run"
        )
    return pairs.drop("vmm_vm", "vmm_ipa_bits")


def teardown_table(
    windows: pl.DataFrame,
    vmm_vms: pl.DataFrame,
    kernel: pl.DataFrame | None,
    tolerance: Tolerance = AGREEMENT,
) -> pl.DataFrame:
    """Per VM: vm_seq, vm, ipa_bits, ram_mb, vmm_ns, marker_ns, diff_ns, agrees, result,
    kernel_ns.

    `kernel` is `spans_in_windows()` of the teardown function, or None when not probed.
    """
    pairs = match_vmm(windows, vmm_vms)
    allowed = pl.max_horizontal(
        pl.col("teardown_ns").cast(pl.Float64) * tolerance.relative,
        pl.lit(float(tolerance.absolute_ns)),
    )
    diff = pl.col("teardown_marker_ns") - pl.col("teardown_ns")
    table = pairs.select(
        "vm_seq",
        "vm",
        "ipa_bits",
        "ram_mb",
        pl.col("teardown_ns").alias("vmm_ns"),
        pl.col("teardown_marker_ns").alias("marker_ns"),
        diff.alias("diff_ns"),
        (diff.abs().cast(pl.Float64) <= allowed).alias("agrees"),
        "result",
    )
    if kernel is None:
        return table.with_columns(pl.lit(None, pl.Int64).alias("kernel_ns"))
    return table.join(kernel, on="vm_seq", how="left").sort("vm_seq")


def by_ipa_size(table: pl.DataFrame, value: str = "vmm_ns") -> pl.DataFrame:
    """Per IPA size: VMs, median and spread (min, max) of a teardown time, in ms."""
    ms = pl.col(value).cast(pl.Float64) / 1e6
    return (
        table.filter(pl.col(value).is_not_null())
        .group_by("ipa_bits")
        .agg(
            pl.len().cast(pl.Int64).alias("vms"),
            ms.median().alias("median_ms"),
            ms.min().alias("min_ms"),
            ms.max().alias("max_ms"),
        )
        .sort("ipa_bits")
    )


def steady_state(table: pl.DataFrame) -> pl.DataFrame:
    """The VMs after the first of each VMM invocation (`vm` > 0) that ran to power-off.

    The first VM a VMM creates pays one-time costs (first use of /dev/kvm, the guest file
    and the VMM's pages coming in) and in the emulated host tears down 2-4 times slower
    than the rest; it stays in the tables but would dominate a fit over few VMs. A VM
    stopped by a signal (result=stopped, e.g. by the time budget) may not have mapped all
    it would have, so its teardown is no sample of the steady state either.
    """
    return table.filter((pl.col("vm") > 0) & (pl.col("result") == "ok"))


def _slope(bits: np.ndarray, log_t: np.ndarray) -> float:
    """Least-squares slope of ln(time) on IPA bits."""
    centred = bits - bits.mean()
    return float((centred * (log_t - log_t.mean())).sum() / (centred**2).sum())


def growth_per_bit(
    table: pl.DataFrame,
    value: str = "vmm_ns",
    confidence: float = 0.95,
    resamples: int = 4000,
    seed: int = 7,
) -> Growth:
    """The growth factor per IPA bit and its stratified bootstrap interval over VMs."""
    rows = table.filter(pl.col(value).is_not_null() & (pl.col(value) > 0))
    sizes = tuple(sorted(rows["ipa_bits"].unique().to_list()))
    if len(sizes) < 2:
        raise TracekitError(
            f"teardown growth needs VMs of at least two IPA sizes, got {list(sizes)}; run "
            "the VMM with --ipa-bits listing several sizes (e.g. 36,40,44) and --repeat"
        )
    groups = [
        np.log(rows.filter(pl.col("ipa_bits") == s)[value].to_numpy().astype(float)) for s in sizes
    ]
    bits = np.concatenate(
        [np.full(len(g), s, dtype=float) for g, s in zip(groups, sizes, strict=True)]
    )
    slope = _slope(bits, np.concatenate(groups))
    rng = np.random.default_rng(seed)
    boot = np.empty(resamples)
    for i in range(resamples):
        drawn = [g[rng.integers(0, len(g), len(g))] for g in groups]
        boot[i] = _slope(bits, np.concatenate(drawn))
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(boot, [tail, 100 - tail])
    return Growth(
        factor=float(np.exp(slope)),
        low=float(np.exp(low)),
        high=float(np.exp(high)),
        confidence=confidence,
        vms=rows.height,
        sizes=sizes,
    )
