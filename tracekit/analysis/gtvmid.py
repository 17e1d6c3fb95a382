"""The VMID each EL2 invalidation acted on, attributed from the host trace, never read.

QEMU 7.2's plugin API reads no registers, so the ground truth cannot say which VMID an
EL2 `TLBI VMALLE1`/`VMALLS12E1IS`/`IPAS2E1IS` used (the VMID field of VTTBR_EL2 then).
This module, the one owner of that column, infers it from what the host trace knows,
and says how (`vmid_how`), leaving it null where the trace cannot tell:

- an invalidation that no VMID tags (`ALLE1`: every VMID; `ALLE2`, `VAE2`: the EL2
  regime; `IC IALLU`): null, "not VMID-scoped";
- 6.1's `___kvm_hyp_init` `VMALLS12E1`: 0, stated by the source (hyp-init.S loads
  VTTBR_EL2 from the init parameters, which cpu_prepare_hyp_mode sets to 0), not read;
- any other VMID-scoped one in the hyp text: the VM whose vCPU thread was on that CPU
  then (from its `enter` marker, pinned, to its teardown) and the VMID
  kvm_arm_vmid_update had given that VM by then: its last return reading before, else
  its next entry reading after (an entry reads the id before the call: the one in force
  since the previous call; the id changes only inside that call, vmid.c `new_vmid`).
  Two VMs there: null, ambiguous. None there but a VMM window of a run without VMID
  readings: null, saying which VM ran.

Why the VM's id is the VMID the invalidation used (read in 6.1.176): KVM's EL2 TLB
helpers switch to the VM's stage 2 first (hyp/nvhe/tlb.c __tlb_switch_to_guest ->
__load_stage2 -> kvm_get_vttbr), whose VMID field is the VM's kvm_vmid.id masked to the
VMID width (asm/kvm_mmu.h kvm_get_vttbr; 0 while none is allocated); the id is written
only by new_vmid, called only from kvm_arm_vmid_update (arch/arm64/kvm/vmid.c).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import polars as pl

# Scopes (tracekit.ingest.groundtruth.tlbi_scope) whose entries a VMID tags, in EL1&0.
VMID_SCOPES = ("vmid", "vmid-s12", "ipa", "ipa-range", "asid", "va", "va-range")
HYP_INIT = "___kvm_hyp_init"
HYP_INIT_HOW = (
    "0, stated by the source, not read: ___kvm_hyp_init loads VTTBR_EL2 from the init "
    "parameters (0: cpu_prepare_hyp_mode) just before it (6.1 hyp-init.S)"
)
# A VM's vCPU on one CPU: its thread's enter marker to the VM's teardown (traced runs).
SPAN_SCHEMA = {
    "run_id": pl.String,
    "vm_seq": pl.Int64,
    "cpu": pl.Int64,  # -1: the vCPU thread was not pinned
    "start": pl.Int64,
    "end": pl.Int64,
}
# kvm_arm_vmid_update's readings given to VMs: `at` is "entry" (the id before the call)
# or "return" (the id it gave); vmid_id is the 64-bit value (generation above the bits).
READING_SCHEMA = {
    "run_id": pl.String,
    "vm_seq": pl.Int64,
    "ts": pl.Int64,
    "vmid_id": pl.Int64,
    "at": pl.String,
}
# vmid_basis: not-vmid-scoped, source, inferred, ambiguous, no-reading, no-width,
# untraced, no-vm, protected (only `source` and `inferred` give a vmid).
# How far a VMID reading may sit from an invalidation and still be on the wrong side of
# it: the clock fit's bound (tests hold its max residual under 100 us). On 6.1 a VM's
# first __kvm_flush_cpu_context runs with VMID 0 microseconds before the first
# kvm_arm_vmid_update gives it one (arm.c): a reading that changes the id that close
# leaves the row ambiguous rather than given the new id. On 6.12 the update (in
# vcpu_load) comes microseconds before that flush, so it is ambiguous there too.
FIT_MARGIN_NS = 100_000
OUT_COLUMNS = {"vmid": pl.Int64, "vmid_basis": pl.String, "vmid_how": pl.String}


@dataclass(frozen=True)
class VmidInputs:
    """What the host trace gives the attribution: vCPU spans, VMID readings, widths."""

    spans: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=SPAN_SCHEMA))
    readings: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=READING_SCHEMA))
    vmid_bits: dict[str, int] = field(default_factory=dict)  # per traced run


def vcpu_spans(run_id: str, windows: pl.DataFrame, threads: pl.DataFrame) -> pl.DataFrame:
    """SPAN_SCHEMA rows from a trace's VM windows and vCPU threads (analysis.vm)."""
    joined = threads.join(
        windows.select("vm_seq", "teardown_start_ts", "teardown_end_ts"), on="vm_seq"
    )
    end = pl.coalesce("teardown_start_ts", "teardown_end_ts", pl.lit(2**62, pl.Int64))
    return joined.select(
        run_id=pl.lit(run_id),
        vm_seq=pl.col("vm_seq").cast(pl.Int64),
        cpu=pl.col("cpu").fill_null(-1).cast(pl.Int64),
        start=pl.col("enter_ts").cast(pl.Int64),
        end=end.cast(pl.Int64),
    )


def readings(run_id: str, attributed: pl.DataFrame, at: str) -> pl.DataFrame:
    """READING_SCHEMA rows from kvm_arm_vmid_update rows given to VMs (vm.attribute)."""
    mine = attributed.filter(pl.col("vm_seq").is_not_null())
    return mine.select(
        run_id=pl.lit(run_id),
        vm_seq=pl.col("vm_seq").cast(pl.Int64),
        ts=pl.col("ts").cast(pl.Int64),
        vmid_id=pl.col("vmid_id").cast(pl.Int64),
        at=pl.lit(at),
    )


def attribute_vmids(
    rows: pl.DataFrame,
    spans: pl.DataFrame,
    found: pl.DataFrame,
    steps: pl.DataFrame,
    vmid_bits: dict[str, int],
    kvm_mode: str = "nvhe",
    margin_ns: int = FIT_MARGIN_NS,
) -> pl.DataFrame:
    """The EL2 (hyp text) invalidations of `rows` (analysis.groundtruth.invalidations,
    with run_id) with vmid and vmid_how (OUT_COLUMNS): `spans` (SPAN_SCHEMA), `found`
    (READING_SCHEMA), `steps` (the VMM's windows, analysis.groundtruth.STEP_SCHEMA) and
    each traced run's VMID width; `margin_ns`, the clock fit's bound. Pure; null wherever
    the trace cannot tell."""
    hyp = rows.filter(pl.col("where") == "hyp").sort("ts")
    index = _Index(spans, found, steps, vmid_bits, kvm_mode == "protected", margin_ns)
    out = [index.attribute(row) for row in hyp.iter_rows(named=True)]
    values = pl.DataFrame(out, schema=OUT_COLUMNS, orient="row")
    return pl.concat([hyp, values], how="horizontal")


class _Intervals:
    """[start, end] intervals with a payload, found by time (bisect, then back over the
    few that can still reach it: none is longer than the longest)."""

    def __init__(self, rows: list[tuple[int, int, object]]) -> None:
        self.rows = sorted(rows, key=lambda r: r[0])
        self.starts = [r[0] for r in self.rows]
        self.longest = max((r[1] - r[0] for r in self.rows), default=0)

    def holding(self, ts: int) -> list[object]:
        """The payloads of the intervals holding ts, in start order."""
        found = []
        k = bisect.bisect_right(self.starts, ts) - 1
        while k >= 0 and self.rows[k][0] >= ts - self.longest:
            if self.rows[k][1] >= ts:
                found.append(self.rows[k][2])
            k -= 1
        return found[::-1]


class _Index:
    """The spans, readings and VMM windows, indexed once for every row."""

    def __init__(
        self,
        spans: pl.DataFrame,
        found: pl.DataFrame,
        steps: pl.DataFrame,
        vmid_bits: dict[str, int],
        protected: bool = False,
        margin_ns: int = FIT_MARGIN_NS,
    ) -> None:
        self.protected, self.margin = protected, margin_ns
        by_cpu: dict[int, list[tuple[int, int, object]]] = {}
        for run_id, vm_seq, cpu, start, end in spans.select(*SPAN_SCHEMA).iter_rows():
            by_cpu.setdefault(cpu, []).append((start, end, (run_id, vm_seq)))
        self.spans = {cpu: _Intervals(rows) for cpu, rows in by_cpu.items()}
        self.readings: dict[tuple[str, int, str], tuple[list[int], list[int]]] = {}
        for run_id, vm_seq, ts, value, at in found.sort("ts").select(*READING_SCHEMA).iter_rows():
            times, values = self.readings.setdefault((run_id, vm_seq, at), ([], []))
            times.append(ts)
            values.append(value)
        runs: dict[object, list[tuple[int, int, object]]] = {}
        for vm in steps.filter(pl.col("step") == "run").iter_rows(named=True):
            runs.setdefault(vm["run_id"], []).append((vm["start"], vm["end"], vm))
        self.windows = {run_id: _Intervals(rows) for run_id, rows in runs.items()}
        self.bits = vmid_bits

    def attribute(self, row: dict[str, object]) -> tuple[int | None, str, str]:
        """(vmid, basis, how) of one hyp-text invalidation."""
        scoped = row.get("scope") in VMID_SCOPES and row.get("regime") == "EL1&0"
        if not scoped:
            what = f"{row.get('scope')}, {row.get('regime') or 'not a TLB'}"
            return None, "not-vmid-scoped", f"not VMID-scoped ({what})"
        if row.get("function") == HYP_INIT:
            return 0, "source", HYP_INIT_HOW
        if self.protected:
            # pKVM's EL2 also maintains the host's own stage 2 (VMID 0) while a vCPU's
            # first KVM_RUN shares pages with it (kvm_share_hyp): which VM's vCPU is on
            # the CPU says nothing about the VMID there.
            return (
                None,
                "protected",
                "not attributed in protected mode (EL2 also maintains the host's stage 2, VMID 0)",
            )
        ts, cpu = int(row["ts"]), row["cpu"]
        here = [
            found for key in (cpu, -1) if key in self.spans for found in self.spans[key].holding(ts)
        ]
        if len(here) > 1:
            vms = ", ".join(f"{r} VM {v}" for r, v in here)
            return None, "ambiguous", f"several VMs' vCPUs were on CPU {cpu} then ({vms})"
        if here:
            run_id, vm_seq = here[0]
            return self.in_force(run_id, vm_seq, ts, cpu)
        return self.untraced(row.get("run_id"), ts)

    def in_force(
        self, run_id: str, vm_seq: int, ts: int, cpu: object
    ) -> tuple[int | None, str, str]:
        """The VMID the VM had at ts: its last return reading before, else next entry after."""
        where = f"VM {vm_seq} of {run_id} had its vCPU thread on CPU {cpu} then"
        returns = self.readings.get((run_id, vm_seq, "return"), ([], []))
        entries = self.readings.get((run_id, vm_seq, "entry"), ([], []))
        before = bisect.bisect_right(returns[0], ts)
        after = bisect.bisect_left(entries[0], ts)
        near = self.changes_near(returns, entries, ts, self.bits.get(run_id))
        if near is not None:
            return (
                None,
                "ambiguous",
                f"{where}, but its id changed to {near} within the clock fit's bound of it",
            )
        if before:
            value, how = returns[1][before - 1], "returned before it"
        elif after < len(entries[0]):
            value, how = entries[1][after], "read at its next entry (the id before that call)"
        else:
            return None, "no-reading", f"{where}, but no kvm_arm_vmid_update reading brackets it"
        bits = self.bits.get(run_id)
        if bits is None:
            return None, "no-width", f"{where}; its id {value} is known, the VMID width is not"
        zero = ": not yet allocated, VTTBR_EL2's VMID field 0" if value == 0 else ""
        return value % (1 << bits), "inferred", f"{where}; kvm_arm_vmid_update {how} {value}{zero}"

    def changes_near(
        self,
        returns: tuple[list[int], list[int]],
        entries: tuple[list[int], list[int]],
        ts: int,
        bits: int | None,
    ) -> int | None:
        """A return reading within the margin of ts that changed the VM's VMID (the id
        the clock error leaves on either side of the row), or None. A rollover that keeps
        the VM's VMID and changes only the generation (vmid.c new_vmid) changes nothing."""
        times, values = returns
        lo = bisect.bisect_left(times, ts - self.margin)
        hi = bisect.bisect_right(times, ts + self.margin)
        mask = (1 << bits) - 1 if bits is not None else -1
        for k in range(lo, hi):
            previous = values[k - 1] if k else _entry_before(entries, times[k])
            if previous is None or (previous & mask) != (values[k] & mask):
                return values[k]
        return None

    def untraced(self, run_id: object, ts: int) -> tuple[None, str, str]:
        """Why no VM is known for a hyp invalidation no traced vCPU span holds."""
        keys = [run_id] if run_id is not None else list(self.windows)
        held = [vm for key in keys if key in self.windows for vm in self.windows[key].holding(ts)]
        if held:
            vm = held[0]
            return (
                None,
                "untraced",
                (
                    f"VM {vm['vm']} of {vm['run_id']} was running (the VMM's window), but the run "
                    "has no VMM markers or kvm_arm_vmid_update readings (not a traced run)"
                ),
            )
        return None, "no-vm", "no VM's vCPU was on that CPU then (no VMM window holds it)"


COUNT_KEYS = ("run_id", "function", "operation", "vmid", "vmid_basis")


def vmid_counts(attributed: pl.DataFrame) -> pl.DataFrame:
    """EL2 invalidations per run, function, operation, VMID and basis, for the report."""
    keys = [k for k in COUNT_KEYS if k in attributed.columns]
    return attributed.group_by(keys).agg(pl.len().alias("count")).sort(keys, nulls_last=True)


def _entry_before(entries: tuple[list[int], list[int]], ts: int) -> int | None:
    """The id the last entry reading at or before ts saw (the one before that call)."""
    k = bisect.bisect_right(entries[0], ts) - 1
    return entries[1][k] if k >= 0 else None
