"""The VMID of each EL2 invalidation, attributed from the host trace (never read).

Rows are generated here in the shape analysis.groundtruth.invalidations gives (the
fixture boot's hyp functions and operations); spans and readings in the shapes
gtvmid.vcpu_spans and gtvmid.readings give from a traced run's markers and probe.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis import gtvmid
from tracekit.ingest.gtalign import TIGHT_BRACKET_NS

ROW_SCHEMA = {
    "run_id": pl.String,
    "ts": pl.Int64,
    "cpu": pl.Int64,
    "operation": pl.String,
    "function": pl.String,
    "where": pl.String,
    "scope": pl.String,
    "regime": pl.String,
}
FLUSH = ("TLBI VMALLE1", "__kvm_flush_cpu_context", "hyp", "vmid", "EL1&0")


def _rows(*rows: tuple) -> pl.DataFrame:
    """Invalidation rows: (run_id, ts, cpu, operation, function, where, scope, regime)."""
    return pl.DataFrame(list(rows), schema=ROW_SCHEMA, orient="row")


def _spans(*spans: tuple) -> pl.DataFrame:
    """vCPU spans: (run_id, vm_seq, cpu, start, end)."""
    return pl.DataFrame(list(spans), schema=gtvmid.SPAN_SCHEMA, orient="row")


def _readings(*found: tuple) -> pl.DataFrame:
    """kvm_arm_vmid_update readings: (run_id, vm_seq, ts, vmid_id, at)."""
    return pl.DataFrame(list(found), schema=gtvmid.READING_SCHEMA, orient="row")


STEPS = pl.DataFrame(
    [("quiet", 0, "run", 5_000, 6_000, 1, "4k")],
    schema={
        "run_id": pl.String,
        "vm": pl.Int64,
        "step": pl.String,
        "start": pl.Int64,
        "end": pl.Int64,
        "vcpus": pl.Int64,
        "backing": pl.String,
    },
    orient="row",
)


def _attributed(
    rows: pl.DataFrame,
    spans: pl.DataFrame,
    found: pl.DataFrame,
    kvm_mode: str = "nvhe",
    margin_ns: float = 0,
) -> pl.DataFrame:
    """attribute_vmids on one run "guest" with 8-bit VMIDs and STEPS' windows."""
    return gtvmid.attribute_vmids(rows, spans, found, STEPS, {"guest": 8}, kvm_mode, margin_ns)


def _attribute(rows: pl.DataFrame, spans: pl.DataFrame, found: pl.DataFrame) -> list[tuple]:
    """(ts, vmid, basis) per hyp row, in time order."""
    return _attributed(rows, spans, found).select("ts", "vmid", "vmid_basis").rows()


def test_unscoped_and_hyp_init_need_no_trace() -> None:
    """ALLE2, ALLE1 and IC IALLU carry no VMID; 6.1's init VMALLS12E1 is 0 by the source;
    host-kernel rows are not EL2 invalidations and are left out."""
    rows = _rows(
        ("guest", 10, 0, "TLBI ALLE2", "___kvm_hyp_init", "hyp", "all-el2", "EL2"),
        ("guest", 11, 0, "TLBI VMALLS12E1", "___kvm_hyp_init", "hyp", "vmid-s12", "EL1&0"),
        ("guest", 12, 0, "TLBI ALLE1IS", "__kvm_flush_vm_context", "hyp", "all-vmids", "EL1&0"),
        ("guest", 13, 1, "IC IALLU", "__kvm_flush_cpu_context", "hyp", "icache", None),
        ("guest", 14, 1, "TLBI VAE1IS", "flush_tlb_mm", "kernel", "va", "EL1&0"),
    )
    found = _attribute(rows, _spans(), _readings())
    assert found == [
        (10, None, "not-vmid-scoped"),
        (11, 0, "source"),
        (12, None, "not-vmid-scoped"),
        (13, None, "not-vmid-scoped"),
    ]


def test_vmid_from_the_vm_on_that_cpu_and_its_readings() -> None:
    """The VM whose vCPU thread was on the CPU gives the VMID: its last return reading
    before, its next entry reading after, or both where they agree (low 8 bits of the
    64-bit id; the generation above them is not the VMID); none bracketing it: null."""
    spans = _spans(("guest", 0, 1, 100, 200), ("guest", 1, 1, 300, 400), ("guest", 2, 2, 500, 600))
    found = _readings(
        ("guest", 0, 150, 256 + 5, "return"),  # generation 1, VMID 5
        ("guest", 1, 350, 256 + 6, "entry"),  # the id VM 1 had before this call: in force
        ("guest", 1, 330, 256 + 6, "entry"),  # the one before the flush agrees
    )
    rows = _rows(
        ("guest", 160, 1, *FLUSH),  # after VM 0's return reading
        ("guest", 340, 1, *FLUSH),  # before VM 1's next entry
        ("guest", 550, 2, *FLUSH),  # VM 2: no reading at all
        ("guest", 550, 3, *FLUSH),  # no VM on CPU 3; outside every VMM window
        ("quiet", 5_500, 3, *FLUSH),  # inside the untraced run's VMM window
        ("guest", 120, 1, *FLUSH),  # VM 0's return reading comes after it; no entry after
    )
    assert _attribute(rows, spans, found) == [
        (120, None, "no-reading"),
        (160, 5, "inferred"),
        (340, 6, "inferred"),
        (550, None, "no-reading"),
        (550, None, "no-vm"),
        (5_500, None, "untraced"),
    ]


def test_two_vms_on_one_cpu_or_an_unpinned_vcpu_are_ambiguous() -> None:
    """Two vCPU spans on the CPU (or an unpinned one, cpu -1, anywhere): null, ambiguous;
    a zero id (none allocated yet) is VMID 0 and says what that is: in nVHE the host's
    own tag (VTTBR_EL2 0 while the host runs), so the row invalidated the host's entries
    on that CPU, not the VM's (S4); in VHE no one's."""
    spans = _spans(("guest", 0, 1, 100, 200), ("guest", 1, -1, 150, 250))
    found = _readings(("guest", 0, 300, 0, "entry"), ("guest", 1, 260, 256 + 9, "entry"))
    rows = _rows(("guest", 120, 1, *FLUSH), ("guest", 170, 1, *FLUSH), ("guest", 240, 2, *FLUSH))
    out = _attributed(rows, spans, found, margin_ns=0)
    assert out.select("ts", "vmid", "vmid_basis").rows() == [
        (120, 0, "inferred"),
        (170, None, "ambiguous"),
        (240, 9, "inferred"),
    ]
    how = out["vmid_how"][0]
    assert "none allocated yet" in how and "the host's own tag" in how
    assert "the host's EL1&0 entries on CPU 1, nothing of the VM's" in how
    vhe = gtvmid.attribute_vmids(rows, spans, found, STEPS, {"guest": 8}, "vhe", 0)
    assert "no VM's (in VHE" in vhe["vmid_how"][0] and "host's own" not in vhe["vmid_how"][0]
    counts = gtvmid.vmid_counts(out)
    assert counts["count"].sum() == 3 and set(counts["vmid_basis"]) == {"inferred", "ambiguous"}


def test_spans_from_markers_end_at_teardown() -> None:
    """vcpu_spans: the enter marker to the teardown start (else end), unpinned as -1."""
    windows = pl.DataFrame(
        {"vm_seq": [0, 1], "teardown_start_ts": [500, None], "teardown_end_ts": [600, 900]}
    )
    threads = pl.DataFrame(
        {"vm_seq": [0, 1], "vcpu": [0, 0], "pid": [7, 8], "cpu": [1, None], "enter_ts": [100, 700]}
    )
    spans = gtvmid.vcpu_spans("guest", windows, threads)
    assert spans.rows() == [("guest", 0, 1, 100, 500), ("guest", 1, -1, 700, 900)]


def test_a_long_span_is_found_behind_shorter_later_ones() -> None:
    """A VM whose vCPU stayed on the CPU across later, shorter spans (a lookup by start
    time must look back past them): inside both, ambiguous; after the short one, the
    long one's VM."""
    spans = _spans(("guest", 0, 1, 0, 10_000), ("guest", 1, 1, 5_000, 5_100))
    found = _readings(("guest", 0, 1, 256 + 3, "return"), ("guest", 1, 5_001, 256 + 4, "return"))
    rows = _rows(("guest", 5_050, 1, *FLUSH), ("guest", 9_000, 1, *FLUSH))
    assert _attribute(rows, spans, found) == [(5_050, None, "ambiguous"), (9_000, 3, "inferred")]


def test_an_id_change_within_the_fit_bound_is_ambiguous() -> None:
    """6.1: a VM's first flush runs with VMID 0 just before kvm_arm_vmid_update gives it
    an id; a return reading that changed the id within the clock fit's bound of the row
    leaves it ambiguous, not given the new id. Outside the bound it is inferred."""
    spans = _spans(("guest", 0, 1, 0, 1_000_000))
    found = _readings(("guest", 0, 500_000, 0, "entry"), ("guest", 0, 500_010, 256 + 5, "return"))
    rows = _rows(("guest", 500_030, 1, *FLUSH), ("guest", 900_000, 1, *FLUSH))
    out = _attributed(rows, spans, found, margin_ns=100_000)
    assert out.select("ts", "vmid", "vmid_basis").rows() == [
        (500_030, None, "ambiguous"),
        (900_000, 5, "inferred"),
    ]


def test_protected_mode_is_not_attributed() -> None:
    """pKVM's EL2 also maintains the host's stage 2 (VMID 0) during a vCPU's first run:
    the VM on the CPU says nothing about the VMID, so no row is attributed."""
    spans = _spans(("guest", 0, 1, 0, 1_000))
    found = _readings(("guest", 0, 10, 256 + 5, "return"))
    rows = _rows(("guest", 500, 1, *FLUSH))
    out = _attributed(rows, spans, found, "protected", 0)
    assert out.select("vmid", "vmid_basis").rows() == [(None, "protected")]


def test_a_row_inside_a_call_that_changed_the_id_is_ambiguous() -> None:
    """G4: a kvm_arm_vmid_update that lasts longer than the clock error (its vCPU thread
    spinning on cpu_vmid_lock across a rollover, 6.1.176 vmid.c:161): a row between its
    entry and return reading is ambiguous, though both readings are farther than the
    error from it. Such a row runs on another CPU (an MMU notifier's flush: `only-vm`, the
    one VM alive), since the caller's own CPU runs nothing else during the call
    (preemption off, arm.c:920-929; the lock taken with IRQs off). On the caller's CPU the
    same row is ambiguous too: conservative (review 15 N2), the attribution does not
    lean on that, nor on a kprobe not having missed a call between. Before the entry the
    id is the entry's (6.1's first flush, VMID 0); after the return, the new one."""
    spans = _spans(("guest", 0, 1, 0, 1_000_000))
    found = _readings(("guest", 0, 10_000, 0, "entry"), ("guest", 0, 15_000, 256 + 5, "return"))
    rows = _rows(
        ("guest", 8_000, 1, *FLUSH),
        ("guest", 12_000, 0, *FLUSH),
        ("guest", 12_500, 1, *FLUSH),
        ("guest", 17_000, 1, *FLUSH),
    )
    steps = STEPS.with_columns(run_id=pl.lit("guest"), start=pl.lit(0), end=pl.lit(1_000_000))
    out = gtvmid.attribute_vmids(rows, spans, found, steps, {"guest": 8}, "nvhe", 1_000)
    assert out.select("ts", "vmid", "vmid_basis").rows() == [
        (8_000, 0, "inferred"),
        (12_000, None, "ambiguous"),
        (12_500, None, "ambiguous"),
        (17_000, 5, "inferred"),
    ]
    assert "only VM alive" in out["vmid_how"][1] and "inside that call" in out["vmid_how"][1]


def test_a_generation_only_change_keeps_the_vmid() -> None:
    """G1: a rollover that keeps the VM's VMID gives a new generation only (vmid.c
    new_vmid): the VTTBR VMID is the same on both sides, so a row right beside that
    call is inferred, not ambiguous; with the width unknown the ids differ (no-width
    is not reached: ambiguous)."""
    spans = _spans(("guest", 0, 1, 0, 100_000))
    found = _readings(
        ("guest", 0, 50_000, 256 + 5, "entry"), ("guest", 0, 50_010, 512 + 5, "return")
    )
    rows = _rows(("guest", 50_005, 1, *FLUSH))
    known = _attributed(rows, spans, found, margin_ns=1_000)
    assert known.select("vmid", "vmid_basis").rows() == [(5, "inferred")]
    unknown = gtvmid.attribute_vmids(rows, spans, found, STEPS, {}, margin_ns=1_000)
    assert unknown["vmid_basis"].to_list() == ["ambiguous"]


def test_a_missed_return_leaves_the_id_unknown_after_its_entry() -> None:
    """An entry reading with no return after it (a missed kretprobe, or the trace
    ended): the call may have changed the id, so a row after it has no reading."""
    spans = _spans(("guest", 0, 1, 0, 100_000))
    found = _readings(
        ("guest", 0, 10_000, 256 + 5, "return"), ("guest", 0, 20_000, 256 + 5, "entry")
    )
    rows = _rows(("guest", 15_000, 1, *FLUSH), ("guest", 30_000, 1, *FLUSH))
    out = _attributed(rows, spans, found, margin_ns=1_000)
    assert out.select("ts", "vmid", "vmid_basis").rows() == [
        (15_000, 5, "inferred"),
        (30_000, None, "no-reading"),
    ]


def test_the_margin_is_the_runs_clock_error_under_the_ceiling() -> None:
    """G3: the margin is the bundle's own fit error: a 6.12-like first flush 60 us after
    the update's return is ambiguous at the 100 us ceiling, inferred at a 4 us error; a
    fit error over the ceiling attributes nothing by time (clock-error), while the rows
    the source or the operation decide keep their answer."""
    spans = _spans(("guest", 0, 1, 0, 1_000_000))
    found = _readings(("guest", 0, 500_000, 0, "entry"), ("guest", 0, 500_080, 256 + 5, "return"))
    rows = _rows(
        ("guest", 10, 1, "TLBI VMALLS12E1", "___kvm_hyp_init", "hyp", "vmid-s12", "EL1&0"),
        ("guest", 20, 1, "IC IALLU", "__kvm_flush_cpu_context", "hyp", "icache", None),
        ("guest", 560_000, 1, *FLUSH),
    )

    def basis(margin: float) -> list[tuple]:
        out = _attributed(rows, spans, found, margin_ns=margin)
        return out.select("vmid", "vmid_basis").rows()

    assert basis(gtvmid.MARGIN_CEILING_NS)[2] == (None, "ambiguous")
    assert basis(4_200)[2] == (5, "inferred")
    assert basis(150_000) == [(0, "source"), (None, "not-vmid-scoped"), (None, "clock-error")]


def test_a_traced_run_without_vmm_markers_says_so() -> None:
    """A run traced without VMM markers (the rollover's throwaway VMs): its flushes in
    a VM's window are null with that reason, not called untraced."""
    rows = _rows(("quiet", 5_500, 3, *FLUSH))
    plain = gtvmid.attribute_vmids(rows, _spans(), _readings(), STEPS, {})
    marked = gtvmid.attribute_vmids(
        rows, _spans(), _readings(), STEPS, {}, unmarked=frozenset({"quiet"})
    )
    assert plain["vmid_basis"].to_list() == ["untraced"]
    assert marked["vmid_basis"].to_list() == ["no-markers"]
    assert "wrote no markers" in marked["vmid_how"][0]


def test_vhe_kvm_helpers_in_the_kernel_are_attributed() -> None:
    """VHE: KVM's TLB helpers run in kernel text at EL2 with the guest's VTTBR (their
    EL1-form TLBIs act on the VM's EL1&0): attributed like the hyp text's; the host's
    own TLBIs (EL2&0 in VHE) are not KVM's and are left out; in nVHE no kernel row is."""
    spans = _spans(("guest", 0, 1, 100, 200))
    found = _readings(("guest", 0, 150, 256 + 5, "return"))
    rows = _rows(
        ("guest", 160, 1, "TLBI VMALLE1", "__kvm_flush_cpu_context", "kernel", "vmid", "EL1&0"),
        ("guest", 170, 1, "TLBI VAE1IS", "flush_tlb_mm", "kernel", "va", "EL2&0"),
    )
    vhe = _attributed(rows, spans, found, "vhe", 0)
    assert vhe.select("ts", "vmid", "vmid_basis").rows() == [(160, 5, "inferred")]
    nvhe = _attributed(rows, spans, found, "nvhe", 0)
    assert nvhe.is_empty()


# --- on real bundles: fixtures cut from them (tests/fixtures/gtvmid/README.md) ---

FIXTURES = Path(__file__).parent / "fixtures" / "gtvmid"


def _cut(name: str, margin_ns: float | None = None) -> tuple[pl.DataFrame, dict]:
    """A fixture's rows attributed as the report attributes them, and the fixture."""
    found = json.loads((FIXTURES / f"{name}.json").read_text())
    steps = pl.DataFrame(found["steps"], schema=STEPS.schema)
    out = gtvmid.attribute_vmids(
        pl.DataFrame(found["rows"], schema=ROW_SCHEMA),
        pl.DataFrame(found["spans"], schema=gtvmid.SPAN_SCHEMA),
        pl.DataFrame(found["readings"], schema=gtvmid.READING_SCHEMA),
        steps,
        found["vmid_bits"],
        found["bundle"]["kvm_mode"],
        found["margin_ns"] if margin_ns is None else margin_ns,
        frozenset(found["unmarked"]),
    )
    return out, found


@pytest.mark.parametrize("name", ["nvhe-a76-61", "trixie-max-612", "nvhe-a53-61-rollover"])
def test_fixtures_attribute_the_same_under_the_widest_bracket_bound(name: str) -> None:
    """The fixtures' margin_ns is the fit's error from the markers' midpoints, cut before
    the bound added half the widest tight bracket (S1; gtalign.ClockFit.bound_ns): that
    half is at most TIGHT_BRACKET_NS / 2, and with it added every row is attributed as
    before."""
    out, found = _cut(name)
    wider, _ = _cut(name, found["margin_ns"] + TIGHT_BRACKET_NS / 2)
    assert wider.select(*gtvmid.OUT_COLUMNS).rows() == out.select(*gtvmid.OUT_COLUMNS).rows()


def _by(out: pl.DataFrame, operation: str) -> pl.DataFrame:
    """The attributed rows of one operation."""
    return out.filter(pl.col("operation") == operation)


def test_61_nvhe_first_flush_is_vmid_0_on_the_demo_bundle() -> None:
    """The demo's bundle (bookworm 6.1, nVHE, 4 x cortex-a76): the VM's one EL2
    VMALLE1 (__kvm_flush_cpu_context on the guest CPU) ran before its first
    kvm_arm_vmid_update, whose entry still read 0 (arm.c:425 in vcpu_load, before the
    run loop's update at :929): VMID 0, inferred. The four init VMALLS12E1 (one per CPU)
    are 0 by the source; nothing is left null but what no VMID tags."""
    out, found = _cut("nvhe-a76-61")
    assert found["margin_ns"] < 100_000 and found["vmid_bits"] == {"guest": 16}
    flush = _by(out, "TLBI VMALLE1")
    assert flush.select("cpu", "vmid", "vmid_basis").rows() == [(1, 0, "inferred")]
    first = min(found["readings"]["ts"])
    entry = found["readings"]["at"][found["readings"]["ts"].index(first)]
    assert flush["ts"][0] < first and entry == "entry"
    init = _by(out, "TLBI VMALLS12E1")
    assert init.height == 4 and set(init.select("vmid", "vmid_basis").rows()) == {(0, "source")}
    assert sorted(init["cpu"].to_list()) == [0, 1, 2, 3]
    assert set(out["vmid_basis"]) == {"inferred", "source", "not-vmid-scoped"}


def test_612_first_flush_has_the_vmid_its_update_just_gave() -> None:
    """trixie's 6.12.117 (nVHE on max, the teardown sweep's 9 VMs, 16-bit VMIDs): each
    VM's EL2 VMALLE1 follows the return of the kvm_arm_vmid_update that gave the VM its
    VMID (6.12.107 arm.c:597, then the flush at :609 in kvm_arch_vcpu_load), 57 us to
    1.4 ms after it and before the VM's next reading: each is inferred with that VM's
    own VMID, one a VM. With a fixed 100 us margin (before G3) the ones within 100 us of
    the return were ambiguous."""
    out, found = _cut("trixie-max-612")
    readings = pl.DataFrame(found["readings"], schema=gtvmid.READING_SCHEMA)
    given = (
        readings.filter(pl.col("at") == "return", pl.col("vmid_id") > 0)
        .group_by("run_id", "vm_seq")
        .agg(pl.col("ts").min().alias("given_ts"), pl.col("vmid_id").first())
    )
    flush = _by(out, "TLBI VMALLE1").sort("ts")
    assert flush.height == 9 and set(flush["vmid_basis"]) == {"inferred"}
    spans = pl.DataFrame(found["spans"], schema=gtvmid.SPAN_SCHEMA)
    mine = flush.join(spans, on="run_id").filter(pl.col("ts").is_between("start", "end"))
    joined = mine.join(given, on=["run_id", "vm_seq"])
    assert joined.height == 9
    assert (joined["vmid"] == joined["vmid_id"] % (1 << 16)).all()
    assert len(set(joined["vmid"])) == 9
    # After that return, before the VM's next reading (the VM's next vcpu_load).
    after = (joined["ts"] - joined["given_ts"]).to_list()
    assert all(gap > 0 for gap in after), after
    later = readings.join(joined.select("run_id", "vm_seq", "given_ts"), on=["run_id", "vm_seq"])
    nxt = (
        later.filter(pl.col("ts") > pl.col("given_ts"))
        .group_by("run_id", "vm_seq")
        .agg(pl.col("ts").min().alias("next_ts"))
    )
    bounded = joined.join(nxt, on=["run_id", "vm_seq"])
    assert (bounded["ts"] < bounded["next_ts"]).all()
    fixed, _ = _cut("trixie-max-612", gtvmid.MARGIN_CEILING_NS)
    ambiguous = _by(fixed, "TLBI VMALLE1").filter(pl.col("vmid_basis") == "ambiguous")
    assert ambiguous.height == sum(gap <= gtvmid.MARGIN_CEILING_NS for gap in after) > 0


def test_61_rollover_flushes_are_unattributed_for_want_of_markers() -> None:
    """The rollover collect (bookworm 6.1, nVHE, 2 x cortex-a53, 8-bit VMIDs): its
    throwaway VMs' VMM writes no markers, so their flushes say no-markers (not
    "untraced": the run is traced); the ALLE1IS tags no VMID; every VM creation's
    init VMALLS12E1 on both CPUs is 0 by the source; the main guest's first flush is
    VMID 0, as on the demo bundle."""
    out, found = _cut("nvhe-a53-61-rollover")
    assert found["unmarked"] == ["after-guest-rollover"]
    rollover = out.filter(pl.col("run_id") == "after-guest-rollover")
    assert set(_by(rollover, "TLBI VMALLE1")["vmid_basis"]) == {"no-markers"}
    assert _by(rollover, "TLBI ALLE1IS")["vmid_basis"].to_list() == ["not-vmid-scoped"]
    init = _by(out, "TLBI VMALLS12E1")
    assert set(init.select("vmid", "vmid_basis").rows()) == {(0, "source")}
    guest = _by(out.filter(pl.col("run_id") == "guest"), "TLBI VMALLE1")
    assert guest.select("vmid", "vmid_basis").rows() == [(0, "inferred")]


def test_a_traced_vms_row_on_another_cpu_is_not_untraced() -> None:
    """An IPAS2E1IS from __kvm_tlb_flush_vmid_ipa on a CPU no vCPU span holds, inside a
    traced run's VMM window (an MMU notifier on another thread): in nVHE, with one VM
    alive, that VM's VMID (`only-vm`: the host has no stage 2); in VHE, `other-cpu`."""
    steps = STEPS.with_columns(run_id=pl.lit("guest"))
    spans = _spans(("guest", 0, 1, 5_000, 6_000))
    found = _readings(("guest", 0, 5_100, 256 + 7, "return"))
    ipa = ("TLBI IPAS2E1IS", "__kvm_tlb_flush_vmid_ipa", "hyp", "ipa", "EL1&0")
    rows = _rows(("guest", 5_500, 0, *ipa))

    def basis(mode: str) -> tuple:
        out = gtvmid.attribute_vmids(rows, spans, found, steps, {"guest": 8}, mode, margin_ns=0)
        return out.select("vmid", "vmid_basis", "vmid_how").row(0)

    vmid, how_basis, how = basis("nvhe")
    assert (vmid, how_basis) == (7, "only-vm") and "only VM alive" in how and "CPU 1" in how
    vmid, how_basis, how = basis("vhe")
    assert (vmid, how_basis) == (None, "other-cpu") and "another thread" in how
    two = pl.concat([steps, steps.with_columns(vm=pl.lit(1, pl.Int64))])
    out = gtvmid.attribute_vmids(rows, spans, found, two, {"guest": 8}, "nvhe", margin_ns=0)
    assert out["vmid_basis"].to_list() == ["other-cpu"]
    # The debug series' operation with no logged request loads its own VTTBR_EL2, not the
    # live VM's (review 15b B5): neither only-vm off the vCPU's CPU nor inferred on it.
    maint = ("TLBI VMALLS12E1IS", "__kvm_debug_maint", "hyp", "vmid-s12", "EL1&0")
    manual = _rows(("guest", 5_500, 0, *maint), ("guest", 5_500, 1, *maint))
    out = gtvmid.attribute_vmids(manual, spans, found, steps, {"guest": 8}, "nvhe", margin_ns=0)
    assert out.select("vmid", "vmid_basis").rows() == [(None, "unrequested")] * 2


def test_an_after_guest_request_gives_the_vmid_it_asked_for(tmp_path: Path) -> None:
    """tlbi:vmalls12e1is@vmid (S5): the maintenance log the collector writes (issue_maint,
    here into a plain file standing for the debug series' interface) says which VMID the
    user asked for; the series' VMALLS12E1IS from __kvm_debug_maint on that CPU inside
    the request's window is `requested` with it. The same operation on another CPU, or
    outside the window, is not; the request's ALLE2 from ___kvm_hyp_init stays `source`."""
    from tracekit.host.afterguest import issue_maint, tlbi_request
    from tracekit.ingest.maint import parse_maint_log

    clock = iter([7_000, 7_400])
    request = tlbi_request("tlbi:vmalls12e1is@vmid", 1, 5)
    (tmp_path / "op").write_text("")
    log = issue_maint(request, lambda: next(clock), tmp_path / "op")
    assert (tmp_path / "op").read_text() == "vmalls12e1is 1 5 0\n"
    maint = parse_maint_log("\n".join(log) + "\n")
    assert maint.rows() == [("vmalls12e1is", 1, 5, 0, 7_000, 7_400)]
    asked = gtvmid.requests("after-guest-tlbi", maint)
    op = ("TLBI VMALLS12E1IS", "__kvm_debug_maint", "hyp", "vmid-s12", "EL1&0")
    init = ("TLBI VMALLS12E1", "___kvm_hyp_init", "hyp", "vmid-s12", "EL1&0")
    rows = _rows(
        ("after-guest-tlbi", 7_100, 1, *init),
        ("after-guest-tlbi", 7_200, 1, *op),
        ("after-guest-tlbi", 7_200, 0, *op),
        ("after-guest-tlbi", 9_000, 1, *op),
    )
    empty = _spans()
    out = gtvmid.attribute_vmids(rows, empty, _readings(), STEPS, {}, "nvhe", 0, frozenset(), asked)
    assert out.select("ts", "cpu", "vmid", "vmid_basis").rows() == [
        (7_100, 1, 0, "source"),
        (7_200, 1, 5, "requested"),
        (7_200, 0, None, "unrequested"),
        (9_000, 1, None, "unrequested"),
    ]
    how = out.filter(pl.col("vmid_basis") == "requested")["vmid_how"][0]
    assert "asked the debug series" in how and "not read" in how


def test_a_maintenance_log_line_that_is_not_one_is_refused() -> None:
    """A cut or foreign line in el2-maint.txt: one line naming it, never a guess."""
    from tracekit.errors import TracekitError
    from tracekit.ingest.maint import parse_maint_log

    with pytest.raises(TracekitError, match=r"el2-maint.txt:2: not a maintenance request"):
        parse_maint_log("alle1 0 issued at 1, done at 2\nalle1 0 issued at 3\n")
    assert parse_maint_log("alle1 0 issued at 1, done at 2\n")["vmid"].to_list() == [None]
