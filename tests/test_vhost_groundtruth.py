"""The ground-truth plugin: its build side (QEMU version checks, the header out of
Debian's source tarballs, the deb-src apt state, make against the header) and, in the
emulated host, what it sees of VMs in nVHE on bookworm's 6.1.

The tarballs here are generated; the build uses the header `tracekit vhost build
--ground-truth` cached (the real one of the installed QEMU), and is skipped without it.
The vhost test loads the plugin in the existing `nvhe-a53` boot (no boot of its own).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import polars as pl
import pytest
from conftest import register_vhost_check

from tracekit.analysis import groundtruth as gta
from tracekit.analysis.gtsignatures import packaged_signatures
from tracekit.bundle import read_manifest
from tracekit.cpus import parse_cpu_list
from tracekit.errors import TracekitError
from tracekit.host.kvmstate import read_enable_virt_at_load
from tracekit.ingest.bundle import load_bundle
from tracekit.ingest.groundtruth import (
    bundle_ground_truth,
    load_ground_truth,
    parse_gtmark,
    read_log,
)
from tracekit.ingest.gtalign import SYNC_SCHEMA
from tracekit.ingest.vmm import parse_vmm_output
from tracekit.report.sections.groundtruth import bundle_summary
from tracekit.report.sections.groundtruth import section as groundtruth_section
from tracekit.vhost import apt, groundtruth

HEADER = b"/* qemu-plugin.h */\n#define QEMU_PLUGIN_VERSION 1\n"


def _tarball(path: Path, files: dict[str, bytes]) -> Path:
    """An .tar.xz holding `files`."""
    with tarfile.open(path, "w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_debian_version_from_qemu_version_output() -> None:
    """The Debian version is read from `qemu-system-aarch64 --version`, or None."""
    line = "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright"
    assert groundtruth.parse_debian_version(line) == "1:7.2+dfsg-7+deb12u18+b3"
    assert groundtruth.parse_debian_version("QEMU emulator version 9.1.0") is None


def test_version_mismatch_is_one_line() -> None:
    """A QEMU on PATH other than the packaged one is refused, naming both versions."""
    groundtruth.check_same_version("1:7.2+dfsg-7+deb12u18+b3", "1:7.2+dfsg-7+deb12u18+b3")
    with pytest.raises(TracekitError, match="reports Debian version none, but qemu-system-arm"):
        groundtruth.check_same_version("1:7.2+dfsg-7+deb12u18+b3", None)


def test_header_cut_from_the_upstream_tarball(tmp_path: Path) -> None:
    """include/qemu/qemu-plugin.h comes out of the .orig tarball; its API is checked."""
    orig = _tarball(
        tmp_path / "qemu_7.2+dfsg.orig.tar.xz",
        {"qemu-7.2.0/include/qemu/qemu-plugin.h": HEADER, "qemu-7.2.0/README": b"x"},
    )
    assert groundtruth.header_from_tarball(orig) == HEADER
    groundtruth.check_api(HEADER)
    with pytest.raises(TracekitError, match="plugin API 2"):
        groundtruth.check_api(HEADER.replace(b"VERSION 1", b"VERSION 2"))
    empty = _tarball(tmp_path / "other.tar.xz", {"x/README": b"x"})
    with pytest.raises(TracekitError, match="not a QEMU source tarball"):
        groundtruth.header_from_tarball(empty)


def test_a_debian_patch_to_the_header_is_refused(tmp_path: Path) -> None:
    """If Debian patches the header, the tarball's copy is not the installed QEMU's."""
    clean = _tarball(tmp_path / "a.debian.tar.xz", {"debian/patches/x.patch": b"--- a/foo.c\n"})
    groundtruth.check_not_patched(clean)
    patched = _tarball(
        tmp_path / "b.debian.tar.xz",
        {"debian/patches/y.patch": b"--- a/include/qemu/qemu-plugin.h\n+++ b/..."},
    )
    with pytest.raises(TracekitError, match=r"patches qemu-plugin\.h"):
        groundtruth.check_not_patched(patched)


def test_source_state_lists_deb_src(tmp_path: Path) -> None:
    """The private source state asks for deb-src lines of the suite and its -updates."""
    state = apt.AptState(
        tmp_path,
        "bookworm",
        "http://mirror.example/debian",
        source=True,
        extra_suites=("bookworm-updates",),
    )
    lines = apt.sources_list(state).splitlines()
    assert [line.split()[0] for line in lines] == ["deb-src", "deb-src"]
    assert [line.split()[3] for line in lines] == ["bookworm", "bookworm-updates"]


def test_plugin_argv_refuses_commas(tmp_path: Path) -> None:
    """QEMU's option parser splits on commas: such a path is one clear error."""
    argv = groundtruth.plugin_argv(tmp_path / "tkgt.so", tmp_path / "log", 10)
    assert argv == ["-plugin", f"file={tmp_path}/tkgt.so,out={tmp_path}/log,limit=10"]
    with pytest.raises(TracekitError, match="comma"):
        groundtruth.plugin_argv(tmp_path / "a,b" / "tkgt.so", tmp_path / "log")


def _cached_header() -> Path | None:
    """The header of the installed QEMU, if `vhost build --ground-truth` cached it."""
    try:
        version = groundtruth.installed_qemu()
    except TracekitError:
        return None
    header = groundtruth.header_dir(version) / groundtruth.HEADER
    return header if header.is_file() else None


@pytest.mark.skipif(_cached_header() is None, reason="run `tracekit vhost build --ground-truth`")
def test_plugin_builds_with_werror_and_exports_install(tmp_path: Path) -> None:
    """make builds the plugin -Wall -Wextra -Werror; it exports what QEMU looks up."""
    header = _cached_header()
    assert header is not None
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(groundtruth.plugin_source_dir()),
            f"QEMU_PLUGIN_INCLUDE={header.parent}",
            f"O={tmp_path}",
        ],
        check=True,
    )
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(tmp_path / groundtruth.PLUGIN)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "qemu_plugin_install" in symbols and "qemu_plugin_version" in symbols
    assert "intern_site" not in symbols  # everything else stays hidden


# An EL0 program: the marker, a TLBI (UNDEFINED at EL0: SIGILL), then exit(0) it never reaches.
UNDEF_AT_EL0 = """
.globl _start
_start:
    hint #0x77
    tlbi vmalle1
    mov x8, #93
    mov x0, #0
    svc #0
"""


@pytest.mark.skipif(
    _cached_header() is None or shutil.which("qemu-aarch64") is None,
    reason="needs the cached plugin header and qemu-user (qemu-aarch64)",
)
@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="needs the cross gcc")
def test_an_instruction_that_undefs_is_logged_as_attempted(tmp_path: Path) -> None:
    """The exec callback runs as the instruction starts: a TLBI at EL0, which UNDEFs (the
    program dies of SIGILL), is in the log. Run under QEMU 7.2's user-mode emulator, the
    same TCG and plugin API as qemu-system, so no boot."""
    header = _cached_header()
    assert header is not None
    make = ["make", "-s", "-C", str(groundtruth.plugin_source_dir())]
    subprocess.run([*make, f"QEMU_PLUGIN_INCLUDE={header.parent}", f"O={tmp_path}"], check=True)
    (tmp_path / "undef.S").write_text(UNDEF_AT_EL0)
    program = tmp_path / "undef"
    gcc = ["aarch64-linux-gnu-gcc", "-nostdlib", "-static", "-o", str(program)]
    subprocess.run([*gcc, str(tmp_path / "undef.S")], check=True)
    log = tmp_path / "log.tkgt"
    plugin = f"file={tmp_path / groundtruth.PLUGIN},out={log},limit=4096"
    done = subprocess.run(["qemu-aarch64", "-plugin", plugin, str(program)], capture_output=True)
    assert done.returncode == -signal.SIGILL
    records = read_log(log).records
    assert records["operation"].to_list() == ["MARKER", "TLBI VMALLE1"]


# One VMM run of three MMU-on VMs on CPU 1, between two markers on CPU 0 that bound it on
# the trace clock (appended to the boot's marker file, so the clock fit pairs them too).
GT_CONFIG = "nvhe-a53"
GT_VMS = 3
register_vhost_check(
    GT_CONFIG,
    "groundtruth_vms",
    "G=/tracekit/reproducer/build/gtmark; "
    "$G --cpus 0 --rounds 1 | tee -a /out/vhost-gtmark.txt > window-start; "
    f"/tracekit/reproducer/build/vmm --cpus 1 --backing 4k --repeat {GT_VMS} "
    "/tracekit/reproducer/build/guests/mmu-on.elf > vmm.txt; status=$?; "
    "$G --cpus 0 --rounds 1 | tee -a /out/vhost-gtmark.txt > window-vms-end; "
    # Review of 15/17 #8: the 6.1 nVHE hotplug signature counted, not only read.
    "echo 0 > /sys/devices/system/cpu/cpu1/online && "
    "echo 1 > /sys/devices/system/cpu/cpu1/online || status=1; "
    "$G --cpus 0 --rounds 1 | tee -a /out/vhost-gtmark.txt > window-end; "
    "{ cp /sys/module/kvm/parameters/enable_virt_at_load . 2>/dev/null; true; }; "
    "cat /sys/devices/system/cpu/online > online; exit $status",
    first=True,  # before the boot's other VMs: a fresh 8-bit VMID generation, no rollover
)


def _within(frame: pl.DataFrame, windows: list[tuple[int, int]]) -> pl.DataFrame:
    """The rows whose trace time falls in one of the [start, end] windows."""
    inside = pl.lit(False)
    for start, end in windows:
        inside = inside | pl.col("ts").is_between(start, end)
    return frame.filter(inside)


@pytest.mark.vhost
def test_vhost_nvhe_6_1_vm_lifecycle_at_el2(vhost_boot) -> None:
    """bookworm 6.1 nVHE: each VM's creation re-initialises EL2 on every online CPU (TLBI
    ALLE2 + TLBI VMALLS12E1, local), its first vCPU run flushes the guest CPU's context
    (TLBI VMALLE1 + IC IALLU, local), and its teardown issues no invalidation at EL2;
    counts equal a model of the run, the VMM's VMs times the CPUs the kernel lists online,
    not an independent count of the same events (the rollover test below has one)."""
    truth, here, vms = _checked_boot(vhost_boot, GT_CONFIG, "groundtruth_vms")
    start = parse_gtmark((here / "window-start").read_text())["t0"][0]
    end = parse_gtmark((here / "window-vms-end").read_text())["t1"][0]
    plug_end = parse_gtmark((here / "window-end").read_text())["t1"][0]
    online = (here / "online").read_text().strip()
    cpus = len(parse_cpu_list(online))
    hyp = truth.table.filter(
        (pl.col("where") == "hyp")
        & pl.col("kind").is_in(["tlbi", "ic"])
        & pl.col("ts").is_between(start, end)
    )
    windows = _vm_windows(vms)
    creates, runs, teardowns = windows["create"], windows["run"], windows["teardown"]
    init = hyp.filter(pl.col("symbol").str.starts_with("__kvm_nvhe____kvm_hyp_init"))
    for operation in ("TLBI ALLE2", "TLBI VMALLS12E1"):
        mine = init.filter(pl.col("operation") == operation)
        assert mine.height == GT_VMS * cpus, operation
        assert mine.group_by("cpu").len()["len"].to_list() == [GT_VMS] * cpus
        assert _within(mine, creates).height == mine.height
    flush = hyp.filter(pl.col("symbol").str.starts_with("__kvm_nvhe___kvm_flush_cpu_context"))
    assert sorted(flush["operation"].to_list()) == ["IC IALLU"] * GT_VMS + ["TLBI VMALLE1"] * GT_VMS
    assert set(flush["cpu"]) == {1} and _within(flush, runs).height == flush.height
    assert hyp.height == init.height + flush.height  # nothing else at EL2, ALLE1(IS) included
    assert _within(hyp, teardowns).height == 0
    # A hotplug of the guest CPU with no VM alive: nothing at EL2 (6.1 kvm_starting_cpu
    # enables only with kvm_usage_count), and 6.1 has no kvm.enable_virt_at_load.
    plugged = truth.table.filter(
        (pl.col("where") == "hyp")
        & pl.col("kind").is_in(["tlbi", "ic"])
        & pl.col("ts").is_between(end, plug_end)
    )
    assert plugged.height == 0
    assert _virt_at_load(here) == "absent"
    # The VMM's sync markers (issue 15 point 3): each VM's create, run and teardown
    # marker pairs with the plugin's, within 100 us of the gtmark-only fit.
    syncs = parse_vmm_output((here / "vmm.txt").read_text()).syncs
    rows = [("vmm", int(x["cpu"]), int(x["t0"]), int(x["t1"])) for x in syncs]
    lines = pl.DataFrame(rows, schema=SYNC_SCHEMA, orient="row")
    synced = load_ground_truth(vhost_boot(GT_CONFIG).result.out_dir, sync=lines).fit.sync
    assert synced is not None and synced.paired == synced.lines == 3 * GT_VMS
    assert synced.max_error_ns < 100_000 and synced.max_residual_ns < 100_000
    hotplug = (end, plug_end)
    assert _signature_check(truth, vms, ("6.1", "nvhe"), cpus, hotplug, here) == ([], [])


BLOCK_POLARS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("polars", "numpy"):
            raise ImportError("the emulated host has no " + name)
sys.meta_path.insert(0, Block())
import tracekit.cli
"""


def test_cli_imports_without_polars() -> None:
    """The emulated host runs `python3 -m tracekit` without polars or numpy: importing the
    CLI (which imports the vhost runner) must not pull them in."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_POLARS],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.vhost
def test_vhost_nvhe_6_1_vmid_rollover_is_one_alle1is(vhost_boot) -> None:
    """bookworm 6.1 nVHE, 8-bit VMIDs (cortex-a53): the VMID rollover collect's check sees
    exactly one new generation, and EL2 executes exactly one TLBI ALLE1IS during that
    collect (`__kvm_flush_vm_context`), inside the rollover run, on the CPU the guests
    ran on."""
    boot = vhost_boot(GT_CONFIG)
    if "collect_rollover" not in boot.checks:
        pytest.skip("the rollover check is registered by tests/test_collect.py")
    assert boot.checks["collect_rollover"].status == 0
    bundle = boot.result.out_dir / "checks" / "collect_rollover" / "bundle"
    result = json.loads((bundle / "runs/after-guest-rollover/rollover.json").read_text())
    generations = {vmid >> result["vmid_bits"] for vmid in result["vmid_ids"]}
    _, given = bundle_ground_truth(bundle)
    # Within this collect's runs: later checks of the same boot (rollover-minus-one, the
    # campaign's cells) use up the next generation too and roll over again.
    alle1 = given.filter(
        (pl.col("where") == "hyp") & pl.col("operation").str.starts_with("TLBI ALLE1")
    )
    assert alle1.height == len(generations) - 1 == 1
    assert alle1["operation"][0] == "TLBI ALLE1IS"
    assert alle1["symbol"][0].startswith("__kvm_nvhe___kvm_flush_vm_context")
    mine = given.filter(pl.col("where") == "hyp", pl.col("operation") == "TLBI ALLE1IS")
    assert mine["run_id"].to_list() == ["after-guest-rollover"]
    assert [alle1["cpu"][0]] == read_manifest(bundle).options["guest_cpus"]
    # The whole bundle against the packaged signatures, as the report checks it: the guest
    # run's VM, the rollover's 256 VMs and its one ALLE1IS (not run in a boot yet: the
    # same checks passed on the saved nvhe-a53 boot's VMM run, tests/test_analysis_*).
    section = groundtruth_section([load_bundle(bundle)])
    assert section is not None and section.contradictions == [], section.contradictions
    _assert_61_rollover_vmids(bundle, result["vms"])


def _vmid_rows(bundle: Path) -> pl.DataFrame:
    """A bundle's EL2 invalidations with the VMIDs the report attributes to them."""
    data = load_bundle(bundle)
    found = data.ground_truth()
    assert found is not None
    rows = bundle_summary(data, found[1]).vmid_rows
    assert rows is not None
    return rows


def _assert_61_rollover_vmids(bundle: Path, vms: int) -> None:
    """6.1 nVHE: the guest run's first flush is VMID 0 (vcpu_load's flush, arm.c:425,
    comes before the run loop's kvm_arm_vmid_update, :929); the rollover's VMM writes no
    markers, so its VMs' flushes are no-markers, one per VM; the init VMALLS12E1 is 0 by
    the source; ALLE1IS, ALLE2, IC tag no VMID (tests/fixtures/gtvmid, cut from a saved
    boot of this check, holds the same)."""
    rows = _vmid_rows(bundle)
    flush = rows.filter(pl.col("operation") == "TLBI VMALLE1")
    guest = flush.filter(pl.col("run_id") == "guest")
    assert guest.select("vmid", "vmid_basis").rows() == [(0, "inferred")]
    rollover = flush.filter(pl.col("run_id") == "after-guest-rollover")
    assert rollover.height == vms and set(rollover["vmid_basis"]) == {"no-markers"}
    init = rows.filter(pl.col("operation") == "TLBI VMALLS12E1")
    assert set(init.select("vmid", "vmid_basis").rows()) == {(0, "source")}
    rest = rows.filter(~pl.col("operation").is_in(["TLBI VMALLE1", "TLBI VMALLS12E1"]))
    assert set(rest["vmid_basis"]) == {"not-vmid-scoped"}


def _assert_612_vmids(bundle: Path) -> None:
    """6.12 nVHE: each VM's first flush has the VMID its kvm_arm_vmid_update returned just
    before (arm.c:597 then :609 in 6.12.107), one VMID a VM, every one inferred within the
    bundle's own clock error; nothing else is VMID-scoped at EL2 there."""
    import tracekit

    rows = _vmid_rows(bundle)
    flush = rows.filter(pl.col("operation") == "TLBI VMALLE1")
    assert set(flush["vmid_basis"]) == {"inferred"}, flush.select("ts", "vmid_how").rows()
    returned: dict[str, list[int]] = {}
    for run in read_manifest(bundle).runs:
        ret = tracekit.open(bundle / "runs" / run.run_id / "trace").event("kvm_arm_vmid_update_ret")
        ids = ret.filter(pl.col("vmid_id") > 0)["vmid_id"].unique(maintain_order=True)
        returned[run.run_id] = [v & 0xFFFF for v in ids.to_list()]
    for run_id, ids in returned.items():
        mine = flush.filter(pl.col("run_id") == run_id).sort("ts")
        assert mine["vmid"].to_list() == ids, (run_id, mine["vmid"].to_list(), ids)
    rest = rows.filter(pl.col("operation") != "TLBI VMALLE1")
    assert set(rest["vmid_basis"]) == {"not-vmid-scoped"}


@pytest.mark.vhost
def test_vhost_trixie_6_12_first_flush_vmids(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    """trixie 6.12: on the teardown sweep's bundle (9 VMs, a traced run each), every VM's
    EL2 VMALLE1 is attributed the VMID its own update had just given it."""
    boot = vhost_boot("trixie-max")
    if "collect_teardown_trixie" not in boot.checks:
        pytest.skip("the teardown check is registered by tests/test_collect_scenarios.py")
    assert boot.checks["collect_teardown_trixie"].status == 0
    _assert_612_vmids(boot.result.out_dir / "checks" / "collect_teardown_trixie" / "bundle")


# VHE (bookworm 6.1 on max) and trixie 6.12 (nVHE forced on max): the same VMM run, then
# a hotplug of the guest CPU with no VM alive, each step bounded by markers on CPU 0.
LIFECYCLE_HOTPLUG = (
    "G=/tracekit/reproducer/build/gtmark; "
    "mark() { $G --cpus 0 --rounds 1 | tee -a /out/vhost-gtmark.txt > $1; }; "
    "mark window-start; "
    f"/tracekit/reproducer/build/vmm --cpus 1 --backing 4k --repeat {GT_VMS} "
    "/tracekit/reproducer/build/guests/mmu-on.elf > vmm.txt; status=$?; "
    "mark window-vms-end; "
    "echo 0 > /sys/devices/system/cpu/cpu1/online && "
    "echo 1 > /sys/devices/system/cpu/cpu1/online || status=1; "
    "mark window-end; "
    "{ cp /sys/module/kvm/parameters/enable_virt_at_load . 2>/dev/null; true; }; "
    "cat /sys/devices/system/cpu/online > online; exit $status"
)
for _config in ("vhe-max", "trixie-max"):
    # First: its "boot" window (before its start marker) must hold no other check's VMs.
    register_vhost_check(_config, "groundtruth_lifecycle", LIFECYCLE_HOTPLUG, first=True)


def _mark(here: Path, name: str) -> int:
    """The trace time of the marker a check wrote to `name`."""
    return int(parse_gtmark((here / name).read_text())["t0"][0])


def _vm_windows(vms: pl.DataFrame) -> dict[str, list[tuple[int, int]]]:
    """Each VM's create, run and teardown windows (VMM clock = trace clock)."""
    rows = list(vms.iter_rows(named=True))
    creates = [(r["create_start_ns"], r["create_start_ns"] + r["create_ns"]) for r in rows]
    runs = [(b, b + r["run_ns"]) for (_, b), r in zip(creates, rows, strict=True)]
    teardowns = [(r["teardown_end_ns"] - r["teardown_ns"], r["teardown_end_ns"]) for r in rows]
    return {"create": creates, "run": runs, "teardown": teardowns}


def _checked_boot(vhost_boot, config: str, name: str = "groundtruth_lifecycle"):
    """A check's boot: its ground truth (nothing lost in any way the log can say: not
    written, never filled, never tracked), its directory and the VMM's VMs (all ok)."""
    boot = vhost_boot(config)
    check = boot.checks[name]
    assert check.status == 0, check.stderr
    here = boot.result.out_dir / "checks" / name
    truth = load_ground_truth(boot.result.out_dir)
    assert truth.header.not_written == 0 and truth.unfilled == 0 and truth.header.complete
    assert truth.header.untracked_sites == 0 and truth.fit.max_residual_ns < 100_000
    vms = parse_vmm_output((here / "vmm.txt").read_text()).vms
    assert vms.height == GT_VMS and set(vms["result"]) == {"ok"}
    return truth, here, vms


def _virt_at_load(here: Path) -> str:
    """kvm.enable_virt_at_load as the check copied it (the collector's own reader)."""
    return read_enable_virt_at_load(here / "enable_virt_at_load")


def _signature_check(
    truth,
    vms: pl.DataFrame,
    setup: tuple[str, str],
    cpus: int,
    hotplug: tuple[int, int] | None = None,
    here: Path | None = None,
) -> tuple[list[str], list[str]]:
    """The packaged signatures (tracekit/analysis/gtsignatures.toml) against this boot's
    VM steps (and hotplug of CPU 1): the findings and the steps no signature covers;
    kvm.enable_virt_at_load as the check in `here` read it."""
    steps = gta.vm_steps(vms, "check")
    if hotplug is not None:
        steps = pl.concat([steps, gta.action_step("check", "hotplug", *hotplug)])
    given = truth.table.with_columns(run_id=pl.lit("check"), phase=pl.lit("check"))
    context = gta.StepContext(tuple(range(cpus)), (1,), (1,))
    facts = {"enable_virt_at_load": _virt_at_load(here)} if here is not None else {}
    signatures = packaged_signatures()
    summary = gta.summarise(given, steps, signatures, (*setup, "max"), context, {}, [], None, facts)
    return summary.findings, summary.uncovered


def _invalidations(frame: pl.DataFrame) -> pl.DataFrame:
    """TLBI and IC IALLU(IS) rows."""
    return frame.filter(pl.col("kind").is_in(["tlbi", "tlbi-nxs", "ic"]))


def _function() -> pl.Expr:
    """The symbol's function (before '+')."""
    return pl.col("symbol").fill_null("").str.split("+").list.first()


@pytest.mark.vhost
def test_vhost_vhe_6_1_lifecycle_and_hotplug(vhost_boot) -> None:
    """bookworm 6.1 VHE (max): no hypervisor text runs; of KVM's own code only the first
    run's `__kvm_flush_cpu_context` invalidates (TLBI VMALLE1 + IC IALLU on the guest CPU,
    once per VM, acting on the guest's EL1&0: KVM's VHE TLB helpers clear TGE); VM creation,
    teardown and a hotplug with no VM alive run no KVM invalidation (6.1 cpu_hyp_reinit
    has no cpu_init_hyp_mode in VHE; kvm_starting_cpu enables nothing with no VM)."""
    truth, here, vms = _checked_boot(vhost_boot, "vhe-max")
    assert truth.vhe
    start, vms_end, end = (_mark(here, n) for n in ("window-start", "window-vms-end", "window-end"))
    inv = _invalidations(truth.table).with_columns(function=_function())
    window = inv.filter(pl.col("ts").is_between(start, end))
    assert window.filter(pl.col("where") == "hyp").height == 0
    kvm = window.filter(pl.col("function").str.contains(r"^_*kvm"))
    assert set(kvm["function"]) == {"__kvm_flush_cpu_context"}
    assert sorted(kvm["operation"]) == ["IC IALLU"] * GT_VMS + ["TLBI VMALLE1"] * GT_VMS
    assert set(kvm["cpu"]) == {1} and kvm["ts"].max() < vms_end
    assert set(kvm.filter(pl.col("kind") == "tlbi")["regime"]) == {"EL1&0"}
    steps = _vm_windows(vms)
    assert _within(kvm, steps["run"]).height == kvm.height
    # The host's own TLBIs (EL2&0 in VHE) run throughout; none of them is KVM's.
    assert set(
        window.filter(pl.col("kind") == "tlbi", pl.col("function") != "__kvm_flush_cpu_context")[
            "regime"
        ]
    ) == {"EL2&0"}


@pytest.mark.vhost
def test_vhost_trixie_6_12_nvhe_lifecycle_and_hotplug(vhost_boot) -> None:
    """trixie 6.12 nVHE (max): EL2 is initialised at boot (`___kvm_hyp_init`: TLBI ALLE2 +
    TLBI ALLE1, local, twice on each CPU), not at VM creation; a VM's first run flushes the
    guest CPU (`__kvm_flush_cpu_context`: TLBI VMALLE1 + IC IALLU) once per VM; teardown
    runs nothing at EL2; a hotplug with no VM alive re-initialises EL2 on the re-plugged
    CPU only: one TLBI ALLE2 + one TLBI ALLE1 there."""
    truth, here, vms = _checked_boot(vhost_boot, "trixie-max")
    assert not truth.vhe and truth.kvm_mode == "nvhe"
    start, vms_end, end = (_mark(here, n) for n in ("window-start", "window-vms-end", "window-end"))
    cpus = len(parse_cpu_list((here / "online").read_text().strip()))
    hyp = _invalidations(truth.table).filter(pl.col("where") == "hyp")
    hyp = hyp.with_columns(function=_function())
    boot = hyp.filter(pl.col("ts") < start)
    assert set(boot["function"]) == {"__kvm_nvhe____kvm_hyp_init"}
    counts = boot.group_by("cpu", "operation").len().sort("cpu", "operation")
    assert counts.rows() == [
        (cpu, op, 2) for cpu in range(cpus) for op in ("TLBI ALLE1", "TLBI ALLE2")
    ]
    vm = hyp.filter(pl.col("ts").is_between(start, vms_end))
    assert set(vm["function"]) == {"__kvm_nvhe___kvm_flush_cpu_context"}
    assert sorted(vm["operation"]) == ["IC IALLU"] * GT_VMS + ["TLBI VMALLE1"] * GT_VMS
    assert set(vm["cpu"]) == {1} and _within(vm, _vm_windows(vms)["run"]).height == vm.height
    plug = hyp.filter(pl.col("ts").is_between(vms_end, end))
    assert set(plug["function"]) == {"__kvm_nvhe____kvm_hyp_init"}
    assert sorted(plug.select("cpu", "operation").rows()) == [(1, "TLBI ALLE1"), (1, "TLBI ALLE2")]
    # The reason the 6.12 signatures require (review of 15/17 #6): read in this boot.
    assert _virt_at_load(here) == "yes"
    hotplug = (vms_end, end)
    assert _signature_check(truth, vms, ("6.12", "nvhe"), cpus, hotplug, here) == ([], [])
