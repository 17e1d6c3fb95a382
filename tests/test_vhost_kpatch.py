"""reproducer/kpatch in the emulated host: each EL2 operation, the teardown switch, refusals.

Three boots of tracekit's kpatch kernel (marker kpatch, in CI's run: the CI config
bookworm:kpatch-ci by default, conftest.KPATCH_KERNEL), 2 CPUs each:
- nVHE on cortex-a76 with the ground-truth plugin: each operation runs on CPU 1 between
  two gtmark markers on CPU 0; the plugin must see the named instruction once, on CPU 1,
  in nVHE hyp text, from the series' __kvm_debug_maint, and, since no VM is alive, 6.1's
  EL2 bring-up on CPU 1 only (___kvm_hyp_init's TLBI ALLE2 and VMALLS12E1). Then one
  MMU-on VM per teardown_flush choice: `off` issues no ALLE1(IS) at EL2 in its window,
  `alle1is` one TLBI ALLE1IS from __kvm_flush_vm_context, `last-ran` one local TLBI ALLE1
  on CPU 1, each after the guest's last instruction the plugin logged. Then each refused
  request (a CPU the kernel does not have, a number too wide for its field, a VMID too
  wide, a missing VMID or a field the operation does not take, an unknown operation or
  switch choice; then CPU 1 taken offline, and back) must fail with its errno. 6.1.176's
  erratum 4118414 (REPEAT_TLBI) covers every Cortex-A76 revision: where the boot log says
  "Broken broadcast TLBI completion", each broadcast operation is followed by the
  workaround's TLBI VALE2IS.
- VHE on `max` with the plugin: the same operations, issued directly in kernel text
  (`__kvm_debug_maint`, no hypercall); the switch refuses all but `off`.
- protected on cortex-a76: every operation refused with EPERM, the switch with EOPNOTSUPP.
The nVHE and VHE tests run for each series (`[6.1]`, `[6.12]`): the 6.12 boots
(nvhe-kpatch-612, vhe-kpatch-612, conftest.KPATCH_KERNEL_612, trixie:kpatch-ci by
default) check the same, except that 6.12 keeps EL2 up from KVM's init
(kvm.enable_virt_at_load=1), so no ___kvm_hyp_init may run before an operation; with
kvm.enable_virt_at_load=0 (novirt-kpatch-612) the series holds virtualization enabled
for the operation, so every online CPU's ___kvm_hyp_init runs before it.

What this proves is (instruction, CPU, EL2 text) only: QEMU 7.2's plugin API reads no
registers, so the VMID in VTTBR_EL2 and whether HCR_EL2.VM was set while a VMID-scoped
operation ran are not witnessed (the s2=0 and s2=1 requests assert the same thing).

Booted on 2026-12-02 (docs/vhost.md says what the plugin showed): nVHE and its collect
passed; VHE and protected passed (refusals compared by errno number: Linux's EOPNOTSUPP
is ENOTSUP, the name Python gives 95).
All five (these four and tests/test_vhost_churn.py's) passed on the CI kernel too
(TRACEKIT_KPATCH_KERNEL=bookworm:kpatch-ci, 6.1.176-tk8977d8-kpa298619e, session 12):
113 s for the three boots. The 6.12 twins passed on 2026-12-04 (trixie:kpatch-ci,
6.12.117-tk0feb10-kpd7c583d9, with tests/test_vhost_churn.py's [6.12]: 4 passed in 179 s).
The 7.2 twins (`[7.2]`, -m kpatch72: nvhe-kpatch-72, vhe-kpatch-72, protected-kpatch-72 on
conftest.KPATCH_KERNEL_72, sid:kpatch-ci by default) check what 6.12's do: 7.2 keeps EL2 up
from KVM's init too. On 2026-12-04 (7.2.13-tk498551-kp638caddc, with the churn's [7.2]):
4 of 5 passed in 214 s; the VHE one failed on its "no hyp row" (7.2's boot-time
__finalise_el2 DSB NSH), since asserted as _assert_no_hyp_work says, and passed so on a
fresh boot (11 s). With the reviewed series merged (-kp888e325a): 4 of 5 in 119 s, VHE
failing on CPU 1's __finalise_el2 when the offline refusal brings it back, now allowed
outside the operations' windows; passed so on a fresh boot (35 s). After merging main's
churn changes: all five [7.2] tests, 5 passed in 129 s.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

import polars as pl
import pytest
from conftest import KPATCH_SERIES, VHOST_CONFIGS, kpatch_opt_in, register_vhost_check

from tracekit.bundle import read_manifest
from tracekit.host.protocol import after_guest_run_id
from tracekit.ingest.groundtruth import bundle_ground_truth, load_ground_truth, parse_gtmark

CONFIG = "nvhe-kpatch"
VHE = "vhe-kpatch"
PROTECTED = "protected-kpatch"
# The nVHE and VHE boots per series (conftest.KPATCH_KERNEL, KPATCH_KERNEL_612, _72).
NVHE_BOOTS = {"6.1": CONFIG, "6.12": "nvhe-kpatch-612", "7.2": "nvhe-kpatch-72"}
VHE_BOOTS = {"6.1": VHE, "6.12": "vhe-kpatch-612", "7.2": "vhe-kpatch-72"}
PROTECTED_BOOTS = {"6.1": PROTECTED, "6.12": "protected-kpatch-612", "7.2": "protected-kpatch-72"}
# 6.12 only: hVHE on max, and nVHE with kvm.enable_virt_at_load=0.
HVHE = "hvhe-kpatch-612"
NOVIRT = "novirt-kpatch-612"
# 6.12's boots are opt-in (-m kpatch612): its CI kernel's cold build and five boots,
# ~14 min, do not fit CI's budget beside the rest; nor do 7.2's (-m kpatch72, three
# boots); 6.1's are CI's (conftest.KPATCH_SERIES, kpatch_opt_in).
SERIES = KPATCH_SERIES
OPT_IN_612 = "kpatch612"
_opt_in = kpatch_opt_in


MAINT = "/sys/kernel/debug/kvm/arm64_debug_maint"
HYP_MAINT = "__kvm_nvhe___kvm_debug_maint"
VHE_MAINT = "__kvm_debug_maint+"
HYP_INIT = "__kvm_nvhe____kvm_hyp_init"
HYP_FLUSH_VM = "__kvm_nvhe___kvm_flush_vm_context"
# (request written to `op`, the instruction the plugin must see once)
OPERATIONS = (
    ("alle1 1", "TLBI ALLE1"),
    ("alle1is 1", "TLBI ALLE1IS"),
    ("vmalls12e1 1 5 0", "TLBI VMALLS12E1"),
    ("vmalls12e1 1 5 1", "TLBI VMALLS12E1"),
    ("vmalls12e1is 1 5 0", "TLBI VMALLS12E1IS"),
    ("vmalls12e1is 1 5 1", "TLBI VMALLS12E1IS"),
    ("vmalle1 1 0", "TLBI VMALLE1"),
    ("vmalle1is 1 0", "TLBI VMALLE1IS"),
    ("iallu 1", "IC IALLU"),
)
POLICIES = ("off", "alle1is", "last-ran")
# Requests the interface must refuse, and the errno each gets (2 CPUs, VMIDs of 8 or 16
# bits): none of them reaches EL2, so they run after the windows. A CPU number the kernel
# does not have, a number too wide for its field (4294967298 was CPU 2 once, cut to 32
# bits) and a field the operation does not take are malformed (review S4).
REFUSED = (
    ("op", "alle1 2", "EINVAL"),
    ("op", "alle1 4294967298", "EINVAL"),
    ("op", "vmalls12e1 1 65536", "ERANGE"),
    ("op", "vmalls12e1 1 18446744073709551616", "EINVAL"),
    ("op", "vmalls12e1 1", "EINVAL"),
    ("op", "vmalls12e1 1 5 0 7", "EINVAL"),
    ("op", "vmalls12e1 1 5 2", "EINVAL"),
    ("op", "vmalle1 1 5", "EINVAL"),
    ("op", "alle1 1 5", "EINVAL"),
    ("op", "iallu 1 0 1", "EINVAL"),
    ("op", "bogus 1", "EINVAL"),
    ("teardown_flush", "bogus", "EINVAL"),
)
# With CPU 1 taken offline (and back after): the one request that reaches the IPI.
OFFLINE = (("op", "alle1 1", "ENXIO"),)
CPU1_ONLINE = "/sys/devices/system/cpu/cpu1/online"
# Outside nVHE the switch would do nothing: every choice but `off` is refused.
SWITCH_INACTIVE = (
    ("teardown_flush", "alle1is", "EOPNOTSUPP"),
    ("teardown_flush", "last-ran", "EOPNOTSUPP"),
    ("teardown_flush", "off", "ok"),
)
# Protected mode: the host does not own EL2, every operation is refused.
PROTECTED_REFUSED = (
    *(("op", request, "EPERM") for request, _ in OPERATIONS),
    ("op", "bogus 1", "EINVAL"),
    *SWITCH_INACTIVE,
)
# One write of argv[2] to argv[1]; prints the errno's name, or "ok" (busybox's and
# dash's echo do not say which errno a failed write got).
_WRITE_ERRNO = (
    'python3 -c "import errno, os, sys\n'
    "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
    "try:\n    os.write(fd, sys.argv[2].encode() + b'\\n'); print('ok')\n"
    'except OSError as e:\n    print(errno.errorcode[e.errno])"'
)
_VMM = "/tracekit/reproducer/build/vmm --cpus 1 /tracekit/reproducer/build/guests/mmu-on.elf"


def _windowed(name: str, command: str) -> str:
    """`command` between two gtmark markers on CPU 0, saved as NAME-start / NAME-end."""
    mark = "/tracekit/reproducer/build/gtmark --cpus 0 --rounds 1 | tee -a /out/vhost-gtmark.txt"
    return f"{mark} > {name}-start; {command}; {mark} > {name}-end; "


def _operations_script() -> str:
    """Read `op`, then each operation in its own marker window."""
    script = f"set -e; cat {MAINT}/op > op-read; cat {MAINT}/teardown_flush > switch-read; "
    for index, (request, _) in enumerate(OPERATIONS):
        script += _windowed(f"op{index}", f"echo '{request}' > {MAINT}/op")
    return script


def _refusals_script(refused: tuple[tuple[str, str, str], ...], name: str = "refused") -> str:
    """Each refused request's errno name into NAME<index>."""
    return "".join(
        f"; {_WRITE_ERRNO} {MAINT}/{file} '{request}' > {name}{index}"
        for index, (file, request, _) in enumerate(refused)
    )


def _offline_script() -> str:
    """OFFLINE's requests with CPU 1 offline, into offlineN; CPU 1 online again after."""
    body = _refusals_script(OFFLINE, "offline")
    return f"; echo 0 > {CPU1_ONLINE}{body}; echo 1 > {CPU1_ONLINE}"


def _nvhe_script() -> str:
    """Operations, one VM per switch choice, then the refusals."""
    script = _operations_script()
    for policy in POLICIES:
        script += f"echo {policy} > {MAINT}/teardown_flush; "
        script += _windowed(f"teardown-{policy}", f"{_VMM} > vmm-{policy}.txt")
    script += f"cat {MAINT}/teardown_flush > teardown-read; echo off > {MAINT}/teardown_flush"
    return script + _refusals_script(REFUSED) + _offline_script()


_VHE_REFUSED = REFUSED + SWITCH_INACTIVE
# The collector's after-guest action through the same interface, after the check above
# (its VMs make the host dirty): 2 CPUs leave no control CPU, so the guest CPU's ALLE1.
AFTER_GUEST = "tlbi:alle1@guest-cpu"
register_vhost_check(HVHE, "kpatch", _nvhe_script(), opt_in=OPT_IN_612)
for _nvhe in NVHE_BOOTS.values():
    register_vhost_check(_nvhe, "kpatch", _nvhe_script(), opt_in=_opt_in(_nvhe))
    register_vhost_check(
        _nvhe,
        "kpatch_collect",
        "python3 -m tracekit collect --rt-cpu 1 --stress-cpus 0 --guest-cpu 0 --runs 1 "
        f"--traced-runs 0 --duration 2 --after-guest {AFTER_GUEST} --allow-dirty -o bundle",
        opt_in=_opt_in(_nvhe),
    )
for _vhe in VHE_BOOTS.values():
    register_vhost_check(
        _vhe,
        "kpatch",
        _operations_script().rstrip("; ") + _refusals_script(_VHE_REFUSED) + _offline_script(),
        opt_in=_opt_in(_vhe),
    )
register_vhost_check(
    NOVIRT,
    "kpatch",
    _operations_script().rstrip("; ") + _refusals_script(REFUSED) + _offline_script(),
    opt_in=OPT_IN_612,
)
for _protected in PROTECTED_BOOTS.values():
    register_vhost_check(
        _protected,
        "kpatch",
        f"set -e; cat {MAINT}/op > op-read; cat {MAINT}/teardown_flush > switch-read"
        + _refusals_script(PROTECTED_REFUSED),
        opt_in=_opt_in(_protected),
    )


def _window(here: Path, name: str) -> pl.Expr:
    """Rows between the NAME-start marker's t0 and the NAME-end marker's t1."""
    start = parse_gtmark((here / f"{name}-start").read_text())["t0"][0]
    end = parse_gtmark((here / f"{name}-end").read_text())["t1"][0]
    return pl.col("ts").is_between(start, end)


def _invalidations(frame: pl.DataFrame) -> pl.DataFrame:
    """The TLBI and IC rows of `frame`, in time order."""
    return frame.filter(pl.col("kind").is_in(["tlbi", "ic"])).sort("ts")


def _checked_boot(vhost_boot, config: str, mode: str) -> Path:
    """Boot `config`; its kpatch check passed and the interface named `mode`: the check's
    directory."""
    boot = vhost_boot(config)
    check = boot.checks["kpatch"]
    assert check.status == 0, check.stderr
    here = boot.result.out_dir / "checks" / "kpatch"
    assert f"mode: {mode}" in (here / "op-read").read_text()
    return here


def _complete_truth(here: Path) -> pl.DataFrame:
    """The boot's ground-truth table, which must hold every record the plugin took."""
    truth = load_ground_truth(here.parent.parent)
    assert truth.header.not_written == 0 and truth.header.complete
    return truth.table


def _repeat_tlbi(here: Path, config: str) -> bool:
    """Whether the boot runs with the REPEAT_TLBI workaround: erratum 4118414 lists every
    Cortex-A76 and not `max` (cpu_errata.c, 6.1.176 and 6.12.117 alike), and the boot log
    must say so."""
    expected = VHOST_CONFIGS[config].cpu_model == "cortex-a76"
    dmesg = (here.parent.parent / "vhost-boot-dmesg.txt").read_text()
    assert ("Broken broadcast TLBI completion" in dmesg) == expected, config
    return expected


def _expected(operation: str, repeat: bool) -> list[str]:
    """What the series issues for `operation`: a broadcast one is followed, under the
    erratum, by the workaround's TLBI VALE2IS (__tlbi_sync_s1ish_hyp)."""
    broadcast = operation.startswith("TLBI") and operation.endswith("IS")
    return [operation, "TLBI VALE2IS"] if broadcast and repeat else [operation]


def _issued(here: Path, frame: pl.DataFrame, index: int, symbol: str, repeat: bool) -> pl.DataFrame:
    """Operation `index`'s window: the invalidations of `frame` from `symbol`, and all."""
    mine = frame.filter(_window(here, f"op{index}"))
    issued = _invalidations(mine.filter(pl.col("symbol").str.starts_with(symbol)))
    request, operation = OPERATIONS[index]
    expected = _expected(operation, repeat)
    assert issued["operation"].to_list() == expected, request
    assert issued["cpu"].to_list() == [1] * len(expected), request
    return mine


def _assert_refused(
    here: Path, refused: tuple[tuple[str, str, str], ...], name: str = "refused"
) -> None:
    """Each refused request got its errno (or "ok" where it must be accepted)."""
    for index, (file, request, errname) in enumerate(refused):
        # By number: Linux's EOPNOTSUPP is ENOTSUP (95), which Python names ENOTSUP.
        expected = errname if errname == "ok" else errno.errorcode[getattr(errno, errname)]
        assert (here / f"{name}{index}").read_text().strip() == expected, (file, request)


# What EL2 runs before each operation, besides it, per series. 6.1 leaves EL2 to the hyp
# stub with no VM alive: the interface brings it up on the target CPU alone, first (its
# VMALLS12E1 is VMID 0's: VTTBR_EL2 is 0 there). 6.12 keeps EL2 up from KVM's init
# (kvm.enable_virt_at_load=1, the default): nothing; with kvm.enable_virt_at_load=0 it
# leaves EL2 to the stub too, and the interface holds virtualization enabled for the
# operation as a VM does (kvm_enable_virtualization: review of the 6.12 port, must-fix
# 1), so every online CPU runs 6.12's hyp init, TLBI ALLE2 and ALLE1, before it. 7.2 as
# 6.12.
BRING_UP = {"6.1": ["TLBI ALLE2", "TLBI VMALLS12E1"], "6.12": [], "7.2": []}
BRING_UP_NOVIRT = ["TLBI ALLE2", "TLBI ALLE1"]
# The CPUs brought up: 6.1's target alone (the default), 6.12's every online one.
NOVIRT_CPUS = (0, 1)


def _nvhe_operations(
    here: Path, hyp: pl.DataFrame, repeat: bool, bring_up: list[str], cpus: tuple[int, ...]
) -> None:
    """Each operation once on CPU 1 from __kvm_debug_maint, after the EL2 bring-up
    (`bring_up`) of each of `cpus` and nothing else, or with nothing else at EL2 in its
    window (no bring-up)."""
    for index, (request, _) in enumerate(OPERATIONS):
        mine = _issued(here, hyp, index, HYP_MAINT, repeat)
        init = _invalidations(mine.filter(pl.col("symbol").str.starts_with(HYP_INIT)))
        for cpu in cpus if bring_up else ():
            on_cpu = init.filter(pl.col("cpu") == cpu)
            assert on_cpu["operation"].to_list() == bring_up, (request, cpu)
        assert init.height == len(bring_up) * len(cpus), (request, init.rows())
        ours = _invalidations(mine.filter(pl.col("symbol").str.starts_with(HYP_MAINT)))
        if bring_up:
            assert init["ts"].max() < ours["ts"][0], request
        expected = init.height + len(_expected(OPERATIONS[index][1], repeat))
        assert _invalidations(mine).height == expected, (
            request,
            _invalidations(mine).select("cpu", "operation", "symbol").rows(),
        )


def _nvhe_teardowns(here: Path, table: pl.DataFrame, repeat: bool) -> None:
    """`off`: no flush; `alle1is`/`last-ran`: theirs, after the guest's last instruction."""
    hyp = table.filter(pl.col("where") == "hyp")
    alle1 = pl.col("operation").is_in(["TLBI ALLE1", "TLBI ALLE1IS"])
    for policy in POLICIES:
        window = _window(here, f"teardown-{policy}")
        guest = table.filter(window, pl.col("where") == "guest")
        assert guest.height > 0, policy  # the MMU-on guest's DSB SY (preset: no pre-TLBI)
        seen = hyp.filter(window, alle1)
        assert seen.filter(pl.col("ts") < guest["ts"].max()).height == 0, policy
        if policy == "off":
            assert seen.height == 0
            ours = pl.col("symbol").str.starts_with(HYP_MAINT)
            flush_vm = pl.col("symbol").str.starts_with(HYP_FLUSH_VM)
            assert hyp.filter(window, ours | flush_vm).height == 0
        elif policy == "alle1is":
            flush = _invalidations(
                hyp.filter(window, pl.col("symbol").str.starts_with(HYP_FLUSH_VM))
            )
            assert flush["operation"].to_list() == _expected("TLBI ALLE1IS", repeat)
            assert seen["operation"].to_list() == ["TLBI ALLE1IS"]
            assert seen["symbol"][0].startswith(HYP_FLUSH_VM)
        else:
            assert seen["operation"].to_list() == ["TLBI ALLE1"]
            assert seen["cpu"].to_list() == [1]
            assert seen["symbol"][0].startswith(HYP_MAINT)


def _nvhe_boot(
    vhost_boot,
    config: str,
    mode: str,
    bring_up: list[str],
    switch: bool = True,
    cpus: tuple[int, ...] = (1,),
) -> Path:
    """A boot running the nVHE hyp code (nVHE, hVHE): each operation once on CPU 1 at EL2
    after `bring_up`; with `switch`, one VM per teardown_flush choice did what it says;
    the refusals got their errnos. The check's directory."""
    here = _checked_boot(vhost_boot, config, mode)
    table = _complete_truth(here)
    repeat = _repeat_tlbi(here, config)
    _nvhe_operations(here, table.filter(pl.col("where") == "hyp"), repeat, bring_up, cpus)
    if switch:
        assert (here / "switch-read").read_text().startswith("[off] alle1is last-ran\n")
        _nvhe_teardowns(here, table, repeat)
        read = (here / "teardown-read").read_text()
        assert read.startswith("off alle1is [last-ran]\n") and "\nflushes: 2\n" in read
        # No local flush failed; the VMID size is there to judge rollovers by (S6).
        assert "\nfailed: 0\n" in read and re.search(r"\nvmid_bits: (8|16)\n", read), read
    _assert_refused(here, REFUSED)
    _assert_refused(here, OFFLINE, "offline")
    return here


@pytest.mark.kpatch
@pytest.mark.vhost
@SERIES
def test_vhost_kpatch_operations_and_teardown_switch(vhost_boot, series: str) -> None:
    """nVHE: each operation once, on CPU 1, at EL2; the switch changes what teardown runs."""
    _nvhe_boot(vhost_boot, NVHE_BOOTS[series], "nvhe", BRING_UP[series])


@pytest.mark.kpatch
@pytest.mark.kpatch612
@pytest.mark.vhost
def test_vhost_kpatch_hvhe_takes_the_hypercall(vhost_boot) -> None:
    """6.12's hVHE on max: the interface reads `mode: hvhe`, each operation runs once on
    CPU 1 from the nVHE hyp text, and the switch acts as in nVHE."""
    _nvhe_boot(vhost_boot, HVHE, "hvhe", [])
    assert vhost_boot(HVHE).result.kvm_mode == "hvhe"


@pytest.mark.kpatch
@pytest.mark.kpatch612
@pytest.mark.vhost
def test_vhost_kpatch_brings_el2_up_without_virt_at_load(vhost_boot) -> None:
    """6.12 with kvm.enable_virt_at_load=0 and no VM alive: EL2 is the hyp stub, so each
    operation holds virtualization enabled as a VM would, which brings EL2 up on every
    online CPU first (___kvm_hyp_init's ALLE2 and ALLE1 on CPU 0 and on CPU 1, through
    KVM's hotplug state, not from the IPI), then runs once on CPU 1."""
    _nvhe_boot(vhost_boot, NOVIRT, "nvhe", BRING_UP_NOVIRT, switch=False, cpus=NOVIRT_CPUS)


# Hyp text that runs in VHE: the switch to VHE each time a CPU comes up (at boot, and
# CPU 1 back online after the offline refusals), where 7.2 writes HCR_EL2 with
# msr_hcr_el2's DSB NSH (AmpereOne AC04_CPU_23, asm/sysreg.h:1121-1126).
VHE_BOOT_HYP = "__finalise_el2+"


def _assert_no_hyp_work(here: Path, hyp: pl.DataFrame) -> None:
    """VHE: no invalidation in hyp text, nothing there while the operations run, and only
    a CPU's switch to VHE outside them (a barrier per CPU bring-up on 7.2; nothing the
    plugin logs on 6.1 and 6.12)."""
    assert _invalidations(hyp).height == 0, hyp.select("cpu", "operation", "symbol").rows()
    start = parse_gtmark((here / "op0-start").read_text())["t0"][0]
    end = parse_gtmark((here / f"op{len(OPERATIONS) - 1}-end").read_text())["t1"][0]
    assert hyp.filter(pl.col("ts").is_between(start, end)).height == 0
    assert hyp["symbol"].str.starts_with(VHE_BOOT_HYP).all(), hyp["symbol"].to_list()


@pytest.mark.kpatch
@pytest.mark.vhost
@SERIES
def test_vhost_kpatch_vhe_issues_in_kernel_text(vhost_boot, series: str) -> None:
    """VHE: each operation once, on CPU 1, from __kvm_debug_maint (no hyp text); no switch."""
    config = VHE_BOOTS[series]
    here = _checked_boot(vhost_boot, config, "vhe")
    assert "(inactive: vhe)" in (here / "switch-read").read_text().splitlines()[0]
    table = _complete_truth(here)
    _assert_no_hyp_work(here, table.filter(pl.col("where") == "hyp"))
    repeat = _repeat_tlbi(here, config)
    for index in range(len(OPERATIONS)):
        _issued(here, table.filter(pl.col("where") == "kernel"), index, VHE_MAINT, repeat)
    _assert_refused(here, _VHE_REFUSED)
    _assert_refused(here, OFFLINE, "offline")


@pytest.mark.kpatch
@pytest.mark.vhost
@SERIES
def test_vhost_kpatch_protected_refuses(vhost_boot, series: str) -> None:
    """Protected mode: the interface says so, every operation EPERM, the switch EOPNOTSUPP."""
    here = _checked_boot(vhost_boot, PROTECTED_BOOTS[series], "protected (refused)")
    assert "(inactive: protected)" in (here / "switch-read").read_text().splitlines()[0]
    _assert_refused(here, PROTECTED_REFUSED)


@pytest.mark.kpatch
@pytest.mark.vhost
@SERIES
def test_vhost_kpatch_after_guest_tlbi_in_a_collect(vhost_boot, series: str) -> None:
    """tracekit collect --after-guest tlbi:alle1@guest-cpu: one TLBI ALLE1 at EL2, on the
    guest's CPU, inside the after-guest run and nowhere else; the bundle names the series."""
    boot = vhost_boot(NVHE_BOOTS[series])
    check = boot.checks["kpatch_collect"]
    assert check.status == 0, check.stdout + check.stderr
    bundle = boot.result.out_dir / "checks" / "kpatch_collect" / "bundle"
    manifest = read_manifest(bundle)
    assert "-kp" in manifest.host["kernel_release"]
    assert manifest.host["kernel_release"].startswith(f"{series}.")
    assert manifest.host["kpatch"]["mode"] == "nvhe"
    assert manifest.host["kpatch"]["teardown_flush"] == "off"
    _, given = bundle_ground_truth(bundle)
    ours = _invalidations(
        given.filter(pl.col("where") == "hyp", pl.col("symbol").str.starts_with(HYP_MAINT))
    )
    assert ours["operation"].to_list() == ["TLBI ALLE1"]
    assert ours["run_id"].to_list() == [after_guest_run_id(AFTER_GUEST)]
    assert ours["cpu"].to_list() == manifest.options["guest_cpus"] == [0]
