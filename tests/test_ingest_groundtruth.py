"""The ground-truth log: its reader, where each record ran, the vCPU map and the clock fit.

The fixture is cut from a real boot (tests/fixtures/groundtruth/README.md). The plugin's
classifier (reproducer/groundtruth/tkgt.h) is compiled here into a small host program and
compared, over every SYS encoding it can match, with the Python names; the names are
compared with what GNU as assembles for them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from bundlegen import Spec, generate

from tracekit.bundle import read_manifest, sha256_file, verify_files
from tracekit.errors import TracekitError
from tracekit.ingest import groundtruth as gt
from tracekit.ingest import gtalign
from tracekit.ingest.vmm import parse_vmm_output
from tracekit.symbols.kallsyms import read_kallsyms
from tracekit.vhost.runner import _alignment_note, add_to_bundles, ground_truth_note

FIXTURE = Path(__file__).parent / "fixtures" / "groundtruth" / "nvhe-a76"
PLUGIN_DIR = Path(__file__).resolve().parent.parent / "reproducer" / "groundtruth"
AS = "aarch64-linux-gnu-as"
OBJDUMP = "aarch64-linux-gnu-objdump"


@pytest.fixture(scope="module")
def truth() -> gt.GroundTruth:
    """The fixture boot, read as `vhost run --ground-truth` leaves it."""
    return gt.load_ground_truth(FIXTURE)


def _copy_fixture(tmp_path: Path) -> Path:
    """A writable copy of the fixture directory."""
    dest = tmp_path / "out"
    shutil.copytree(FIXTURE, dest)
    return dest


def test_header_and_records(truth: gt.GroundTruth) -> None:
    """The header's counts hold, nothing is lost, and the records are in time order."""
    assert truth.header.written == truth.table.height == 1476
    assert truth.header.not_written == 0 and truth.unfilled == 0 and truth.header.complete
    assert truth.table["ts_host"].is_sorted()
    assert truth.table.filter(pl.col("kind") == "marker").height == 32


def test_vcpu_map_from_mpidr_checked_by_markers(truth: gt.GroundTruth) -> None:
    """QEMU vCPU i is Linux CPU i here, and every marker ran on the CPU gtmark was pinned to."""
    assert truth.vcpu_to_cpu == {0: 0, 1: 1, 2: 2, 3: 3}
    markers = truth.table.filter(pl.col("kind") == "marker")
    assert markers.group_by("cpu").len().sort("cpu")["len"].to_list() == [8, 8, 8, 8]


def test_clock_fit_within_100_us(truth: gt.GroundTruth) -> None:
    """The host clock maps onto CLOCK_BOOTTIME with a residual under 100 us, slope ~1."""
    assert truth.fit.max_residual_ns < 100_000
    assert abs(truth.fit.slope - 1) < 1e-4


def test_clock_error_at_markers_left_out(truth: gt.GroundTruth) -> None:
    """The markers after the command, left out of an offset fitted before it, are within
    100 us; a clock step between the rounds (a stopped VM) shows there, though a line
    through both rounds absorbs it and its residual stays small."""
    held = truth.fit.heldout
    assert held is not None and (held.fitted, held.left_out) == (16, 16)
    assert held.max_error_ns < 100_000 and abs(truth.fit.slope_ppm) < 1
    records = gt.read_log(FIXTURE / gt.GT_LOG).records
    paired = gtalign.pair_markers(records, gt.parse_gtmark((FIXTURE / gt.GT_MARKERS).read_text()))
    step = 500_000  # the host clock ran 500 us more than the trace's between the rounds
    stepped = gtalign.fit_clock(
        paired.with_columns(
            ts_host=pl.when(pl.col("round") == 1)
            .then(pl.col("ts_host") + step)
            .otherwise(pl.col("ts_host"))
        )
    )
    assert stepped.heldout is not None and stepped.heldout.max_error_ns > 0.9 * step
    assert stepped.max_residual_ns < 100_000
    assert "held out" in truth.fit.summary() and "adjtimex" in truth.fit.summary()
    # The error the VMID attribution takes as its margin is the largest printed: the
    # held-out one here, which the small residual of the stepped fit hides.
    assert stepped.error_ns == stepped.heldout.max_error_ns > 100_000
    assert truth.fit.error_ns == max(truth.fit.max_residual_ns, held.max_error_ns)


def test_clock_bound_adds_half_the_widest_tight_bracket(truth: gt.GroundTruth) -> None:
    """A marker ran anywhere in its [t0, t1], so the bound at the markers is the error from
    the midpoints plus half the widest bracket of the tight ones (those <= 20 us), which
    the fixture's gtmark lines give."""
    lines = gt.parse_gtmark((FIXTURE / gt.GT_MARKERS).read_text())
    width = lines.select(w=pl.col("t1") - pl.col("t0"))["w"]
    widest = width.filter(width <= gtalign.TIGHT_BRACKET_NS).max()
    assert truth.fit.half_bracket_ns == widest / 2 > 0
    assert truth.fit.bound_ns == truth.fit.error_ns + widest / 2
    assert f"bound at the markers {truth.fit.bound_ns / 1000:.1f} us" in truth.fit.summary()


def test_hyp_invalidations_of_6_1_nvhe(truth: gt.GroundTruth) -> None:
    """6.1 nVHE: EL2 init on every CPU at boot and at VM creation; a flush on the guest CPU."""
    hyp = truth.table.filter((pl.col("where") == "hyp") & (pl.col("kind") != "dsb"))
    counts = hyp.group_by("operation", "symbol", "cpu").len()
    init = counts.filter(pl.col("symbol").str.starts_with("__kvm_nvhe____kvm_hyp_init"))
    assert sorted(set(init["operation"])) == ["TLBI ALLE2", "TLBI VMALLS12E1"]
    assert init["len"].to_list() == [2] * 8  # twice on each of the 4 CPUs
    flush = counts.filter(pl.col("symbol").str.starts_with("__kvm_nvhe___kvm_flush_cpu_context"))
    assert sorted(flush.select("operation", "cpu").rows()) == [("IC IALLU", 1), ("TLBI VMALLE1", 1)]
    assert set(hyp["regime"].drop_nulls()) == {"EL2", "EL1&0"}


def test_hyp_records_fall_in_the_vmm_lifecycle(truth: gt.GroundTruth) -> None:
    """On the trace clock, the second EL2 init is inside the VM's creation, the flush inside
    its run, and nothing at EL2 but barriers during its teardown (the VMM's own times)."""
    vm = parse_vmm_output((FIXTURE / "vmm.txt").read_text()).vms.row(0, named=True)
    created = vm["create_start_ns"] + vm["create_ns"]
    ran = created + vm["run_ns"]
    hyp = truth.table.filter((pl.col("where") == "hyp") & (pl.col("kind") != "dsb"))
    late_init = hyp.filter(pl.col("symbol").str.contains("hyp_init") & (pl.col("ts") > 10**10))
    assert late_init.height == 8
    assert late_init["ts"].min() >= vm["create_start_ns"] and late_init["ts"].max() <= created
    flush = hyp.filter(pl.col("symbol").str.contains("flush_cpu_context"))
    assert flush["ts"].min() >= created and flush["ts"].max() <= ran
    assert hyp.filter(pl.col("ts").is_between(ran, vm["teardown_end_ns"])).height == 0


def test_where_by_physical_side(truth: gt.GroundTruth) -> None:
    """Kernel code run at its physical address (MMU off) is the kernel; the guest's DSB is the
    guest's; the trampoline's DSBs are the kernel's but get no kallsyms name."""
    table = truth.table
    idmap = table.filter(pl.col("symbol").str.starts_with("__cpu_setup"))
    assert idmap.height and (idmap["vaddr"] < 1 << 32).all() and set(idmap["where"]) == {"kernel"}
    guest = table.filter(pl.col("where") == "guest")
    assert guest.select("operation", "vaddr", "cpu").rows() == [("DSB SY", 0x40000064, 1)]
    assert guest["effective_shareability"].to_list() == ["full-system"]
    tramp = table.filter((pl.col("vaddr") >= 0xFFFFFB0000000000) & (pl.col("kind") == "dsb"))
    assert tramp.height == 20 and set(tramp["where"]) == {"kernel"}
    assert tramp["symbol"].null_count() == 20 and tramp["where_certain"].all()


def test_freed_init_text_is_kernel_only_at_its_image_va_or_idmap() -> None:
    """Bytes mapping into init text (freed after boot, so reusable as guest RAM) run at a
    low VA other than their physical address follow the VA rules, unnamed; at their
    physical address (the idmap) they are the kernel, named after the __init function."""
    records = gt.read_log(FIXTURE / gt.GT_LOG).records
    layout = gtalign.kernel_layout(read_kallsyms(FIXTURE / gt.GT_KALLSYMS))
    sites = records.select("vaddr", "haddr", "kind").unique()
    offset = gtalign.host_offset(sites, layout)
    idmap = gtalign.idmap_offset(sites, layout, offset)
    assert idmap is not None
    init_haddr = (layout.init[0] + 0x1000 + offset) % (1 << 64)
    tlbi = records.filter(pl.col("kind") == "tlbi").head(1)
    dsb = records.filter(pl.col("kind") == "dsb").head(1)

    def at(row: pl.DataFrame, vaddr: int) -> pl.DataFrame:
        """The record run at vaddr from bytes in init text."""
        return row.with_columns(vaddr=pl.lit(vaddr, pl.UInt64), haddr=pl.lit(init_haddr, pl.UInt64))

    synthetic = pl.concat(
        [
            at(tlbi, 0x4000_1000),
            at(dsb, 0x7F00_0000_1000),
            at(tlbi, (init_haddr - idmap) % (1 << 64)),
            at(tlbi, 0x7F00_0000_2000),
        ]
    )
    located = gtalign.locate(pl.concat([records, synthetic]), layout).tail(4)
    # The last: a TLBI outside the guest window may be a user task's attempt (UNDEF).
    assert located.select("where", "where_certain").rows() == [
        ("guest", True),
        ("user", False),
        ("kernel", True),
        ("guest", False),
    ]
    assert located["symbol"].to_list()[:2] == [None, None]
    assert located["symbol"][2] is not None


def test_a_full_log_says_how_much_was_not_written(tmp_path: Path) -> None:
    """A header whose reservations passed its capacity counts the records not written."""
    out = _copy_fixture(tmp_path)
    log = out / gt.GT_LOG
    data = bytearray(log.read_bytes())
    data[16:24] = (1000).to_bytes(8, "little")  # capacity below the 1476 reserved
    log.write_bytes(bytes(data))
    full = gt.read_log(log)
    assert full.header.not_written == 476 and full.records.height == 1000
    assert "476 NOT written (log full)" in ground_truth_note(log)
    # The markers were among the records not written: the clock cannot be aligned, and
    # the run's note says so instead of a table on a wrong clock.
    assert "NOT aligned" in _alignment_note(out, "nvhe") and "0 markers" in _alignment_note(
        out, "nvhe"
    )


def test_untracked_sites_are_reported(tmp_path: Path) -> None:
    """Sites the plugin could not track are in notes() and the run's line, as lost in
    unknown number; a log without them says nothing of it."""
    out = _copy_fixture(tmp_path)
    log = out / gt.GT_LOG
    assert "NOT tracked" not in ground_truth_note(log)
    data = bytearray(log.read_bytes())
    data[48:56] = (3).to_bytes(8, "little")
    log.write_bytes(bytes(data))
    line = "3 instruction sites NOT tracked"
    assert line in ground_truth_note(log) and "unknown" in ground_truth_note(log)
    assert any(note.startswith(line) for note in gt.load_ground_truth(out).notes())


def test_unfilled_slots_are_counted(tmp_path: Path) -> None:
    """A slot reserved but never filled (QEMU killed mid-record) is counted, not read."""
    out = _copy_fixture(tmp_path)
    log = out / gt.GT_LOG
    data = bytearray(log.read_bytes())
    data[gt.HEADER_SIZE : gt.HEADER_SIZE + 8] = bytes(8)  # the first record's ts
    log.write_bytes(bytes(data))
    assert gt.read_log(log).unfilled == 1


def test_bad_files_are_one_line(tmp_path: Path) -> None:
    """Not a log, a wrong version, a missing file: each one clear error."""
    bad = tmp_path / "bad.tkgt"
    bad.write_bytes(b"hello" * 20)
    with pytest.raises(TracekitError, match="no TKGTLOG header"):
        gt.read_header(bad)
    data = bytearray((FIXTURE / gt.GT_LOG).read_bytes()[:64])
    data[8:12] = (9).to_bytes(4, "little")
    bad.write_bytes(bytes(data))
    with pytest.raises(TracekitError, match="format version 9"):
        gt.read_header(bad)
    with pytest.raises(TracekitError, match=r"vhost-kallsyms\.txt"):
        (tmp_path / "empty").mkdir()
        shutil.copy(FIXTURE / gt.GT_LOG, tmp_path / "empty")
        gt.load_ground_truth(tmp_path / "empty")


def test_wrong_cpu_map_is_caught_by_the_markers(truth: gt.GroundTruth) -> None:
    """A dmesg naming other MPIDRs for CPUs 1 and 2 makes the marker check fail."""
    records = gt.read_log(FIXTURE / gt.GT_LOG).records
    layout = gtalign.kernel_layout(read_kallsyms(FIXTURE / gt.GT_KALLSYMS))
    dmesg = (FIXTURE / gt.GT_DMESG).read_text()
    swapped = dmesg.replace("0x0000000001 ", "0xTMP ").replace("0x0000000002 ", "0x0000000001 ")
    swapped = swapped.replace("0xTMP ", "0x0000000002 ")
    markers = gt.parse_gtmark((FIXTURE / gt.GT_MARKERS).read_text())
    with pytest.raises(TracekitError, match="another CPU than gtmark was pinned to"):
        gtalign.ground_truth_table(records, layout, markers, swapped, 4, False)
    with pytest.raises(TracekitError, match="31 markers but gtmark printed 32"):
        gtalign.ground_truth_table(
            records.filter(
                pl.col("ts_host") != records.filter(pl.col("kind") == "marker")["ts_host"][0]
            ),
            layout,
            markers,
            dmesg,
            4,
            False,
        )


def test_vhe_from_the_boot_log_not_kvm() -> None:
    """VHE is what the boot log's CPU features say (a forced-off VH, KVM aside, is nVHE);
    a log that cannot say is refused unless told, and a contradicting flag is refused."""
    fixtures = Path(__file__).parent / "fixtures" / "vhost"
    nvhe = (FIXTURE / gt.GT_DMESG).read_text()
    assert "SYS_ID_AA64MMFR1_EL1[11:8]: forced to 0" in nvhe  # cortex-a76 has VHE
    assert gtalign.host_vhe(nvhe) is False
    assert gtalign.host_vhe((fixtures / "dmesg-bookworm-max-vhe.txt").read_text()) is True
    bringup = "\n".join(line for line in nvhe.splitlines() if "CPU features" not in line)
    with pytest.raises(TracekitError, match="cannot say whether the host kernel ran with VHE"):
        gtalign.host_vhe(bringup)
    assert gtalign.host_vhe(bringup, vhe=True) is True
    with pytest.raises(TracekitError, match="VHE given as True but the boot log says False"):
        gtalign.host_vhe(nvhe, vhe=True)


def test_the_vhe_guest_context_helpers_are_kvm_host_functions() -> None:
    """Every function the regime rule and the VMID attribution take as KVM's VHE TLB code
    is one the signatures watch as KVM's ([kvm] host_functions)."""
    from tracekit.analysis.gtsignatures import packaged_signatures

    assert set(gtalign.VHE_KVM_TLB) <= set(packaged_signatures().host_functions)


def test_vhe_host_el1_forms_act_on_el2_and_0() -> None:
    """In VHE the host kernel's EL1-form TLBIs are EL2&0; a guest's local TLBI is broadcast."""
    frame = pl.DataFrame(
        {
            "operation": ["TLBI VMALLE1IS", "TLBI VMALLE1", "TLBI ALLE1IS", "TLBI ALLE2"],
            "kind": ["tlbi"] * 4,
            "el_form": ["EL1", "EL1", "EL2", "EL2"],
            "where": ["kernel", "guest", "kernel", "kernel"],
            "shareability": ["inner", "non-shareable", "inner", "non-shareable"],
            "symbol": ["flush_tlb_mm+0x40", None, None, None],
        }
    )
    # KVM's VHE TLB helpers clear TGE first: their EL1-form TLBIs act on the guest's EL1&0.
    kvm = frame.with_columns(symbol=pl.lit("__kvm_tlb_flush_vmid+0x58"))
    assert gtalign.effective(kvm, True)["regime"][0] == "EL1&0"
    # Named one by one, not by prefix (review 15 N1): 6.12's __kvm_tlbi_s1e2 without a
    # guest MMU keeps TGE set, so its EL1-form TLBI stays on the host's EL2&0.
    nested = frame.with_columns(symbol=pl.lit("__kvm_tlbi_s1e2+0x60"))
    assert gtalign.effective(nested, True)["regime"][0] == "EL2&0"
    vhe = gtalign.effective(frame, True)
    assert vhe["regime"].to_list() == ["EL2&0", "EL1&0", "EL1&0", "EL2&0"]
    assert vhe["effective_shareability"].to_list() == ["inner", "inner", "inner", "non-shareable"]
    assert gtalign.effective(frame, False)["regime"].to_list() == [
        "EL1&0",
        "EL1&0",
        "EL1&0",
        "EL2",
    ]


# Every word the plugin can match: all SYS encodings with CRn 7/8/9, every DSB/DSB nXS,
# and neighbours that must not match (SYSL, DMB, another HINT, MSR).
def _candidate_words() -> list[int]:
    """The encodings the classifier test feeds to both sides."""
    words = []
    for crn in (7, 8, 9):
        for op1 in range(8):
            for crm in range(16):
                for op2 in range(8):
                    words.append(0xD5080000 | op1 << 16 | crn << 12 | crm << 8 | op2 << 5 | 31)
    words += [0xD503309F | crm << 8 for crm in range(16)]
    words += [0xD503323F | imm << 10 for imm in range(4)]
    return [*words, 0xD5032EFF, 0xD5288000 | 3 << 8, 0xD50330BF, 0xD503201F, 0xD51B4200]


HARNESS = """
#include <stdio.h>
#include "tkgt.h"
int main(void) {
    unsigned int w; unsigned char kind, flags;
    while (scanf("%x", &w) == 1) {
        if (tkgt_classify(w, &kind, &flags)) printf("%08x %u %u\\n", w, kind, flags);
        else printf("%08x 0 0\\n", w);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def c_classes(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[int, int]]:
    """The C classifier's (kind, flags) for every candidate word, compiled -Werror here."""
    tmp = tmp_path_factory.mktemp("tkgt")
    (tmp / "harness.c").write_text(HARNESS)
    subprocess.run(
        [
            "gcc",
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{PLUGIN_DIR}",
            "-o",
            str(tmp / "harness"),
            str(tmp / "harness.c"),
        ],
        check=True,
    )
    words = _candidate_words()
    done = subprocess.run(
        [str(tmp / "harness")],
        input="\n".join(f"{w:x}" for w in words),
        capture_output=True,
        text=True,
        check=True,
    )
    rows = (line.split() for line in done.stdout.splitlines())
    return {int(w, 16): (int(k), int(f)) for w, k, f in rows}


def test_c_classifier_agrees_with_python_names(c_classes: dict[int, tuple[int, int]]) -> None:
    """Every TLBI Python names gets the shareability and range its name says from the C side;
    SYSL, DMB, NOP and MSR are not logged; IC other than IALLU(IS) is not logged."""
    shares = {"IS": 1, "OS": 2}
    for word, (kind, flags) in c_classes.items():
        name = gt.operation(word)
        if name.startswith("TLBI ") and "op1=" not in name:
            base = name.removeprefix("TLBI ").removesuffix("nXS")
            assert kind == (2 if name.endswith("nXS") else 1), name
            assert flags & 3 == shares.get(base[-2:], 0), name
            assert bool(flags & 0x10) == base.startswith(("R", "RIPAS")), name
        elif name in ("IC IALLU", "IC IALLUIS", "MARKER") or name.startswith(
            ("DSB", "SSBB", "PSSBB")
        ):
            assert kind != 0, name
        elif not name.startswith("TLBI "):
            assert kind == 0, f"{word:#x} logged as {kind}"
    assert c_classes[0xD503309F | 11 << 8] == (3, 1 | 3 << 2)  # DSB ISH: inner, all
    assert c_classes[0xD503323F | 2 << 10] == (4, 1 | 3 << 2)  # DSB ISHnXS
    # FEAT_TLBIW's VMALLWS2E1 (op1=4 CRm=6 op2=2; LLVM 0xd50c865f) and its IS/OS forms
    # (CRm 2, 5) are no range TLBIs; RVAE2IS (op2=1) beside them is.
    for crm in (2, 5, 6):
        assert not c_classes[0xD50C805F | crm << 8][1] & 0x10, crm
        assert c_classes[0xD50C803F | crm << 8][1] & 0x10, crm
    # SSBB and PSSBB name no domain: a kind of their own; DSB #8/#12 execute as SY.
    assert c_classes[0xD503309F] == c_classes[0xD503309F | 4 << 8] == (7, 0)
    assert c_classes[0xD503309F | 8 << 8] == c_classes[0xD503309F | 12 << 8] == (3, 3 | 3 << 2)


@pytest.mark.parametrize("version", [1, 2])
def test_speculation_barriers_are_no_dsb(version: int) -> None:
    """SSBB/PSSBB decode as kind ssb with no shareability (also a version-1 log's, coded as
    DSB OSH/NSH type 0); DSB #8/#12 as full-system; neither is upgraded for a guest."""
    words = [0xD503309F, 0xD503349F, 0xD503389F, 0xD5033C9F, 0xD5033F9F]
    v1 = [(3, 2), (3, 0), (3, 1 << 0 | 0), (3, 3), (3, 3 | 3 << 2)]
    v2 = [(7, 0), (7, 0), (3, 3 | 3 << 2), (3, 3 | 3 << 2), (3, 3 | 3 << 2)]
    codes = v1 if version == 1 else v2
    raw = pl.DataFrame(
        {
            "ts_host": list(range(1, 6)),
            "vcpu": [0] * 5,
            "insn": pl.Series(words, dtype=pl.UInt32),
            "vaddr": pl.Series([0x40000000] * 5, dtype=pl.UInt64),
            "haddr": pl.Series([0] * 5, dtype=pl.UInt64),
            "kind_code": pl.Series([k for k, _ in codes], dtype=pl.UInt8),
            "flags": pl.Series([f for _, f in codes], dtype=pl.UInt8),
        }
    )
    decoded = gt.decode(raw)
    assert decoded["operation"].to_list() == [
        "SSBB",
        "PSSBB",
        "DSB #8 (as SY)",
        "DSB #12 (as SY)",
        "DSB SY",
    ]
    assert decoded["kind"].to_list() == ["ssb", "ssb", "dsb", "dsb", "dsb"]
    assert decoded["shareability"].to_list() == [None, None] + ["full-system"] * 3
    guest = gtalign.effective(decoded.with_columns(where=pl.lit("guest"), symbol=None), False)
    assert guest["effective_shareability"].to_list() == [None, None] + ["full-system"] * 3


@pytest.mark.skipif(shutil.which(AS) is None, reason="needs binutils-aarch64-linux-gnu")
def test_names_match_gnu_as(tmp_path: Path) -> None:
    """What GNU as assembles for each TLBI/DSB/IC name is the word Python gives that name."""
    names = sorted({gt.operation(w) for w in _candidate_words()} - {"MARKER"})
    # binutils 2.40 assembles DSB nXS but no TLBI nXS: those are the CRn=8 words with
    # CRn=9, which the classifier test covers.
    names = [
        n
        for n in names
        if not n.startswith(("unknown", "DSB #"))
        and "op1=" not in n
        and not (n.startswith("TLBI") and n.endswith("nXS"))
    ]
    lines = []
    for name in names:
        mnemonic, _, operand = name.partition(" ")
        needs_reg = mnemonic == "TLBI" and any(
            s in operand for s in ("VA", "ASID", "IPA", "RVA", "RIPA")
        )
        lines.append(f"{mnemonic.lower()} {operand.lower()}{', x0' if needs_reg else ''}")
    source = tmp_path / "all.S"
    source.write_text("\n".join(lines) + "\n")
    obj = tmp_path / "all.o"
    subprocess.run([AS, "-march=armv8.7-a", "-o", str(obj), str(source)], check=True)
    dump = subprocess.run([OBJDUMP, "-d", str(obj)], capture_output=True, text=True, check=True)
    words = [int(line.split()[1], 16) for line in dump.stdout.splitlines() if ":\t" in line]
    assert len(words) == len(names)
    for name, word in zip(names, words, strict=True):
        assert gt.operation(word & ~0x1F | (word & 0x1F if name.startswith("DSB") else 31)) == name


def _relaid(markers_at_end: bool, marker_capacity: int, extra: int = 0) -> bytes:
    """The fixture's records re-laid as the plugin lays them with a marker region."""
    raw = np.frombuffer((FIXTURE / gt.GT_LOG).read_bytes()[gt.HEADER_SIZE :], gt._RECORD)
    marks, others = raw[raw["kind"] == 6], raw[raw["kind"] != 6]
    capacity = len(others) + marker_capacity + extra
    header = bytearray((FIXTURE / gt.GT_LOG).read_bytes()[: gt.HEADER_SIZE])
    header[16:24] = capacity.to_bytes(8, "little")
    header[24:32] = len(others).to_bytes(8, "little")
    header[32:36] = (0 if markers_at_end else 1).to_bytes(4, "little")
    header[44:48] = marker_capacity.to_bytes(4, "little")
    header[56:64] = len(marks).to_bytes(8, "little")
    if not markers_at_end:
        return bytes(header) + others.tobytes() + marks.tobytes()
    gap = np.zeros(capacity - marker_capacity - len(others), gt._RECORD)
    return bytes(header) + others.tobytes() + gap.tobytes() + marks.tobytes()


@pytest.mark.parametrize("closed", [True, False])
def test_marker_slots_closed_or_not(tmp_path: Path, closed: bool) -> None:
    """Markers in their own slots: moved up behind the others once closed, still at the
    end of the capacity in a log QEMU never closed; both read as the same records."""
    expected = gt.read_log(FIXTURE / gt.GT_LOG).records
    log = tmp_path / "log.tkgt"
    log.write_bytes(_relaid(markers_at_end=not closed, marker_capacity=64, extra=5))
    read = gt.read_log(log)
    assert read.header.complete is closed and read.header.not_written == 0
    assert read.records.equals(expected)


def test_ground_truth_added_to_the_bundles_of_the_boot(tmp_path: Path) -> None:
    """Every bundle left in --out gets the boot's ground truth in groundtruth/, recorded in
    its manifest with checksum and note; it loads from there; caches and repeats skip."""
    out = _copy_fixture(tmp_path)
    bundle = generate(out / "checks" / "x" / "bundle", Spec(runs=2))
    (out / "bundle" / ".tracekit-cache").mkdir(parents=True)
    (out / "bundle" / ".tracekit-cache" / "manifest.json").write_text("{}")
    assert add_to_bundles(out) == [bundle]
    manifest = read_manifest(bundle)
    entry = manifest.files[f"groundtruth/{gt.GT_LOG}"]
    assert entry["sha256"] == sha256_file(FIXTURE / gt.GT_LOG)
    assert entry["added_by"] == "tracekit vhost run --ground-truth"
    assert "emulated ground truth" in entry["note"] and "not hardware" in entry["note"]
    assert verify_files(bundle, manifest) == []
    inside = gt.load_ground_truth(bundle / "groundtruth")
    assert inside.table.equals(gt.load_ground_truth(FIXTURE).table)
    assert add_to_bundles(out) == []  # already there: nothing replaced


def test_bundle_rows_given_to_their_runs(tmp_path: Path) -> None:
    """Each ground-truth row inside a run's [start, end] gets that run; counted apart."""
    out = _copy_fixture(tmp_path)
    bundle = generate(out / "bundle", Spec(runs=2))
    add_to_bundles(out)
    truth, given = gt.bundle_ground_truth(bundle)
    runs = [r for r in read_manifest(bundle).runs if r.start_ns is not None]
    expected = sum(
        truth.table.filter(pl.col("ts").is_between(r.start_ns, r.end_ns)).height for r in runs
    )
    assert expected > 0 and given.height == expected
    for run in runs:
        mine = given.filter(pl.col("run_id") == run.run_id)
        assert mine.height == 0 or (
            mine["ts"].min() >= run.start_ns and mine["ts"].max() <= run.end_ns
        )
    board = generate(tmp_path / "board", Spec(runs=2))
    with pytest.raises(TracekitError, match="no ground truth"):
        gt.bundle_ground_truth(board)


def _sync_copies(records: pl.DataFrame, placed: list[tuple[int, int]]) -> pl.DataFrame:
    """The log's records plus copies of its first marker moved to the sync slot (63), one
    per (host ns, vCPU) in `placed`: what the VMM's and the probe's markers log as."""
    marker = records.filter(pl.col("kind") == "marker").head(1)
    base = (marker["vaddr"][0] // 512) * 512 + 8 * gtalign.SYNC_SLOT
    copies = [
        marker.with_columns(
            ts_host=pl.lit(ts, pl.Int64), vcpu=pl.lit(vcpu, pl.Int32), vaddr=pl.lit(base, pl.UInt64)
        )
        for ts, vcpu in placed
    ]
    return pl.concat([records, *copies]).sort("ts_host")


def _line(fit: gtalign.ClockFit, host: int, cpu: int, shift: int = 3_000) -> tuple:
    """A sync line as the VMM prints it for a marker logged at `host`: a 4 us bracket whose
    midpoint is `shift` ns off what the gtmark fit says."""
    trace = round(fit.offset + fit.slope * (host - fit.host0)) + shift
    return ("vmm test", cpu, trace - 2_000, trace + 2_000)


def test_sync_markers_pair_by_time_and_cpu_and_join_the_fit(truth: gt.GroundTruth) -> None:
    """The VMM's and the probe's markers (slot 63) are not gtmark's: gtmark's pairing skips
    them; each sync line pairs with the one sync marker on its CPU near its bracket under
    the gtmark fit, and the fit then holds both, the gtmark-only error printed apart. Two
    candidates, another CPU or no marker near: unpaired, counted."""
    records = gt.read_log(FIXTURE / gt.GT_LOG).records
    gtmark = gt.parse_gtmark((FIXTURE / gt.GT_MARKERS).read_text())
    first = gtalign.fit_clock(gtalign.pair_markers(records, gtmark))
    low, high = records["ts_host"].min(), records["ts_host"].max()
    h1, h2 = low + (high - low) // 3, low + 2 * (high - low) // 3
    # h2 + 10 us on vCPU 2 is another CPU: no ambiguity with h2 on vCPU 1.
    h3, h4 = h1 + 20_000_000, h1 + 40_000_000
    placed = [(h1, 1), (h2, 1), (h2 + 10_000, 2), (h1 + 5_000_000, 3), (h1 + 5_050_000, 3)]
    placed += [(h3, 0), (h4, 0)]
    # A process's first marker: a 2 ms bracket (translation), the marker at its start.
    trace4 = round(first.offset + first.slope * (h4 - first.host0))
    wide = ("vmm first", 0, trace4 - 50, trace4 + 2_000_000)
    logged_records = _sync_copies(records, placed)
    paired = gtalign.pair_markers(logged_records, gtmark)
    assert paired.height == gtmark.height  # the sync markers are left to pair_sync
    lines = pl.DataFrame(
        [
            _line(first, h1, 1),
            _line(first, h2, 1),
            _line(first, h2 + 10_000, 2),
            _line(first, h1 + 5_000_000, 3),  # two sync markers within 100 us: ambiguous
            _line(first, h1, 2),  # right time, wrong CPU
            _line(first, h1 + 90_000_000, 0),  # no marker near
            _line(first, h2 + 10_000, -1),  # moved across it: time alone, and h2 is near too
            _line(first, h3, 0),  # h3 is claimed by this line and the next: both dropped
            _line(first, h3, -1),
            wide,
        ],
        schema=gtalign.SYNC_SCHEMA,
        orient="row",
    )
    seen = gtalign.sync_markers(logged_records, truth.vcpu_to_cpu)
    assert seen.height == len(placed)
    synced = gtalign.pair_sync(seen, first, lines)
    assert sorted(synced["ts_host"].to_list()) == sorted([h1, h2, h2 + 10_000, h4])
    final = gtalign.fit_clock(paired, synced)
    check = gtalign.sync_check(first, final, synced, lines.height, seen.height)
    assert (check.lines, check.paired, check.logged) == (10, 4, 7)
    # Over the tight brackets only (the wide one's midpoint is 1 ms off its marker); the
    # 3 us shift puts the fit 1 us outside the 4 us brackets, inside the wide one.
    assert check.tight == 3 and check.max_outside_ns == 1_000
    assert 2_900 <= check.max_error_ns <= 3_100  # the 3 us the lines were shifted by
    assert check.max_residual_ns < check.max_error_ns
    assert final.markers == gtmark.height + 4 and final.heldout == first.heldout
    text = check.summary()
    assert "4 of 10 printed paired (7 logged)" in text and "gtmark-only fit's error" in text


def test_bundle_sync_lines_from_vmm_and_probe(tmp_path: Path) -> None:
    """A bundle's VMM `sync` records and probe summaries' `sync` lists reach the clock fit;
    the fixture's log has no sync marker, so none pairs and the summary says so."""
    from tracekit.bundle import RunFile, run_path

    out = _copy_fixture(tmp_path)
    bundle = generate(out / "bundle", Spec(runs=2))
    add_to_bundles(out)
    runs = read_manifest(bundle).runs
    vmm = run_path(bundle, runs[0].run_id, RunFile.VMM)
    vmm.write_text(
        "record=run format=1 guest=g variant=mmu-on vcpus=1 clock=boottime\n"
        "record=sync source=vmm vm=0 event=create cpu=0 t0=100 t1=200\n"
        "record=sync source=vmm vm=0 event=run cpu=1 t0=300 t1=400\n"
    )
    probe = run_path(bundle, runs[1].run_id, RunFile.PROBE_SUMMARY)
    probe.write_text(
        '{"record":"tlbiprobe","count":0,"sync":[{"event":"start","cpu":2,"t0":5,"t1":6}]}\n'
    )
    lines = gt.bundle_sync_lines(bundle, runs)
    assert lines.select("cpu", "t0", "t1").rows() == [(0, 100, 200), (1, 300, 400), (2, 5, 6)]
    assert lines["source"][1] == f"vmm {runs[0].run_id} vm=0 run"
    truth, _ = gt.bundle_ground_truth(bundle)
    assert truth.fit.sync is not None and (truth.fit.sync.lines, truth.fit.sync.paired) == (3, 0)
    assert "sync markers: none of 3 printed paired" in truth.fit.summary()
    probe.write_text('{"record":"tlbiprobe","sync":[{"event":"start","cpu":2}]}\n')
    with pytest.raises(TracekitError, match="without integer cpu, t0 and t1"):
        gt.bundle_sync_lines(bundle, runs)


def test_a_stopped_runs_empty_probe_summary_has_no_sync_lines(tmp_path: Path) -> None:
    """A probe slot killed before it printed leaves an empty probe.json: for a stopped run
    its markers are not known (RunData names the file as a problem) and the other runs' fit
    the clock; for a run that ended normally the same file stays one error line."""
    from dataclasses import replace

    from tracekit.bundle import RunFile, run_path

    out = _copy_fixture(tmp_path)
    bundle = generate(out / "bundle", Spec(runs=2))
    runs = read_manifest(bundle).runs
    run_path(bundle, runs[1].run_id, RunFile.PROBE_SUMMARY).write_text("")
    with pytest.raises(TracekitError, match="not the probe's JSON summary"):
        gt.bundle_sync_lines(bundle, runs)
    killed = [runs[0], replace(runs[1], status="interrupted")]
    assert gt.bundle_sync_lines(bundle, killed).height == 0
