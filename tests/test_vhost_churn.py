"""The vm-churn scenario on reproducer/kpatch's kernel: the fix's invalidation once per VM.

In the `nvhe-kpatch` boot (conftest.KPATCH_KERNEL, nVHE, cortex-a76, 2 CPUs, ground-truth
plugin), after that boot's other checks: one `tracekit collect --scenario vm-churn`
of CHURN_VMS MMU-on VMs on CPU 0 (cyclictest on CPU 1) per teardown_flush state, in that
order; the report's churn section is then built outside over the three bundles. One
boot for the three states, not three fresh ones (a boot each is CI time the budget has
not got): the comparison's premise of a fresh boot per state is the user's to keep on a
board (docs/vhost.md); what this asserts does not depend on it. Ground truth, per VM
(its VMM-timed window, create start to teardown end; VMs in turn, so the windows do not
overlap):
- off: no TLBI ALLE1 or ALLE1IS at EL2;
- alle1is: one TLBI ALLE1IS, from __kvm_flush_vm_context, at EL2;
- last-ran: one local TLBI ALLE1 from the series' __kvm_debug_maint, at EL2, on CPU 0
  (the CPU the VM ran on), and no ALLE1IS.
The switch's own count grows by one per VM in the two flushing states (the VMM's idle
held VM, --hold-vm, is closed before the switch is read again: it never ran, so it has
no VMID and adds no flush). On 6.1, with that VM held, no churn VM brings EL2 up: no
`___kvm_hyp_init` (TLBI ALLE2) at EL2 between the first create and the last teardown
(without it, one per VM on each CPU, review s17 MF2). The report holds the churn section
with the three states and two comparisons with off, and says the VM was held.

Booted on 2026-12-02 with only this check in the boot: passed, 3 min 37 s for the boot,
the three collects and the test (docs/vhost.md says what the plugin and the report showed).
The same check runs in the 6.12 series' nVHE boot (`[6.12]`, nvhe-kpatch-612): passed on
2026-12-04 (46 s for the three collects inside the boot). And in 7.2's (`[7.2]`,
nvhe-kpatch-72, -m kpatch72): passed on 2026-12-04 (44 s for the three collects), and
again with the held idle VM and the reviewed series (-kp888e325a).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from conftest import KPATCH_SERIES, kpatch_opt_in, register_vhost_check

from tracekit.bundle import RunKind, read_manifest
from tracekit.ingest.bundle import load_bundle
from tracekit.ingest.groundtruth import bundle_ground_truth
from tracekit.ingest.vmm import read_vmm_output
from tracekit.report.sections import churn as churn_section

CONFIG = "nvhe-kpatch"
# The nVHE boot per series (conftest.KPATCH_KERNEL, KPATCH_KERNEL_612, KPATCH_KERNEL_72).
BOOTS = {"6.1": CONFIG, "6.12": "nvhe-kpatch-612", "7.2": "nvhe-kpatch-72"}
MAINT = "/sys/kernel/debug/kvm/arm64_debug_maint"
POLICIES = ("off", "alle1is", "last-ran")
CHURN_VMS = 20
GUEST_CPU = 0
HYP_MAINT = "__kvm_nvhe___kvm_debug_maint"
HYP_FLUSH_VM = "__kvm_nvhe___kvm_flush_vm_context"


def _churn_script() -> str:
    """One churn per state, the switch read after each (the report is made outside: the
    emulated host's Python has no polars)."""
    script = "set -e; "
    for policy in POLICIES:
        script += (
            f"echo {policy} > {MAINT}/teardown_flush; python3 -m tracekit collect "
            f"--scenario vm-churn --rt-cpu 1 --stress-cpus 0 --guest-cpu {GUEST_CPU} "
            f"--repeat {CHURN_VMS} --allow-dirty -o churn-{policy}; "
            f"cat {MAINT}/teardown_flush > switch-{policy}; "
        )
    return script + f"echo off > {MAINT}/teardown_flush"


# Late: the kpatch checks count the switch's flushes and expect `off` from boot.
for _config in BOOTS.values():
    register_vhost_check(
        _config, "kpatch_churn", _churn_script(), late=True, opt_in=kpatch_opt_in(_config)
    )


def _flushes(text: str) -> int:
    """The switch file's `flushes: N`."""
    return int(text.split("flushes:")[1].split()[0])


def _per_vm_invalidations(bundle: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The churn's VMs, and each EL2 ALLE1(IS) row given the VM whose window holds it."""
    manifest = read_manifest(bundle)
    (run,) = [r for r in manifest.runs if r.kind == RunKind.CHURN]
    assert run.status == "ok", run.note
    vms = read_vmm_output(bundle / "runs" / run.run_id / "vmm.txt").vms
    truth, _ = bundle_ground_truth(bundle)
    alle1 = truth.table.filter(
        pl.col("where") == "hyp", pl.col("operation").is_in(["TLBI ALLE1", "TLBI ALLE1IS"])
    )
    windows = vms.select("vm", "create_start_ns", "teardown_end_ns").sort("create_start_ns")
    given = (
        alle1.sort("ts")
        .join_asof(windows, left_on="ts", right_on="create_start_ns")
        .filter(pl.col("ts") <= pl.col("teardown_end_ns"))
    )
    return vms, given


def _hyp_inits(bundle: Path, vms: pl.DataFrame) -> int:
    """EL2 TLBI ALLE2s (___kvm_hyp_init's) from the churn's first create to its last
    teardown end, on any CPU."""
    truth, _ = bundle_ground_truth(bundle)
    start, end = vms["create_start_ns"].min(), vms["teardown_end_ns"].max()
    return truth.table.filter(
        pl.col("where") == "hyp",
        pl.col("operation") == "TLBI ALLE2",
        pl.col("ts").is_between(start, end),
    ).height


@pytest.mark.kpatch
@pytest.mark.vhost
@KPATCH_SERIES
def test_vhost_churn_fix_invalidates_once_per_vm(vhost_boot, series: str) -> None:
    """Each VM's teardown: off none, alle1is one ALLE1IS, last-ran one ALLE1 on its CPU."""
    boot = vhost_boot(BOOTS[series])
    check = boot.checks["kpatch_churn"]
    assert check.status == 0, check.stdout + check.stderr
    here = boot.result.out_dir / "checks" / "kpatch_churn"
    for policy in POLICIES:
        bundle = here / f"churn-{policy}"
        manifest = read_manifest(bundle)
        assert manifest.host["kpatch"]["teardown_flush"] == policy
        vms, given = _per_vm_invalidations(bundle)
        assert vms.height == CHURN_VMS and (vms["result"] == "ok").all(), policy
        samples = load_bundle(bundle).run(manifest.runs[-1]).cyclictest
        assert samples is not None and samples.height > 0, policy
        assert manifest.scenario["parameters"]["hold_vm"] is True
        if series == "6.1":  # EL2 stayed up: no hyp init within the churn
            assert _hyp_inits(bundle, vms) == 0, policy
        counts = given.group_by("vm", "operation").len()
        if policy == "off":
            assert given.height == 0, given.select("vm", "cpu", "operation", "symbol").rows()
            continue
        operation, symbol = (
            ("TLBI ALLE1IS", HYP_FLUSH_VM) if policy == "alle1is" else ("TLBI ALLE1", HYP_MAINT)
        )
        assert counts.filter(pl.col("operation") == operation).height == CHURN_VMS, policy
        assert (counts["len"] == 1).all() and counts.height == CHURN_VMS, counts.rows()
        assert given["symbol"].str.starts_with(symbol).all(), policy
        if policy == "last-ran":
            assert given["cpu"].to_list() == [GUEST_CPU] * CHURN_VMS
        before = manifest.host["kpatch"]["teardown_flushes"]
        assert _flushes((here / f"switch-{policy}").read_text()) - before == CHURN_VMS
    section = churn_section.section([load_bundle(here / f"churn-{p}") for p in POLICIES])
    assert section is not None
    states = section.tables[0].frame["teardown_flush"].to_list()
    assert states == ["off", "alle1is", "last-ran"]
    assert section.tables[1].frame.height == 3  # alle1is and last-ran vs off, alle1is vs last-ran
    assert any("held one idle VM" in f or "enable_virt_at_load=1" in f for f in section.findings)
