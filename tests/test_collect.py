"""`tracekit collect`: option checks here, the whole collection in the emulated host.

The emulated-host checks join the nVHE cortex-a76 boot (4 CPUs, CPU 3 isolated) that
the other end-to-end tests share: one complete collection with a CPU hotplug after the
guest, and one interrupted by SIGINT in the middle of a traced run. tracefs settings are
snapshotted before and after each, inside the host.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import VhostBoot, register_vhost_check

from tracekit.bundle import read_manifest, verify_files
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.host.protocol import SCENARIOS
from tracekit.host.runners import guest_settings, rollover_argv
from tracekit.host.tools import ToolPaths

NVHE = "nvhe-a76"
ROLES = ["collect", "--rt-cpu", "1", "--stress-cpus", "0", "--guest-cpu", "0"]
REPRODUCER_BUILD = Path(__file__).resolve().parent.parent / "reproducer" / "build"

SNAPSHOT = (
    "python3 -c 'import json, pathlib; from tracekit.host.tracefs import snapshot; "
    'print(json.dumps(snapshot(pathlib.Path("/sys/kernel/tracing")), sort_keys=True))\''
)
COLLECT = (
    "python3 -m tracekit collect --rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1 "
    "--traced-runs 1 --duration 3"
)

register_vhost_check(
    NVHE,
    "collect_main",
    f"{SNAPSHOT} > before.json; cat /sys/devices/system/cpu/online > online-before; "
    f"{COLLECT} --runs 2 --after-guest hotplug --perf-counters -o bundle; status=$?; "
    f"{SNAPSHOT} > after.json; cat /sys/devices/system/cpu/online > online-after; "
    "exit $status",
)
# SIGINT once the first traced run is under way (its progress line is printed first).
register_vhost_check(
    NVHE,
    "collect_sigint",
    f"{SNAPSHOT} > before.json; "
    f"{COLLECT} --runs 1 -o bundle > progress.txt 2>&1 & pid=$!; "
    "i=0; until grep -q before-traced-0 progress.txt || [ $i -ge 600 ]; do "
    "sleep 0.5; i=$((i+1)); done; sleep 2; kill -INT $pid; wait $pid; "
    "echo status=$? > collect-status; "
    f"{SNAPSHOT} > after.json; ls /sys/kernel/tracing/instances > instances-after; "
    "grep -c tracekit /sys/kernel/tracing/kprobe_events > kprobes-after; exit 0",
)

# hotplug's negative control (issue 17 point 12), with the probe's range slots on both
# sides of the kernel's 512-page by-VA limit (point 7): one short collect after the main
# one (the host is no longer fresh: --allow-dirty). Session 10's boot chose CPU 0 for
# hotplug-other, which nohz_full keeps online (EBUSY): the control is now CPU 2, not
# booted yet. Its before phase's range slots were counted there: 511 pages 1023-1040
# by-VA TLBIs and 0.02-0.11 ASIDE1IS per call, 513 pages 2.0 ASIDE1IS and 1.0-3.2 by-VA.
# The same collect is tests/test_collect_tracecmd.py's `--capture trace-cmd` collection
# (one quiet and one traced run a phase; its tests read the capture, these the action and
# the probe slots): one collect's start, guest and end less in the boot (~100 s).
HOTPLUG_OTHER = "collect_hotplug_other"
register_vhost_check(
    NVHE,
    HOTPLUG_OTHER,
    f"{SNAPSHOT} > before.json; "
    "python3 -m tracekit collect --rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1 --runs 1 "
    "--traced-runs 1 --duration 2 --after-guest hotplug-other --probe-modes page,range "
    "--probe-pages 511,513 --capture trace-cmd --allow-dirty -o bundle; status=$?; "
    f"{SNAPSHOT} > after.json; exit $status",
)

# The ground-truth check runs its VMs before this one (first=True), so the host is not fresh
# (6.1 keeps a dead VM's VMID in the allocator's map until a rollover): --allow-dirty. What
# this check asserts is relative (a newer generation than the first VMID it saw), so where
# the count starts does not matter; its before phase is not a fresh host's. Both rollover
# collects' tests read the after-guest run and the runs' order, never the quiet runs' or
# probe slots' numbers: one second each.
register_vhost_check(
    "nvhe-a53",
    "collect_rollover",
    f"{SNAPSHOT} > before.json; "
    "python3 -m tracekit collect --rt-cpu 1 --stress-cpus 0 --guest-cpu 0 --runs 1 "
    "--traced-runs 0 --duration 1 --after-guest rollover --rollover-max-vms 1024 "
    "--allow-dirty -o bundle; "
    f"status=$?; {SNAPSHOT} > after.json; exit $status",
)

# rollover's control: the same VMs but one, so no rollover (another check may have rolled
# the VMIDs over already: the host is not fresh, and the count starts where they are).
register_vhost_check(
    "nvhe-a53",
    "collect_rollover_minus_one",
    "python3 -m tracekit collect --rt-cpu 1 --stress-cpus 0 --guest-cpu 0 --runs 1 "
    "--traced-runs 0 --duration 1 --after-guest rollover-minus-one --rollover-max-vms 1024 "
    "--allow-dirty -o bundle",
)


def _check_dir(boot: VhostBoot, name: str) -> Path:
    """The host-side directory of one batched check, which must have finished."""
    if not (REPRODUCER_BUILD / "vmm").is_file():
        pytest.skip("reproducer/build is missing: make -C reproducer CROSS_COMPILE=aarch64-...")
    check = boot.checks[name]
    assert check.status >= 0, f"{name} never finished:\n{check.stdout}\n{check.stderr}"
    return boot.result.out_dir / "checks" / name


@pytest.mark.vhost
def test_collect_makes_a_complete_bundle(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    boot = vhost_boot(NVHE)
    here = _check_dir(boot, "collect_main")
    check = boot.checks["collect_main"]
    assert check.status == 0, check.stdout + check.stderr
    manifest = read_manifest(here / "bundle")
    assert manifest.complete
    assert verify_files(here / "bundle", manifest) == []
    assert manifest.host["emulated"] is True
    kinds = [(r.phase, r.kind) for r in manifest.runs]
    assert kinds.count(("before", "quiet")) == 2 and kinds.count(("after", "quiet")) == 2
    assert ("guest", "guest") in kinds and ("guest", "after-guest") in kinds
    assert all(r.status == "ok" and r.start_ns and r.end_ns for r in manifest.runs)
    # The host is left as it was: tracefs settings, instances, kprobes, CPUs online.
    assert json.loads((here / "before.json").read_text()) == json.loads(
        (here / "after.json").read_text()
    )
    assert (here / "online-before").read_text() == (here / "online-after").read_text()
    assert "offline" in (here / "bundle/runs/after-guest-hotplug/hotplug.txt").read_text()
    # Issue 17 point 10: no EL2-only function is kprobed, and the callers named as probed
    # in their place are the ones 6.1 defines (not 6.12's kvm_arch_flush_remote_tlbs).
    unseen = manifest.scenario["el2_unseen"]
    assert set(unseen) == {"__kvm_tlb_flush_vmid", "__kvm_flush_vm_context"}
    assert unseen["__kvm_tlb_flush_vmid"].endswith(
        "probed instead: kvm_flush_remote_tlbs, kvm_pgtable_stage2_map"
    )
    targets = {line.split()[1] for line in manifest.scenario["kprobes"]}
    assert not targets & set(unseen) and "kvm_flush_remote_tlbs" in targets
    # The ground truth (the boot loads the plugin): every step the 6.1 nVHE signatures
    # cover (the guest's create, run and teardown, the hotplug with no VM alive) executed
    # at EL2 what its signature says, and none is left unchecked.
    _, truth = _checked_truth(here / "bundle")
    assert any("every checked step executed" in line for line in truth.findings), truth.findings


@pytest.mark.vhost
def test_collect_records_what_the_analyses_need(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    import polars as pl

    import tracekit

    boot = vhost_boot(NVHE)
    runs = _check_dir(boot, "collect_main") / "bundle" / "runs"
    for phase in ("before", "after"):
        trace = tracekit.open(runs / f"{phase}-traced-0" / "trace")
        names = set(trace.events["event"].cast(pl.String).unique())
        for needed in ("sched_switch", "sched_waking", "irq_handler_entry"):
            assert needed in names, f"{phase}: no {needed}"
        assert {"hrtimer_expire_entry", "sys_enter_mprotect", "print"} <= names
        assert (runs / f"{phase}-quiet-0" / "cyclictest.json").stat().st_size > 0
        assert "tlb-shootdown" in (runs / f"{phase}-quiet-0" / "stress-ng.yaml").read_text()
        perf = (runs / f"{phase}-quiet-0" / "perf-stat.csv").read_text()
        assert ",cycles," in perf and ",instructions," in perf
        # The rt CPU and the CPU that ran the guest (where the brief puts the state) each
        # have a probe slot (issue 17 point 9).
        for cpu in (3, 1):
            probe = json.loads((runs / f"{phase}-probe-page-cpu{cpu}" / "probe.json").read_text())
            assert probe["count"] > 0 and probe["cpu"] == cpu
    guest = tracekit.open(runs / "guest" / "trace")
    names = set(guest.events["event"].cast(pl.String).unique())
    assert {"kvm_entry", "kvm_exit", "kvm_arm_vmid_update", "kvm_free_stage2_pgd"} <= names
    markers = guest.event("print")["buf"].to_list()
    lifecycle = [m for m in markers if m.startswith("tracekit-vmm:")]
    assert any("event=create" in m for m in lifecycle)
    assert any("event=teardown-end" in m for m in lifecycle)
    assert "record=vm" in (runs / "guest" / "vmm.txt").read_text()


@pytest.mark.vhost
def test_ingest_of_the_collected_bundle(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    """`tracekit ingest BUNDLE`: every traced run, in its phase, EMULATED said first."""
    import polars as pl

    import tracekit

    bundle = _check_dir(vhost_boot(NVHE), "collect_main") / "bundle"
    result = CliRunner().invoke(main, ["ingest", str(bundle)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("EMULATED HOST")
    trace = tracekit.open(bundle)  # from the caches the command left in the bundle
    assert trace.from_cache
    with_trace = [r["run_id"] for r in trace.meta["runs"]]
    assert {"before-traced-0", "guest", "after-traced-0"} <= set(with_trace)
    for run in with_trace:
        assert f"  {run} " in result.output
    kvm = trace.event("kvm_entry").group_by(pl.col("phase").cast(pl.String)).len()
    assert "guest" in dict(kvm.iter_rows())  # the guest ran in the guest phase
    assert "cyclictest_samples" in trace.tools and "probe" in trace.tools


@pytest.mark.vhost
def test_report_on_the_collected_bundle(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    boot = vhost_boot(NVHE)
    bundle = _check_dir(boot, "collect_main") / "bundle"
    result = CliRunner().invoke(main, ["report", str(bundle)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("EMULATED HOST")
    assert "KVM nvhe" in result.output and "Cortex-A76" in result.output
    assert "cyclictest p99.9 after/before" in result.output
    # 2 quiet runs per phase cannot carry a verdict; under a saturated rt CPU no run count can.
    flat = " ".join(result.output.split())
    if "rt CPU is saturated" in flat:
        assert "no run count makes this a verdict" in flat
        assert "cyclictest p99.9 after/before" in flat.split("no run count")[0]
    else:
        assert "needs 4+4 runs" in flat
    assert "lost events: " in result.output
    assert "internal error" not in result.output  # every section built on real data


def _checked_truth(bundle: Path) -> tuple[Any, Any]:
    """A bundle and its ground-truth section, which must hold no contradiction and leave
    no step unchecked against a signature."""
    from tracekit.ingest.bundle import load_bundle
    from tracekit.report.sections.groundtruth import section as groundtruth_section

    data = load_bundle(bundle)
    truth = groundtruth_section([data])
    assert truth is not None and truth.contradictions == [], truth.contradictions
    assert not [line for line in truth.unknowns if "not checked against a signature" in line]
    return data, truth


@pytest.mark.vhost
def test_hotplug_other_is_the_control_cpus_and_checked(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    """hotplug-other power-cycles the last stress CPU that did not run the guest (2, not
    the guest's 1, nor the timekeeping CPU 0 nohz_full keeps online), and 6.1 nVHE with no
    VM alive runs nothing at EL2 for it."""
    boot = vhost_boot(NVHE)
    here = _check_dir(boot, "collect_hotplug_other")
    check = boot.checks["collect_hotplug_other"]
    assert check.status == 0, check.stdout + check.stderr
    manifest = read_manifest(here / "bundle")
    assert manifest.complete and manifest.scenario["action_cpus"] == [2]
    assert "cpu2" in (here / "bundle/runs/after-guest-hotplug-other/hotplug.txt").read_text()
    _, truth = _checked_truth(here / "bundle")
    assert any("every checked step executed" in line for line in truth.findings), truth.findings


@pytest.mark.vhost
def test_range_slots_issue_by_va_below_the_limit_and_one_asid_flush_above(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    """Issue 17 point 7 on cortex-a76 (no FEAT_TLBIRANGE), 6.1: an mprotect of 511 pages is
    one TLBI VALE1IS per page, of 513 one TLBI ASIDE1IS (6.1.176 asm/tlbflush.h
    __flush_tlb_range: `(end - start) >= MAX_TLBI_OPS * stride` -> flush_tlb_mm), as the
    ground truth counted them on the slot's own CPU. Per call a page may be invalidated
    twice (KPTI's user ASID) and the REPEAT_TLBI workaround adds one VALE1IS per
    completion, so the bounds are >= 511 and a few, never exact counts. The slot's process
    also flushes its whole ASID a few times of its own (exec and exit: 2-4 per slot here),
    which a slot of 8 samples reads as 0.5 per call, so no per-call bound is put on the
    511-page slots' ASID flushes: page-by-page invalidation (>= 511 by VA per call, a slot's
    mean) and the 513-page calls' ASID flush (and no page-by-page) are what is asserted."""
    from tracekit.analysis.groundtruth import invalidations, probe_slot_tlbis

    here = _check_dir(vhost_boot(NVHE), "collect_hotplug_other")
    data, _ = _checked_truth(here / "bundle")
    assert read_manifest(here / "bundle").scenario["probe_modes"] == ["page", "range"]
    found = data.ground_truth()
    assert found is not None
    slots = probe_slot_tlbis(invalidations(found[1]), data.probes)
    ranged = slots.filter(mode="range")
    assert sorted(set(ranged["pages"])) == [511, 513] and ranged.height == 2 * 2 * 3
    for slot in ranged.iter_rows(named=True):
        assert slot["count"] > 0 and slot["by_range"] == 0, slot  # no FEAT_TLBIRANGE
        if slot["pages"] == 511:
            assert slot["by_va"] >= 511, slot
        else:
            assert slot["whole_asid"] >= 1 and slot["by_va"] < 64, slot


@pytest.mark.vhost
def test_sigint_restores_tracefs_and_marks_incomplete(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    boot = vhost_boot(NVHE)
    here = _check_dir(boot, "collect_sigint")
    assert (here / "collect-status").read_text().strip() == "status=130"
    assert json.loads((here / "before.json").read_text()) == json.loads(
        (here / "after.json").read_text()
    )
    assert "tracekit" not in (here / "instances-after").read_text()
    assert (here / "kprobes-after").read_text().strip() == "0"
    manifest = read_manifest(here / "bundle")
    assert not manifest.complete
    assert "interrupted" in manifest.incomplete_reason
    assert manifest.runs[-1].status == "interrupted"


def _after_guest_vmids(
    boot: VhostBoot, name: str, action: str, says: str
) -> tuple[Path, dict[str, Any], list[int]]:
    """A rollover check's directory, its rollover.json and the VMID generations traced."""
    import polars as pl

    import tracekit

    here = _check_dir(boot, name)
    check = boot.checks[name]
    assert check.status == 0, check.stdout + check.stderr
    assert says in check.stdout
    run = here / f"bundle/runs/after-guest-{action}"
    result = json.loads((run / "rollover.json").read_text())
    assert result["vmid_bits"] == 8
    updates = tracekit.open(run / "trace").event("kvm_arm_vmid_update")
    ids = updates.filter(pl.col("vmid_id") > 0)["vmid_id"].to_list()
    return here, result, [i >> 8 for i in ids]


@pytest.mark.vhost
def test_rollover_is_seen_in_the_trace(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    boot = vhost_boot("nvhe-a53")
    here, result, generations = _after_guest_vmids(
        boot, "collect_rollover", "rollover", "rollover seen after"
    )
    ids = result["vmid_ids"]
    assert max(i >> 8 for i in ids) > min(i >> 8 for i in ids)  # a newer generation
    assert max(generations) > min(generations), "the rollover is visible in the trace"
    assert json.loads((here / "before.json").read_text()) == json.loads(
        (here / "after.json").read_text()
    )


@pytest.mark.vhost
def test_rollover_minus_one_uses_up_the_vmids_without_a_rollover(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    boot = vhost_boot("nvhe-a53")
    says = "the generation's VMIDs used up, no rollover (8-bit VMIDs)"
    here, result, generations = _after_guest_vmids(
        boot, "collect_rollover_minus_one", "rollover-minus-one", says
    )
    ids = result["vmid_ids"]
    assert result["rolled_over"] is False
    assert len({i >> 8 for i in ids}) == 1 and max(i & 0xFF for i in ids) == 0xFF
    assert result["vms"] == 0xFF - (ids[0] & 0xFF) + 1  # from the first VM's VMID to 255
    assert min(generations) == max(generations), "no rollover in the trace either"
    runs = {run.run_id: run for run in read_manifest(here / "bundle").runs}
    # The traced after-guest run read its kprobes' misses (kprobe_profile).
    misses = runs["after-guest-rollover-minus-one"].probe_misses
    assert misses is not None and "tracekit/kvm_arm_vmid_update" in misses
    assert all(count >= 0 for count in misses.values())
    # Runs after the guest say how long after it they started, later ones later.
    assert runs["before-quiet-0"].since_guest_ns is None
    after = [r.since_guest_ns for r in runs.values() if r.phase == "after"]
    assert after and all(t is not None and t > 0 for t in after) and after == sorted(after)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rt-cpu", "1", "--stress-cpus", "0-1", "--guest-cpu", "0"], "also a stress CPU"),
        (["--rt-cpu", "1", "--stress-cpus", "0", "--guest-cpu", "1"], "also a guest CPU"),
        (["--rt-cpu", "0-1", "--stress-cpus", "0", "--guest-cpu", "0"], "exactly one CPU"),
        (["--rt-cpu", "99", "--stress-cpus", "0", "--guest-cpu", "0"], "not online"),
        (["--rt-cpu", "x", "--stress-cpus", "0", "--guest-cpu", "0"], "bad CPU list"),
    ],
)
def test_bad_options_are_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["collect", *args, "-o", str(tmp_path / "b")])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "b").exists()


def test_unknown_guest_is_rejected(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [*ROLES, "--guest", str(tmp_path / "nope.elf"), "-o", str(tmp_path / "b")],
    )
    assert result.exit_code == 2
    assert "nope.elf not found" in result.output


def test_dry_run_prints_the_plan(tmp_path: Path) -> None:
    if not (REPRODUCER_BUILD / "guests" / "mmu-on.elf").is_file():
        pytest.skip("reproducer/build is missing: make -C reproducer CROSS_COMPILE=aarch64-...")
    result = CliRunner().invoke(
        main,
        [*ROLES, "--runs", "1", "--traced-runs", "0", "--dry-run", "-o", str(tmp_path / "b")],
    )
    assert result.exit_code == 0, result.output
    assert "variant mmu-on" in result.output
    assert "before-quiet-0" in result.output and "guest" in result.output
    assert not (tmp_path / "b").exists()


def test_probe_modes_make_range_slots_on_both_sides_of_the_limit(tmp_path: Path) -> None:
    """Issue 17 point 7: --probe-modes reaches the plan, and --probe-pages is then taken;
    without a range or munmap mode, or with an unknown mode, one line says what to do."""
    if not (REPRODUCER_BUILD / "guests" / "mmu-on.elf").is_file():
        pytest.skip("reproducer/build is missing: make -C reproducer CROSS_COMPILE=aarch64-...")
    argv = [*ROLES, "--runs", "1", "--traced-runs", "0", "--dry-run", "-o", str(tmp_path / "b")]
    result = CliRunner().invoke(main, [*argv, "--probe-modes", "page,range"])
    assert result.exit_code == 0, result.output
    for slot in ("before-probe-page-cpu1", "before-probe-range-511p-cpu1", "range-513p-cpu1"):
        assert slot in result.output
    assert "range-1p-" in result.output  # the default counts: 1, 511, 513
    result = CliRunner().invoke(
        main, [*argv, "--probe-modes", "munmap", "--probe-pages", "511,513"]
    )
    assert result.exit_code == 0, result.output
    assert "munmap-513p-cpu1" in result.output and "probe-page-" not in result.output
    assert "munmap-1p-" not in result.output
    for bad, says in (
        (["--probe-pages", "511"], "add --probe-modes page,range"),
        (["--probe-modes", "page,tlbi"], "--probe-modes page,tlbi: name each of"),
        (["--probe-modes", "range,range"], "at most once"),
    ):
        result = CliRunner().invoke(main, [*argv, *bad])
        assert result.exit_code == 2 and says in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_bad_probe_args_file_is_rejected_before_anything(tmp_path: Path) -> None:
    bad = tmp_path / "vmid.args"
    bad.write_text("kvm_arm_vmid_update vmid=+0(%x0):u64\n")  # no format header
    result = CliRunner().invoke(
        main, [*ROLES, "--probe-args", str(bad), "--dry-run", "-o", str(tmp_path / "b")]
    )
    assert result.exit_code == 2
    assert "probe-args" in result.output and "Traceback" not in result.output


def test_a_real_run_off_arm64_is_refused_in_one_line(tmp_path: Path) -> None:
    if platform.machine() in ("aarch64", "arm64"):
        pytest.skip("this machine is arm64: a real run is allowed here")
    result = CliRunner().invoke(main, [*ROLES, "-o", str(tmp_path / "b")])
    assert result.exit_code == 2, result.output
    assert "not arm64" in result.output and "--dry-run" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_a_loop_guest_without_a_count_is_refused(tmp_path: Path) -> None:
    """`--guest tlbi-loop.elf` in the main scenario used to run 0 TLBIs silently."""
    loop = REPRODUCER_BUILD / "guests" / "tlbi-loop.elf"
    if not loop.is_file():
        pytest.skip("reproducer/build is missing: make -C reproducer CROSS_COMPILE=aarch64-...")
    argv = [*ROLES, "--guest", str(loop), "--dry-run", "-o", str(tmp_path / "b")]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2 and "give --tlbi-count N" in result.output
    result = CliRunner().invoke(main, [*argv, "--tlbi-count", "1000"])
    assert result.exit_code == 0, result.output


def test_a_knob_guest_that_would_issue_no_tlbi_is_refused(tmp_path: Path) -> None:
    """Review of 17, point 20: `--knob tlbi=vmalle1is` with no count issued none silently."""
    if not (REPRODUCER_BUILD / "guests" / "mmu-on.elf").is_file():
        pytest.skip("reproducer/build is missing: make -C reproducer CROSS_COMPILE=aarch64-...")
    argv = [*ROLES, "--dry-run", "-o", str(tmp_path / "b"), "--knob", "tlbi=vmalle1is"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2 and "TLBI count of 0" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    for count in (["--knob", "tlbi_count=4"], ["--tlbi-count", "4"]):
        result = CliRunner().invoke(main, [*argv, *count])
        assert result.exit_code == 0, result.output
    # The preset's own count (mmu-on-vmalle1: 1) stands; a --knob of 0 overrides it.
    preset = [
        *ROLES,
        "--dry-run",
        "--guest",
        str(REPRODUCER_BUILD / "guests" / "mmu-on-vmalle1.elf"),
    ]
    assert CliRunner().invoke(main, [*preset, "-o", str(tmp_path / "c")]).exit_code == 0
    zero = [*preset, "-o", str(tmp_path / "d"), "--knob", "tlbi_count=0"]
    assert CliRunner().invoke(main, zero).exit_code == 2
    # tlbi-loop counts through its knob too, without --tlbi-count.
    loop = [*ROLES, "--dry-run", "--guest", str(REPRODUCER_BUILD / "guests" / "tlbi-loop.elf")]
    result = CliRunner().invoke(main, [*loop, "-o", str(tmp_path / "e"), "--knob", "tlbi_count=9"])
    assert result.exit_code == 0, result.output


def test_every_guest_parameter_reaches_the_vmm() -> None:
    """A guest run outside a sweep passes the scenario's parameters, defaults included."""
    params = SCENARIOS["main"].defaults.merged(tlbi_count=1000, touch_kb=(4096,))
    argv = guest_settings(params, timeout=600)
    assert argv == ["--touch-kb", "4096", "--tlbi-count", "1000", "--timeout", "600"]
    sweep = guest_settings(params, ipa_bits=44, ram_mb=16, touch_kb=0, timeout=0)
    assert sweep[:4] == ["--ipa-bits", "44", "--touch-kb", "0"]
    # A sweep's several values never reach the one-value check (the point has its own).
    swept = SCENARIOS["teardown"].defaults.merged(ipa_bits=(32, 36, 40))
    assert guest_settings(swept, ipa_bits=36, touch_kb=0)[:2] == ["--ipa-bits", "36"]
    with pytest.raises(TracekitError, match="give one value"):
        SCENARIOS["main"].defaults.merged(vcpus=(1, 2)).single("vcpus")


def test_guest_knobs_and_backing_reach_the_plan_and_bad_ones_are_one_line(tmp_path: Path) -> None:
    if not (REPRODUCER_BUILD / "guests" / "mmu-on.elf").is_file():
        pytest.skip("reproducer/build is missing: make -C reproducer CROSS_COMPILE=aarch64-...")
    argv = [*ROLES, "--dry-run", "-o", str(tmp_path / "b")]
    result = CliRunner().invoke(main, [*argv, "--knob", "pages=64", "--backing", "thp"])
    assert result.exit_code == 0, result.output
    assert "--knob pages=64 --backing thp" in result.output
    assert "--backing 4k" in CliRunner().invoke(main, argv).output  # the default, stated
    for bad in ("pages", "nosuch=1"):
        result = CliRunner().invoke(main, [*argv, "--knob", bad])
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1


def test_rollover_vms_get_the_guests_backing_and_no_knobs() -> None:
    """Review of 17, point 10: the throwaway VMs ran with the VMM's default backing."""
    tools = ToolPaths("cyclictest", "stress-ng", "vmm", "tlbiprobe", None)
    argv = rollover_argv(tools, Path("mmu-off.elf"), (1, 2), "thp", 64)
    assert argv[argv.index("--backing") + 1] == "thp"
    assert argv[argv.index("--repeat") + 1] == "64" and argv[-1] == "mmu-off.elf"
    assert "--knob" not in argv and "--preset" not in argv
    with pytest.raises(TracekitError, match="backing"):
        rollover_argv(tools, Path("mmu-off.elf"), (1,), "huge", 1)


def test_budget_counts_the_vms_of_knob_guests(tmp_path: Path) -> None:
    """A knob guest's record=vm line goes on after `result`: its VMs count (0 did)."""
    from tracekit.host.guestruns import vms_recorded

    out = tmp_path / "vmm.txt"
    out.write_text(
        "record=run variant=mmu-off\n"
        "record=vm vm=0 ipa_bits=40 result=ok sctlr_on=0x0 pages_read=0 tlbis=0\n"
        "record=vm vm=1 ipa_bits=40 result=ok\n"
        "record=vm vm=2 ipa_bits=40 result=stopped sctlr_on=0x0\n"
    )
    assert vms_recorded(out) == 2


def test_every_guest_run_gets_the_knobs_and_backing_before_the_guest(tmp_path: Path) -> None:
    """The one VMM command line of guest runs: settings, then knobs and backing, then ELF."""
    from types import SimpleNamespace

    from tracekit.host.runners import guest_argv
    from tracekit.host.tools import ToolPaths

    tools = ToolPaths("cyclictest", "stress-ng", "vmm", "tlbiprobe", None)
    session = SimpleNamespace(
        tools=tools,
        guest_path=tmp_path / "mmu-on.elf",
        roles=SimpleNamespace(guest_cpus=(1,)),
        trace_marker=lambda: None,
        guest_options=["--knob", "pages=64", "--backing", "4k"],
    )
    argv = guest_argv(session, ["--timeout", "600"], None, repeat=3)  # type: ignore[arg-type]
    assert argv[-7:] == [
        "--timeout", "600", "--knob", "pages=64", "--backing", "4k", str(tmp_path / "mmu-on.elf")
    ]  # fmt: skip
    assert argv[argv.index("--repeat") + 1] == "3" and argv[argv.index("--vcpus") + 1] == "1"


def test_vmid_is_read_at_return_where_the_kernel_can() -> None:
    from tracekit.host.collect import KPROBE_ARGS, kprobe_lines, return_args_supported
    from tracekit.host.probes import KernelSymbols

    symbols = KernelSymbols({"kvm_arm_vmid_update", "kvm_free_stage2_pgd"}, set())
    functions = ["kvm_arm_vmid_update", "kvm_free_stage2_pgd", "absent_function"]
    returns = {"kvm_free_stage2_pgd"}
    old = kprobe_lines(functions, returns, KPROBE_ARGS, symbols, "6.1.0-50-arm64")
    assert old == [
        "p:tracekit/kvm_arm_vmid_update kvm_arm_vmid_update vmid_id=+0($arg1):u64",
        "p:tracekit/kvm_free_stage2_pgd kvm_free_stage2_pgd",
        "r:tracekit/kvm_free_stage2_pgd_ret kvm_free_stage2_pgd",
    ]
    new = kprobe_lines(functions, returns, KPROBE_ARGS, symbols, "6.12.117+deb13-arm64")
    # 6.12 calls kvm_arm_vmid_update once per vCPU load: only its return sees the VMID.
    assert new[1] == "r:tracekit/kvm_arm_vmid_update_ret kvm_arm_vmid_update vmid_id=+0($arg1):u64"
    assert [return_args_supported(r) for r in ("6.9.12", "6.10.0", "7.1.9", "x")] == [
        False,
        True,
        True,
        False,
    ]
