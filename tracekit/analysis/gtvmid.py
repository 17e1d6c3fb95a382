"""The VMID each EL2 invalidation acted on, attributed from the host trace, never read.

QEMU 7.2's plugin API reads no registers, so the ground truth cannot say which VMID an
EL2 `TLBI VMALLE1`/`VMALLS12E1IS`/`IPAS2E1IS` used (the VMID field of VTTBR_EL2 then).
This module, the one owner of that column, infers it from what the host trace knows,
and says how (`vmid_how`), leaving it null where the trace cannot tell:

- an invalidation that no VMID tags (`ALLE1`: every VMID; `ALLE2`, `VAE2`: the EL2
  regime; `IC IALLU`): null, "not VMID-scoped";
- 6.1's `___kvm_hyp_init` `VMALLS12E1`: 0, stated by the source (hyp-init.S loads
  VTTBR_EL2 from the init parameters, which cpu_prepare_hyp_mode sets to 0), not read;
- any other VMID-scoped one in the hyp text (in VHE: in KVM's TLB helpers, kernel text
  at EL2): the VM whose vCPU thread was on that CPU
  then (from its `enter` marker, pinned, to its teardown) and the VMID
  kvm_arm_vmid_update had given that VM by then: what the readings on both sides of it, as
  far as the clock fit's bound reaches, agree on (an entry reads the id before the call,
  a return the id it gave; the id changes only inside that call, vmid.c `new_vmid`, and
  only to a newer generation, so two equal readings hold it between them); an id still
  0 is, in nVHE, the host's own tag. Readings that differ there (a call that changed
  it, or the row between a call's entry and return): null, ambiguous. Two VMs there:
  null, ambiguous. None there but a traced VM's window: in nVHE with that VM alone
  alive its id (`only-vm`: the host has no stage 2), else null (`other-cpu`); a VMM
  window of a run without markers or trace: null, saying what the run lacks;
- the debug series' `__kvm_debug_maint` operation of an after-guest request for a VMID
  (the run's maintenance log): the VMID asked for (`requested`), not read.

Why the VM's id is the VMID the invalidation used (read in 6.1.176): KVM's EL2 TLB
helpers switch to the VM's stage 2 first (hyp/nvhe/tlb.c __tlb_switch_to_guest ->
__load_stage2 -> kvm_get_vttbr), whose VMID field is the VM's kvm_vmid.id masked to the
VMID width (asm/kvm_mmu.h kvm_get_vttbr; 0 while none is allocated); the id is written
only by new_vmid, called only from kvm_arm_vmid_update (arch/arm64/kvm/vmid.c).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import polars as pl

from tracekit.ingest.gtalign import VHE_KVM_TLB, ClockFit

# Scopes (tracekit.ingest.groundtruth.tlbi_scope) whose entries a VMID tags, in EL1&0.
VMID_SCOPES = ("vmid", "vmid-s12", "ipa", "ipa-range", "asid", "va", "va-range")
HYP_INIT = "___kvm_hyp_init"
HYP_INIT_HOW = (
    "0, stated by the source, not read: ___kvm_hyp_init loads VTTBR_EL2 from the init "
    "parameters (0: cpu_prepare_hyp_mode) just before it (6.1 hyp-init.S), with stage 2 "
    "off (HCR_HOST_NVHE_FLAGS): VMID 0 is the host's own tag, so it invalidated the "
    "host's EL1&0 stage-1 entries on that CPU, nothing of any VM's (run on every online "
    "CPU at each first VM's creation)"
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
# vmid_basis -> what it means (the report's legend); only `source`, `inferred`,
# `only-vm` and `requested` give a vmid.
BASES = {
    "inferred": (
        "the VM whose vCPU thread was on that CPU, and the id it had then: the one "
        "kvm_arm_vmid_update had given it, or 0 before any (VMID 0, in nVHE the host's own "
        "tag: such a row invalidated the host's entries, not the VM's)"
    ),
    "only-vm": (
        "nVHE, no vCPU of it on that CPU: the only VM alive, whose stage 2 any VMID-scoped "
        "KVM TLBI targets (the host has none), and its id then"
    ),
    "requested": "the VMID the user asked the after-guest action to invalidate (its log)",
    "unrequested": "a debug-series operation no logged request names: its own VTTBR, no VM's",
    "source": "stated by the kernel source",
    "not-vmid-scoped": "no VMID tags what it invalidates",
    "ambiguous": "two VMs there, or the VM's id changed within reach of the row",
    "other-cpu": (
        "VMs ran, none with its vCPU on that CPU (and not one alone in nVHE): issued by "
        "another thread"
    ),
    "untraced": "a VMM window of a run without a trace",
    "no-markers": "a traced run whose VMM wrote no markers (a rollover's throwaway VMs)",
    "no-reading": "the VM's kvm_arm_vmid_update readings do not bracket the row",
    "no-width": "the VMID width is not known",
    "no-vm": "no VM was running",
    "protected": "not attributed in protected mode",
    "clock-error": "the clock fit's bound is over the ceiling",
}
# How far a VMID reading may sit from an invalidation and still be on the wrong side of
# it: the run's clock bound (gtalign.ClockFit.bound_ns: the fit's largest error from a
# marker's midpoint plus half the widest tight bracket; a row's ts is fitted, a
# reading's is the trace's own), which must stay under this ceiling, the bound
# for the fit; over it no row is attributed by time. On 6.1 a VM's first
# __kvm_flush_cpu_context runs with VMID 0 shortly before the first kvm_arm_vmid_update
# gives it one (arm.c, in the run loop); on 6.12 the update comes just before that flush
# (kvm_arch_vcpu_load, arm.c:597 then :609 in 6.12.107): a reading that changed the id
# within the bound of the row leaves it ambiguous rather than given either id.
MARGIN_CEILING_NS = 100_000
# An after-guest action's EL2 maintenance request for a VMID (the debug series'
# interface: tracekit.ingest.maint), on the trace clock: [start, end] brackets the write.
REQUEST_SCHEMA = {
    "run_id": pl.String,
    "operation": pl.String,  # e.g. TLBI VMALLS12E1IS
    "cpu": pl.Int64,
    "vmid": pl.Int64,
    "start": pl.Int64,
    "end": pl.Int64,
}
# The debug series' hypercall: the one function whose VMID a request sets
# (reproducer/kpatch/6.1 0002 debug_maint_run: VTTBR_EL2 = vmid << VTTBR_VMID_SHIFT | an
# empty stage 2; 0001 __kvm_debug_maint writes it before the operation).
DEBUG_MAINT = "__kvm_debug_maint"
UNREQUESTED_HOW = (
    "the debug series' operation, but no request in the run's el2-maint.txt names it "
    "(a manual one?): the series loads that request's VTTBR_EL2 (kpatch 0002 "
    "debug_maint_run), no VM's, so no VM's VMID"
)
OUT_COLUMNS = {"vmid": pl.Int64, "vmid_basis": pl.String, "vmid_how": pl.String}


@dataclass(frozen=True)
class VmidInputs:
    """What the host trace gives the attribution: vCPU spans, VMID readings, widths."""

    spans: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=SPAN_SCHEMA))
    readings: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=READING_SCHEMA))
    vmid_bits: dict[str, int] = field(default_factory=dict)  # per traced run
    # The bundle's clock bound (ns, ClockFit.bound_ns): how far a row's fitted ts may be
    # from the truth.
    margin_ns: float = MARGIN_CEILING_NS
    # Runs with a trace whose VMM wrote no markers (a rollover's throwaway VMs).
    unmarked: frozenset[str] = frozenset()
    # The after-guest actions' VMID-scoped EL2 maintenance requests (REQUEST_SCHEMA).
    requests: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=REQUEST_SCHEMA))


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


def requests(run_id: str, maint: pl.DataFrame) -> pl.DataFrame:
    """REQUEST_SCHEMA rows of a run's maintenance log (tracekit.ingest.maint's table):
    its VMID-scoped requests, the operation named as the ground truth names it."""
    scoped = maint.filter(pl.col("vmid").is_not_null())
    return scoped.select(
        run_id=pl.lit(run_id),
        operation=pl.concat_str(pl.lit("TLBI "), pl.col("op").str.to_uppercase()),
        cpu=pl.col("cpu"),
        vmid=pl.col("vmid"),
        start=pl.col("issued"),
        end=pl.col("done"),
    )


def attribute_vmids(
    rows: pl.DataFrame,
    spans: pl.DataFrame,
    found: pl.DataFrame,
    steps: pl.DataFrame,
    vmid_bits: dict[str, int],
    kvm_mode: str = "nvhe",
    margin_ns: float = MARGIN_CEILING_NS,
    unmarked: frozenset[str] = frozenset(),
    asked: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """KVM's EL2 invalidations of `rows` (kvm_el2; analysis.groundtruth.invalidations,
    with run_id) with vmid and vmid_how (OUT_COLUMNS): `spans` (SPAN_SCHEMA), `found`
    (READING_SCHEMA), `steps` (the VMM's windows, analysis.groundtruth.STEP_SCHEMA) and
    each traced run's VMID width; `margin_ns`, the clock fit's error (over
    MARGIN_CEILING_NS nothing is attributed by time); `unmarked`, the runs traced
    without VMM markers; `asked`, the after-guest actions' VMID requests (REQUEST_SCHEMA).
    Pure; null wherever the trace cannot tell."""
    hyp = rows.filter(kvm_el2(kvm_mode)).sort("ts")
    clock = _Clock(margin_ns, unmarked)
    index = _Index(spans, found, steps, vmid_bits, kvm_mode, clock, asked)
    out = [index.attribute(row) for row in hyp.iter_rows(named=True)]
    values = pl.DataFrame(out, schema=OUT_COLUMNS, orient="row")
    return pl.concat([hyp, values], how="horizontal")


def kvm_el2(kvm_mode: str) -> pl.Expr:
    """KVM's own invalidations at EL2: the hyp text, and in VHE KVM's TLB helpers in the
    kernel (gtalign.VHE_KVM_TLB: all but the rollover's flush clear TGE and load the
    guest's VTTBR, so their EL1-form TLBIs act on the VM's EL1&0, hyp/vhe/tlb.c)."""
    el2 = pl.col("where") == "hyp"
    if kvm_mode == "vhe":
        helper = pl.col("function").is_in(VHE_KVM_TLB)
        el2 = el2 | ((pl.col("where") == "kernel") & helper)
    return el2


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


@dataclass(frozen=True)
class _Clock:
    """What the attribution knows of the bundle's clock and traces beyond the rows."""

    margin_ns: float = MARGIN_CEILING_NS
    unmarked: frozenset[str] = frozenset()

    def too_wide(self) -> str | None:
        """Why no row can be placed against the readings, or None."""
        if self.margin_ns <= MARGIN_CEILING_NS:
            return None
        return (
            f"the clock fit's bound ({self.margin_ns / 1000:.1f} us) is over the "
            f"{MARGIN_CEILING_NS // 1000} us bound: which side of a VMID change a row ran "
            "on is not known"
        )


class _Index:
    """The spans, readings and VMM windows, indexed once for every row."""

    def __init__(
        self,
        spans: pl.DataFrame,
        found: pl.DataFrame,
        steps: pl.DataFrame,
        vmid_bits: dict[str, int],
        kvm_mode: str = "nvhe",
        clock: _Clock | None = None,
        asked: pl.DataFrame | None = None,
    ) -> None:
        self.protected, self.clock = kvm_mode == "protected", clock or _Clock()
        self.asked = list(
            (asked if asked is not None else VmidInputs().requests).iter_rows(named=True)
        )
        self.margin = self.clock.margin_ns
        by_cpu: dict[int, list[tuple[int, int, object]]] = {}
        for run_id, vm_seq, cpu, start, end in spans.select(*SPAN_SCHEMA).iter_rows():
            by_cpu.setdefault(cpu, []).append((start, end, (run_id, vm_seq)))
        self.spans = {cpu: _Intervals(rows) for cpu, rows in by_cpu.items()}
        # Per VM, its readings in time order, entries and returns together.
        self.readings: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
        ordered = found.sort("ts", pl.col("at") == "return").select(*READING_SCHEMA)
        for run_id, vm_seq, ts, value, at in ordered.iter_rows():
            self.readings.setdefault((run_id, vm_seq), []).append((ts, value, at))
        runs: dict[object, list[tuple[int, int, object]]] = {}
        for vm in steps.filter(pl.col("step") == "run").iter_rows(named=True):
            runs.setdefault(vm["run_id"], []).append((vm["start"], vm["end"], vm))
        self.windows = {run_id: _Intervals(rows) for run_id, rows in runs.items()}
        self.bits = vmid_bits
        # The CPUs each traced VM's vCPU threads were pinned to, and the traced runs.
        self.vm_cpus: dict[tuple[str, int], list[int]] = {}
        for run_id, vm_seq, cpu in spans.select("run_id", "vm_seq", "cpu").iter_rows():
            self.vm_cpus.setdefault((run_id, vm_seq), []).append(cpu)
        self.traced = {key[0] for key in (*self.vm_cpus, *self.readings)}
        # nVHE, not protected: the host runs with no stage 2 (VTTBR_EL2 0, 6.1.176
        # arch/arm64/kvm/hyp/include/nvhe/mem_protect.h:66-72 __load_host_stage2), so a
        # VMID-scoped KVM EL2 TLBI targets a VM's stage 2: with one VM alive, that VM's.
        self.host_untagged = kvm_mode == "nvhe"

    def attribute(self, row: dict[str, object]) -> tuple[int | None, str, str]:
        """(vmid, basis, how) of one hyp-text invalidation."""
        scoped = row.get("scope") in VMID_SCOPES and row.get("regime") == "EL1&0"
        if not scoped:
            what = f"{row.get('scope')}, {row.get('regime') or 'not a TLB'}"
            return None, "not-vmid-scoped", f"not VMID-scoped ({what})"
        if row.get("function") == HYP_INIT:
            return 0, "source", HYP_INIT_HOW
        if (wide := self.clock.too_wide()) is not None:
            return None, "clock-error", wide
        if (asked := self.requested(row)) is not None:
            return asked
        if row.get("function") == DEBUG_MAINT:
            # The series loads the request's own VTTBR_EL2, never a VM's: a live VM's
            # VMID (inferred, only-vm) would be wrong for it (review 15b B5).
            return None, "unrequested", UNREQUESTED_HOW
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
        return self.untraced(row.get("run_id"), ts, cpu)

    def requested(self, row: dict[str, object]) -> tuple[int, str, str] | None:
        """The VMID an after-guest request asked for, if the row is that request's own
        operation from the debug hypercall on its CPU within its window (and the margin)."""
        if row.get("function") != DEBUG_MAINT:
            return None
        ts = int(row["ts"])  # type: ignore[call-overload]
        for asked in self.asked:
            inside = asked["start"] - self.margin <= ts <= asked["end"] + self.margin
            mine = (row.get("run_id"), row.get("cpu"), row.get("operation")) == (
                asked["run_id"],
                asked["cpu"],
                asked["operation"],
            )
            if inside and mine:
                return (
                    asked["vmid"],
                    "requested",
                    f"the VMID {asked['vmid']} the after-guest action asked the debug series "
                    f"to invalidate ({asked['operation']} on CPU {asked['cpu']}, its "
                    "el2-maint.txt): loaded into VTTBR_EL2 by the series (kpatch 0002 "
                    "debug_maint_run), not read",
                )
        return None

    def in_force(
        self, run_id: str, vm_seq: int, ts: int, cpu: object, basis: str = "inferred"
    ) -> tuple[int | None, str, str]:
        """The VMID the VM had at ts: what its readings within the clock error of ts and
        the nearest one on each side beyond it agree on (VmidView)."""
        where = f"VM {vm_seq} of {run_id} had its vCPU thread on CPU {cpu} then"
        if basis == "only-vm":
            where = (
                f"VM {vm_seq} of {run_id} was the only VM alive (its vCPU on CPU "
                f"{self.cpus_of(run_id, vm_seq)}, not {cpu}; nVHE: the host has no stage 2)"
            )
        bits = self.bits.get(run_id)
        view = VmidView(self.readings.get((run_id, vm_seq), []), ts, self.margin, bits)
        if (missing := view.missing()) is not None:
            return None, "no-reading", f"{where}, but {missing}"
        if (change := view.change()) is not None:
            return None, "ambiguous", f"{where}, but {change}"
        value = view.value()
        if bits is None:
            return None, "no-width", f"{where}; its id {value} is known, the VMID width is not"
        zero = self.vmid_zero(cpu) if value == 0 else ""
        return value % (1 << bits), basis, f"{where}; {view.how()} {value}{zero}"

    def vmid_zero(self, cpu: object) -> str:
        """What VMID 0 was when a VM's id was still 0 (6.1's first-load flush)."""
        said = (
            ": none allocated yet (vmid.c reserves 0, never given to a VM), so VTTBR_EL2's "
            "VMID field was 0"
        )
        if self.host_untagged:
            return (
                f"{said}, in nVHE (not protected) the host's own tag (the host runs with "
                "VTTBR_EL2 0: 6.1.176 hyp/include/nvhe/mem_protect.h:66-72 "
                f"__load_host_stage2): it invalidated the host's EL1&0 entries on CPU {cpu}, "
                "nothing of the VM's"
            )
        return f"{said}, no VM's (in VHE the host runs in EL2&0, untagged by VMIDs)"

    def cpus_of(self, run_id: str, vm_seq: int) -> str:
        """The CPUs a traced VM's vCPU threads were on, in words."""
        cpus = sorted(self.vm_cpus.get((run_id, vm_seq), []))
        return "/".join("unpinned" if c < 0 else str(c) for c in cpus) or "unknown"

    def other_cpu(
        self, held: list[dict[str, object]], ts: int, cpu: object
    ) -> tuple[int | None, str, str]:
        """A traced VM ran but no vCPU span holds the row's CPU: issued by another thread
        (an MMU notifier's __kvm_tlb_flush_vmid_ipa); the only live VM's VMID in nVHE."""
        # "The only VM alive" counts every run's VMs, not only the row's run's; alive is
        # running here (a VMM `run` window): one-VM-at-a-time, a VM's create and teardown
        # never overlap another's run (review 15b B6).
        alive = {
            (vm["run_id"], vm["vm"]) for w in self.windows.values() for vm in w.holding(ts)
        } | {(vm["run_id"], vm["vm"]) for vm in held}
        if len(alive) == 1 and self.host_untagged:
            run_id, vm_seq = alive.pop()
            return self.in_force(str(run_id), int(vm_seq), ts, cpu, basis="only-vm")
        vms = ", ".join(
            f"VM {v} of {r} (vCPU on CPU {self.cpus_of(r, v)})" for r, v in sorted(alive)
        )
        return None, "other-cpu", f"{vms} running, not on CPU {cpu}: issued by another thread"

    def untraced(self, run_id: object, ts: int, cpu: object = None) -> tuple[None, str, str]:
        """Why no VM is known for a hyp invalidation no traced vCPU span holds."""
        keys = [run_id] if run_id is not None else list(self.windows)
        held = [vm for key in keys if key in self.windows for vm in self.windows[key].holding(ts)]
        if held and held[0]["run_id"] in self.clock.unmarked:
            vm = held[0]
            return (
                None,
                "no-markers",
                (
                    f"VM {vm['vm']} of {vm['run_id']} was running (the VMM's window), but its "
                    "VMM wrote no markers to the run's trace: which kvm_arm_vmid_update "
                    "readings are its is not known (its vCPU ran on the guest CPUs, which "
                    "the collector pins the action's VMM to)"
                ),
            )
        if held and held[0]["run_id"] in self.traced:
            return self.other_cpu(held, ts, cpu)
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


def basis_legend(bases: Iterable[str]) -> str:
    """What each of these vmid_basis values means, in BASES' order (a table's legend)."""
    shown = set(bases)
    return "vmid_basis: " + "; ".join(f"{k}: {v}" for k, v in BASES.items() if k in shown)


def margin_line(fit: ClockFit | None) -> str:
    """How near a VMID change a row may be and still be attributed, in words (the
    report's sentence; `fit`: the bundle's clock fit, None without ground truth)."""
    ceiling = MARGIN_CEILING_NS / 1000
    if fit is None or fit.bound_ns > MARGIN_CEILING_NS:
        found = f"({fit.bound_ns / 1000:.1f} us) " if fit is not None else ""
        return (
            f"EL2 invalidations' VMIDs NOT attributed by time: the clock fit's bound "
            f"{found}is over the {ceiling:.0f} us ceiling"
        )
    return (
        f"EL2 invalidations' VMIDs attributed by time within the clock fit's bound, "
        f"{fit.bound_ns / 1000:.1f} us (its largest error from a marker's midpoint, "
        f"{fit.error_ns / 1000:.1f} us, plus half the widest tight marker bracket, "
        f"{fit.half_bracket_ns / 1000:.1f} us; ceiling {ceiling:.0f} us): a VM whose "
        "kvm_arm_vmid_update readings differ within that of a row, or between the row "
        "and its nearest reading beyond that on either side, leaves the row ambiguous"
    )


COUNT_KEYS = ("run_id", "function", "operation", "vmid", "vmid_basis")


def vmid_counts(attributed: pl.DataFrame) -> pl.DataFrame:
    """EL2 invalidations per run, function, operation, VMID and basis, for the report."""
    keys = [k for k in COUNT_KEYS if k in attributed.columns]
    return attributed.group_by(keys).agg(pl.len().alias("count")).sort(keys, nulls_last=True)


class VmidView:
    """One VM's kvm_arm_vmid_update readings seen from one row: those within `margin`
    of ts and the nearest beyond it on each side, in time order."""

    def __init__(
        self, readings: list[tuple[int, int, str]], ts: int, margin: float, bits: int | None
    ) -> None:
        times = [r[0] for r in readings]
        lo = bisect.bisect_left(times, ts - margin)
        hi = bisect.bisect_right(times, ts + margin)
        self.near = readings[max(lo - 1, 0) : hi + 1]  # (ts, vmid_id, at)
        self.before = lo > 0  # a reading beyond the margin before ts is the first of near
        self.after = hi < len(readings)  # one beyond it after ts is the last
        self.ts = ts
        self.mask = (1 << bits) - 1 if bits is not None else -1  # -1: the whole id

    def missing(self) -> str | None:
        """Why the readings cannot bracket ts on one side, or None."""
        if not self.near:
            return "no kvm_arm_vmid_update reading of it was recorded"
        if not self.before and self.near[0][2] == "return":
            # A return with no entry before it: the call may have changed the id.
            return "the first kvm_arm_vmid_update reading near it is a return with no entry"
        if not self.after and self.near[-1][2] == "entry":
            return "its last kvm_arm_vmid_update reading is an entry with no return after it"
        return None

    def change(self) -> str | None:
        """The id change the readings show within reach of ts, or None (G1: a rollover
        that keeps the VM's VMID changes only the generation, which is no change)."""
        for (t0, v0, a0), (t1, v1, a1) in itertools.pairwise(self.near):
            if v0 & self.mask != v1 & self.mask:
                inside = (
                    " (the row may be inside that call)" if (a0, a1) == ("entry", "return") else ""
                )
                return (
                    f"its id changed from {v0} ({a0} at {_rel(t0, self.ts)}) to {v1} "
                    f"({a1} at {_rel(t1, self.ts)}), within the clock fit's bound of it or "
                    f"between it and the nearest reading beyond that{inside}"
                )
        return None

    def value(self) -> int:
        """The id the readings agree on (after change() found none)."""
        return self.near[0][1]

    def how(self) -> str:
        """Which readings gave the id, in words."""
        first, last = self.near[0], self.near[-1]
        if len(self.near) == 1 and first[0] <= self.ts:
            return "kvm_arm_vmid_update returned before it"
        if len(self.near) == 1:
            return "kvm_arm_vmid_update read at its next entry (the id before that call)"
        return (
            f"kvm_arm_vmid_update's readings from {_rel(first[0], self.ts)} ({first[2]}) to "
            f"{_rel(last[0], self.ts)} ({last[2]}) agree:"
        )


def _rel(at: int, ts: int) -> str:
    """A reading's time relative to the row, in us."""
    return f"{(at - ts) / 1000:+.1f} us"
