"""The related cases' scenarios (teardown, cache-toggle, guest-broadcast) and preflight's KVM state.

Plans, parameters, freshness judgement and the histogram kept in the bundle are checked
here; the collections themselves run in the emulated host, in one nVHE cortex-a76 boot
of their own (nvhe-a76-scenarios: one VM per sweep point, one-second runs; the
guest-broadcast check took 4.6 min of session 10's CI boot, 2.3 of session 11's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from conftest import VhostBoot, register_vhost_check

from tracekit.bundle import Manifest, read_manifest, verify_files
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.host.kvmstate import judge_freshness, parse_state_line
from tracekit.host.protocol import (
    SCENARIOS,
    Roles,
    ScenarioParams,
    format_ints,
    ipa_spread,
    plan_runs,
    ram_mb_for,
)
from tracekit.host.tools import COMPACT_HEADING, compact_histogram

if TYPE_CHECKING:
    from tracekit.report.model import Section

NVHE = "nvhe-a76-scenarios"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPRODUCER_BUILD = Path(__file__).resolve().parent.parent / "reproducer" / "build"
ROLES = Roles(rt_cpu=3, stress_cpus=(0, 1, 2), guest_cpus=(1,))
COLLECT = "python3 -m tracekit collect --rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1"

# --- plans -------------------------------------------------------------------------------


def test_teardown_plan_is_one_traced_vmm_run_per_ipa_size() -> None:
    params = SCENARIOS["teardown"].defaults.merged(ipa_bits=(36, 40, 44), repeat=5)
    plan = plan_runs(SCENARIOS["teardown"], ROLES, 8, 2, "none", params)
    assert [p.run_id for p in plan] == ["sweep-ipa36", "sweep-ipa40", "sweep-ipa44"]
    assert {p.kind for p in plan} == {"vms"}
    assert [p.detail["ipa_bits"] for p in plan] == [36, 40, 44]
    assert all(p.detail["repeat"] == 5 and p.detail["vcpus"] == 1 for p in plan)


def test_cache_toggle_plan_crosses_vcpus_and_touched_sizes() -> None:
    params = SCENARIOS["cache-toggle"].defaults.merged(vcpus=(1, 2), touch_kb=(0, 8192))
    plan = plan_runs(SCENARIOS["cache-toggle"], ROLES, 8, 2, "none", params)
    assert [p.run_id for p in plan] == [
        "sweep-vcpus1-touch0kb",
        "sweep-vcpus1-touch8192kb",
        "sweep-vcpus2-touch0kb",
        "sweep-vcpus2-touch8192kb",
    ]
    # Two vCPUs touching 8 MiB each from 2 MiB in need 18 MiB of guest RAM.
    assert plan[-1].detail["ram_mb"] == 18 and plan[0].detail["ram_mb"] == 16


def test_guest_broadcast_wraps_the_during_phase_in_its_guest() -> None:
    plan = plan_runs(SCENARIOS["guest-broadcast"], ROLES, 1, 1, "none")
    during = [p for p in plan if p.phase == "during"]
    assert during[0].kind == "guest-start" and during[-1].kind == "guest-stop"
    assert [p.kind for p in during[1:-1]] == ["quiet", "traced", "probe", "probe", "probe"]
    # Probe slots on every CPU; the guest's only while it does not run the guest.
    assert [p.detail["cpu"] for p in during if p.kind == "probe"] == [3, 0, 2]
    before = [p.detail["cpu"] for p in plan if p.kind == "probe" and p.phase == "before"]
    assert before == [3, 0, 1, 2]
    assert during[0].detail["tlbi_count"] == 0xFFFFFFFF


def test_after_guest_needs_a_guest_phase() -> None:
    with pytest.raises(TracekitError, match="does not have"):
        plan_runs(SCENARIOS["teardown"], ROLES, 1, 1, "hotplug")


@pytest.mark.parametrize(
    ("limit", "sizes"),
    [(40, (32, 36, 40)), (48, (32, 36, 40, 44, 48)), (42, (32, 36, 40, 42)), (52, None)],
)
def test_ipa_spread_reaches_the_hosts_limit(limit: int, sizes: tuple[int, ...] | None) -> None:
    spread = ipa_spread(limit)
    assert spread[-1] == limit and spread[0] == 32
    if sizes:
        assert spread == sizes


def test_unknown_ipa_limit_means_kvms_default() -> None:
    assert ScenarioParams().with_ipa_limit(None).ipa_bits == (32, 36, 40)
    assert ScenarioParams(ipa_bits=(44,)).with_ipa_limit(40).ipa_bits == (44,)


def test_ram_holds_every_touched_slice() -> None:
    assert ram_mb_for(1, 0) == 16
    assert ram_mb_for(4, 4096) == 18  # 2 MiB + 4 x 4 MiB


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"ipa_bits": (30,)}, "--ipa-bits 30"),
        ({"vcpus": (0,)}, "--vcpus must be at least 1"),
        ({"repeat": 0}, "--repeat"),
    ],
)
def test_bad_parameters_are_one_line(given: dict[str, object], message: str) -> None:
    with pytest.raises(TracekitError, match=message):
        ScenarioParams().merged(**given)


def test_unknown_scenario_lists_the_scenarios(tmp_path: Path) -> None:
    args = ["collect", "--rt-cpu", "1", "--stress-cpus", "0", "--guest-cpu", "0"]
    result = CliRunner().invoke(main, [*args, "--scenario", "nope", "-o", str(tmp_path / "b")])
    assert result.exit_code == 2
    assert result.output.strip().endswith("main, teardown, cache-toggle, guest-broadcast, vm-churn")
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_dry_run_prints_each_scenarios_plan(scenario: str, tmp_path: Path) -> None:
    if not (REPRODUCER_BUILD / "guests" / "tlbi-loop.elf").is_file():
        pytest.skip("reproducer/build is missing: make -C reproducer CROSS_COMPILE=aarch64-...")
    args = ["collect", "--rt-cpu", "1", "--stress-cpus", "0", "--guest-cpu", "0", "--runs", "1"]
    result = CliRunner().invoke(
        main, [*args, "--scenario", scenario, "--dry-run", "-o", str(tmp_path / "b")]
    )
    assert result.exit_code == 0, result.output
    assert f"scenario {scenario}:" in result.output and "parameters:" in result.output
    assert f"variant {SCENARIOS[scenario].guest_variant}" in result.output
    assert not (tmp_path / "b").exists()


# --- preflight: the VMID allocator --------------------------------------------------------

# A real vmid_state event: Debian 13's 6.12.117 in the emulated host (nVHE, cortex-a76),
# the probe defined as kvmstate.py does and fired by KVM_CHECK_EXTENSION, before any VM.
STATE_LINE = (
    "         python3-176     [001] d....    31.751540: vmid_state: "
    "(kvm_dev_ioctl+0x0/0x838) bits=16 generation=65536 map0=0x0"
)


def test_state_line_is_parsed() -> None:
    assert parse_state_line(f"# tracer: nop\n{STATE_LINE}\n") == {
        "bits": 16,
        "generation": 65536,
        "map0": 0,
    }
    assert parse_state_line("# tracer: nop\n") == {}


@pytest.mark.parametrize(
    ("fields", "state"),
    [
        ({"bits": 16, "generation": 1 << 16, "map0": 0}, "fresh"),
        ({"bits": 16, "generation": 1 << 16, "map0": 0b10}, "dirty"),  # VMID 1 handed out
        ({"bits": 8, "generation": 2 << 8, "map0": 0}, "dirty"),  # rolled over
        ({"generation": 1 << 8, "map0": 1}, "fresh"),  # width unknown, bit 0 never used
        ({"bits": 16}, "unknown"),
        ({}, "unknown"),
    ],
)
def test_freshness_from_the_allocator(fields: dict[str, int], state: str) -> None:
    judged = judge_freshness(fields)
    assert judged.freshness == state
    assert judged.evidence


# --- what the bundle keeps -------------------------------------------------------------------


def test_histogram_keeps_every_counted_bucket_and_the_summary() -> None:
    text = (FIXTURES / "cyclictest" / "histfile-ns.txt").read_text()
    compact = compact_histogram(text)
    counted = [line for line in text.splitlines() if line[:1].isdigit() and int(line.split()[1])]
    kept = [line for line in compact.splitlines() if line[:1].isdigit()]
    assert kept == counted and len(kept) == 40
    assert "# Histogram Overflows: 00005" in compact and "# Max Latencies" in compact
    assert "# Thread 0:" not in compact


def _compact_line_by_line(text: str) -> str:
    """compact_histogram as it was written first, a line at a time: the reference."""
    kept = [COMPACT_HEADING]
    for line in text.splitlines():
        fields = line.split()
        if line.startswith("# Thread") or line.startswith("# Histogram Overflow at"):
            continue
        if len(fields) >= 2 and fields[0].isdigit() and all(f.strip("0") == "" for f in fields[1:]):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


@pytest.mark.parametrize("seed", range(40))
def test_histogram_compaction_matches_the_line_by_line_reference(seed: int) -> None:
    """Generated histfiles (1-3 threads, tab or space, sparse counts, overflow lists, a cut
    last line): the one-expression compaction keeps exactly what the line loop kept."""
    import random

    rng = random.Random(seed)
    threads, sep = rng.randint(1, 3), rng.choice([" ", "\t"])
    lines = ["# Histogram"]
    for bucket in range(rng.randint(0, 400)):
        counts = [rng.choice([0] * 30 + [1, 7, 120]) for _ in range(threads)]
        lines.append(f"{bucket:06d}" + "".join(f"{sep}{c:06d}" for c in counts))
    lines += ["# Total: 000000994", "# Max Latencies: 1671372", "# Histogram Overflows: 00005"]
    if rng.random() < 0.5:
        lines += ["# Histogram Overflow at cycle number:", "# Thread 0: 00042 00082", ""]
    lines += rng.choice([[], ["000007"], ["garbage line 0"], ["000009 000000 extra"]])
    text = "\n".join(lines) + rng.choice(["\n", ""])
    assert compact_histogram(text) == _compact_line_by_line(text)
    assert compact_histogram("") == _compact_line_by_line("")


def test_bundles_without_run_params_still_read(tmp_path: Path) -> None:
    old = Manifest().to_json()
    old["runs"] = [{"run_id": "guest", "phase": "guest", "kind": "guest", "index": 0}]
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    manifest = read_manifest(tmp_path)
    assert manifest.runs[0].params == {} and manifest.runs[0].status == "running"


# --- in the emulated host ---------------------------------------------------------------------

register_vhost_check(
    NVHE,
    "collect_teardown",
    f"{COLLECT} --scenario teardown --repeat 1 --function-graph -o bundle; status=$?; "
    f"{COLLECT} --scenario teardown --repeat 200 --ipa-bits 40 --vm-budget 1 -o budget "
    "> budget.txt 2>&1; echo $? > budget-status; exit $status",
)
register_vhost_check(
    NVHE,
    "collect_cache_toggle",
    f"{COLLECT} --scenario cache-toggle --vcpus 1,2 --touch-kb 256 --repeat 1 -o bundle",
)
register_vhost_check(
    NVHE,
    "collect_guest_broadcast",
    f"{COLLECT} --scenario guest-broadcast --runs 1 --traced-runs 0 --duration 1 "
    "--allow-dirty -o bundle",
)


def _bundle(boot: VhostBoot, name: str, bundle: str = "bundle") -> tuple[Path, Manifest]:
    """A batched check's bundle, which must be complete and intact."""
    if not (REPRODUCER_BUILD / "vmm").is_file():
        pytest.skip("reproducer/build is missing: make -C reproducer CROSS_COMPILE=aarch64-...")
    check = boot.checks[name]
    assert check.status == 0, check.stdout + check.stderr
    root = boot.result.out_dir / "checks" / name / bundle
    manifest = read_manifest(root)
    assert manifest.complete and verify_files(root, manifest) == []
    return root, manifest


def _report_sections(root: Path) -> dict[str, Section]:
    """The report's sections on a real bundle, none of them failed on a tracekit bug."""
    from tracekit.ingest.bundle import load_bundle
    from tracekit.report.assemble import INTERNAL_ERROR, build_report

    report = build_report([load_bundle(root)])
    bugs = [f for s in report.sections for f in s.findings if INTERNAL_ERROR in f]
    assert bugs == []
    return {s.key: s for s in report.sections}


def _vm_records(vmm_txt: Path) -> list[dict[str, str]]:
    """The VMM's record=vm lines as dicts."""
    lines = [line for line in vmm_txt.read_text().splitlines() if line.startswith("record=vm ")]
    return [dict(pair.split("=", 1) for pair in line.split()) for line in lines]


@pytest.mark.vhost
def test_teardown_bundle(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    import polars as pl

    import tracekit

    boot = vhost_boot(NVHE)
    root, manifest = _bundle(boot, "collect_teardown")
    assert "not computed" not in _report_sections(root)["teardown"].title
    assert manifest.host["ipa_limit_bits"] == 40  # cortex-a76: 40-bit physical addresses
    assert manifest.scenario["name"] == "teardown"
    assert manifest.scenario["parameters"]["ipa_bits"] == [32, 36, 40]
    # Debian 12's 6.1 has no function_graph in instances: entry/return probes instead.
    graph = manifest.scenario["function_graph"]
    assert graph["method"] == "kprobes" and "kvm_free_stage2_pgd" in graph["functions"]
    assert "6.11" in graph["reason"]
    assert manifest.host["freshness"]["state"] == "unknown"  # no CONFIG_KALLSYMS_ALL
    for run in manifest.runs:
        assert run.kind == "vms" and run.status == "ok"
        vms = _vm_records(root / "runs" / run.run_id / "vmm.txt")
        assert [vm["ipa_bits"] for vm in vms] == [str(run.params["ipa_bits"])]
        names = set(
            tracekit.open(root / "runs" / run.run_id / "trace").events["event"].cast(pl.String)
        )
        assert {"kvm_free_stage2_pgd", "kvm_free_stage2_pgd_ret", "print"} <= names


@pytest.mark.vhost
def test_teardown_budget_stops_and_says_so(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    boot = vhost_boot(NVHE)
    here = boot.result.out_dir / "checks" / "collect_teardown"
    assert (here / "budget-status").read_text().strip() == "0"
    assert "OVER BUDGET" in (here / "budget.txt").read_text()
    manifest = read_manifest(here / "budget")
    assert manifest.complete
    (run,) = manifest.runs
    assert run.status == "over-budget" and "time budget of 1 s" in run.note
    vmm_txt = here / "budget" / "runs" / run.run_id / "vmm.txt"
    records = _vm_records(vmm_txt)
    done = sum(vm["result"] == "ok" for vm in records)
    assert f"after {done} of 200 VMs" in run.note and done < 200
    # A VM cut short by the budget is torn down by the VMM and recorded as stopped (it may
    # also have been between VMs or in a teardown: then none is).
    assert [vm["result"] for vm in records[:-1]] == ["ok"] * (len(records) - 1)
    assert records[-1]["result"] in ("ok", "stopped"), vmm_txt.read_text()[-600:]


@pytest.mark.vhost
def test_cache_toggle_bundle(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    import polars as pl

    import tracekit

    boot = vhost_boot(NVHE)
    root, manifest = _bundle(boot, "collect_cache_toggle")
    assert "not computed" not in _report_sections(root)["cacheflush"].title
    assert [r.run_id for r in manifest.runs] == [
        "sweep-vcpus1-touch256kb",
        "sweep-vcpus2-touch256kb",
    ]
    for run in manifest.runs:
        vcpus = run.params["vcpus"]
        assert f"vcpus={vcpus}" in (root / "runs" / run.run_id / "vmm.txt").read_text()
        events = tracekit.open(root / "runs" / run.run_id / "trace").events
        names = events["event"].cast(pl.String)
        # The tracepoint and tracekit's kprobe share the name; ingest qualifies both.
        toggles = events.filter(names.is_in(["kvm_toggle_cache", "kvm:kvm_toggle_cache"]))
        assert toggles.height >= vcpus  # every vCPU turned its caches on
        assert (names == "stage2_flush_vm_ret").sum() >= vcpus  # each flush timed


@pytest.mark.vhost
def test_guest_broadcast_bundle(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    import tracekit

    boot = vhost_boot(NVHE)
    root, manifest = _bundle(boot, "collect_guest_broadcast")
    sections = _report_sections(root)
    assert "not computed" not in sections["broadcast"].title
    assert any(
        "background guest stopped by a signal, torn down in" in f for f in sections["vm"].findings
    )
    runs = {r.run_id: r for r in manifest.runs}
    start, stop = runs["during-guest-start"], runs["during-guest-stop"]
    during = [r for r in manifest.runs if r.phase == "during" and r.kind in ("quiet", "probe")]
    assert during and all(start.end_ns < r.start_ns < r.end_ns < stop.start_ns for r in during)
    markers = tracekit.open(root / "runs" / "during-guest-start" / "trace").event("print")
    texts = markers["buf"].to_list()
    assert any("event=enter" in t for t in texts) and any(
        "background guest running" in t for t in texts
    )
    assert "variant=tlbi-loop" in (root / "runs" / "during-guest-start" / "vmm.txt").read_text()
    stopped = json.loads((root / "runs" / "during-guest-stop" / "guest-stop.json").read_text())
    assert stopped["stopped_by"] == "SIGTERM" and stopped["torn_down_by_vmm"] is True
    assert stopped["vmm_exit_status"] == -15  # ended by the signal, after its own teardown
    ends = tracekit.open(root / "runs" / "during-guest-stop" / "trace").event("print")
    vmm_events = [t.split("event=")[1].split()[0] for t in ends["buf"] if "tracekit-vmm:" in t]
    assert vmm_events == ["stop", "teardown-start", "teardown-end"]
    for phase in ("before", "during", "after"):
        assert (root / "runs" / f"{phase}-quiet-0" / "cyclictest-hist.txt").read_text()
        assert {f"{phase}-probe-page-cpu{cpu}" for cpu in (3, 0, 2)} <= set(runs)


# --- teardown on a second kernel generation: trixie's 6.12 on `max` (IPA beyond 40 bits) ---

TRIXIE = "trixie-max"
# Two IPA sizes, one each side of the cortex models' 40-bit limit (44 needs `max`), 3 VMs
# each: a third size (40) added a traced sweep run (~30 s of the boot) and nothing asserted.
TRIXIE_IPA_BITS = (36, 44)
register_vhost_check(
    TRIXIE,
    "collect_teardown_trixie",
    "python3 -m tracekit collect --rt-cpu 1 --stress-cpus 0 --guest-cpu 0 --scenario teardown "
    f"--ipa-bits {format_ints(TRIXIE_IPA_BITS)} --repeat 3 --function-graph -o bundle",
)


@pytest.mark.vhost
def test_teardown_bundle_on_612_uses_instance_function_graph(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    from tracekit.ingest.bundle import load_bundle
    from tracekit.report.sections.teardown import section

    boot = vhost_boot(TRIXIE)
    root, manifest = _bundle(boot, "collect_teardown_trixie")
    assert "not computed" not in _report_sections(root)["teardown"].title
    assert manifest.host["kernel_release"].startswith("6.12")
    assert manifest.host["ipa_limit_bits"] > 40  # max: a large physical address range
    assert manifest.scenario["parameters"]["ipa_bits"] == list(TRIXIE_IPA_BITS)
    assert manifest.scenario["function_graph"]["method"] != "kprobes"  # 6.11+: in the instance
    for run in manifest.runs:
        assert run.kind == "vms" and run.status == "ok"
        assert len(_vm_records(root / "runs" / run.run_id / "vmm.txt")) == 3
    teardown = section([load_bundle(root)])
    assert teardown is not None
    text = "\n".join(teardown.findings) + "".join(str(t.frame) for t in teardown.tables)
    assert "6.12" in text and "44" in text


@pytest.mark.vhost
def test_vmids_on_612_are_read_at_return(vhost_boot) -> None:  # type: ignore[no-untyped-def]
    """6.12 calls kvm_arm_vmid_update from kvm_arch_vcpu_load (upstream fa808ed4e199 in
    6.12.y; in trixie's 6.12.117 image its one caller): a VM's VMID shows at the call's
    return, one new VMID per VM, and the calls follow vCPU loads, not guest entries."""
    import polars as pl

    import tracekit

    boot = vhost_boot(TRIXIE)
    root, manifest = _bundle(boot, "collect_teardown_trixie")
    ret_line = "r:tracekit/kvm_arm_vmid_update_ret kvm_arm_vmid_update vmid_id=+0($arg1):u64"
    assert ret_line in manifest.scenario["kprobes"]
    returned: list[int] = []
    calls = entries = 0
    for run in manifest.runs:
        trace = tracekit.open(root / "runs" / run.run_id / "trace")
        returns = trace.event("kvm_arm_vmid_update_ret")
        returned += returns.filter(pl.col("vmid_id") > 0)["vmid_id"].unique().to_list()
        calls += trace.event("kvm_arm_vmid_update").height
        entries += trace.event("kvm_entry").height
    # 2 IPA sizes x 3 VMs, each given a VMID of its own, in order, in one generation.
    vms = len(TRIXIE_IPA_BITS) * 3
    assert len(returned) == vms and len({v >> 16 for v in returned}) == 1, returned
    assert sorted(v & 0xFFFF for v in returned) == list(
        range(min(returned) & 0xFFFF, (min(returned) & 0xFFFF) + vms)
    )
    misses = manifest.runs[0].probe_misses
    assert misses is not None and "tracekit/kvm_arm_vmid_update_ret" in misses
    # 6.1 calls it before every guest entry (a real 6.1 guest run: 10 calls, 10 entries);
    # here once per vCPU load (a 6.12 main-scenario guest run: 2 calls, 5 entries). A VM's
    # entry reading shows its VMID only if its vCPU is loaded again (preemption, a block),
    # so that is not what tells the paths apart.
    assert 0 < calls < entries, (calls, entries)
