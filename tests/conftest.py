"""Shared fixtures, chiefly the emulated arm64 host: one boot per configuration.

Booting takes ~20 s under TCG, so checks are batched. A test module registers its
shell checks at import time with `register_vhost_check(config, name, script)`; the first
test that asks `vhost_boot(config)` boots that configuration once, runs every check
registered for it (each in its own directory under /out/checks/NAME, output and status
saved), and every later test reads the same results. Checks run in registration order,
except those registered `first=True` (they assert on what a fresh boot does), which run
before all the others, and those registered `late=True` (they leave the host dirty),
which run after all the others.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tracekit.vhost.runner import VhostConfig, VhostResult

# The kernel of the kpatch boots (tests marked kpatch, in CI's run): the CI config's build
# (7 min cold, the three boots ~2 min), or (set to bookworm:kpatch) the full config's,
# whose tests are otherwise the same (a ~28 min cold build: never CI's default).
KPATCH_KERNEL = os.environ.get("TRACEKIT_KPATCH_KERNEL", "bookworm:kpatch-ci")
# The same for the 6.12 series (reproducer/kpatch/6.12): trixie's CI config by default.
KPATCH_KERNEL_612 = os.environ.get("TRACEKIT_KPATCH_KERNEL_612", "trixie:kpatch-ci")
# And for sid's 7.2 series (reproducer/kpatch/7.2): sid's CI config by default.
KPATCH_KERNEL_72 = os.environ.get("TRACEKIT_KPATCH_KERNEL_72", "sid:kpatch-ci")


def _kpatch_boots(kernel: str, suffix: str = "") -> dict[str, VhostConfig]:
    """The kpatch boots of one kernel (their names + `suffix`): nvhe-kpatch on cortex-a76
    and vhe-kpatch on max (its __kvm_debug_maint runs in kernel text), both with the
    ground-truth plugin, and protected-kpatch on cortex-a76 (refused)."""
    return {
        f"nvhe-kpatch{suffix}": VhostConfig(
            kernel=kernel,
            kvm_mode="nvhe",
            cpu_model="cortex-a76",
            smp=2,
            # 84 s on 6.1's CI kernel (session 12); 600 s bounds the churn's intermittent
            # VMM stop seen in benchmarks/results/vm_churn_boots.txt. The full config took
            # 13 min.
            timeout_s=600 if kernel.endswith("-ci") else 1500,
            ground_truth=True,
        ),
        f"vhe-kpatch{suffix}": VhostConfig(
            kernel=kernel, kvm_mode="vhe", cpu_model="max", smp=2, timeout_s=900, ground_truth=True
        ),
        f"protected-kpatch{suffix}": VhostConfig(
            kernel=kernel, kvm_mode="protected", cpu_model="cortex-a76", smp=2, timeout_s=900
        ),
    }


# The configurations the tests boot; others add entries here, not new boot code.
VHOST_CONFIGS: dict[str, VhostConfig] = {
    # The brief's main case: four A76s in two clusters, CPU 3 isolated for cyclictest.
    # With the ground-truth plugin: the main collect's steps are checked against 6.1
    # nVHE's signatures on cortex-a76. The host's REPEAT_TLBI VALE1IS, XZR are in its
    # kernel counts; the hyp side (VALE2IS) is not exercised: none of the collect's steps
    # issues a broadcast TLBI at EL2 (6.1.176 hyp-init.S:121-122, nvhe/tlb.c:106-119 are
    # local), only a rollover or tlbi:vmalls12e1is would, and neither runs here.
    "nvhe-a76": VhostConfig(
        kvm_mode="nvhe",
        cpu_model="cortex-a76",
        smp=4,
        clusters=2,
        append="isolcpus=3 nohz_full=3 rcu_nocbs=3",
        timeout_s=1800,
        ground_truth=True,
    ),
    # The related cases' scenarios (teardown, cache-toggle, guest-broadcast): the same host
    # as nvhe-a76, booted apart (this boot took 9.1 min in session 10's CI, 5.1 in 11's).
    "nvhe-a76-scenarios": VhostConfig(
        kvm_mode="nvhe",
        cpu_model="cortex-a76",
        smp=4,
        clusters=2,
        append="isolcpus=3 nohz_full=3 rcu_nocbs=3",
        timeout_s=1500,
    ),
    # Cortex-A53 has 8-bit VMIDs: a VMID rollover takes ~255 VMs. With the ground-truth
    # plugin (tests/test_vhost_groundtruth.py): every TLBI of the boot is logged. Under
    # the null simulated mechanism (tests/test_simulate_vhost.py): the plugin runs its
    # simulation callbacks and injects nothing; every bundle is labelled null@hash.
    "nvhe-a53": VhostConfig(
        kvm_mode="nvhe",
        cpu_model="cortex-a53",
        smp=2,
        # Its checks (ground truth, two rollovers, the campaign's 4 cells) take ~15 min
        # on a quiet machine: 900 s left no margin and timed out at load 8.
        timeout_s=1800,
        ground_truth=True,
        simulate="null",
    ),
    # Issue 18 end to end (tests/test_simulate_vhost.py): the main case's host on trixie
    # 6.12 (its hotplug runs a local TLBI ALLE1 on the re-plugged CPU) with the brief's
    # model injected by the ground-truth plugin; three short collects. Only the isolated
    # CPU pays as a responder (session 9's boot, where the idle housekeeping CPUs paid
    # 831 s on their wake-ups, took 25 min; session 11's passing boot 17.1 min, see
    # docs/simulate.md). In CI since session 16 (9-11 min on a quiet machine: sessions 14
    # and 16); `-m simboot` selects it alone.
    "nvhe-a76-sim": VhostConfig(
        kernel="trixie",
        kvm_mode="nvhe",
        cpu_model="cortex-a76",
        smp=4,
        clusters=2,
        append="isolcpus=3 nohz_full=3 rcu_nocbs=3",
        # Session 11's boots took 19.6 min at load ~3 (a unit suite beside it) and 17.1 at ~2.
        timeout_s=1800,
        simulate="brief-literal",
    ),
    # Both load the ground-truth plugin too (VHE and 6.12 facts, tests/test_vhost_groundtruth.py).
    "vhe-max": VhostConfig(
        kvm_mode="vhe", cpu_model="max", smp=2, timeout_s=900, ground_truth=True
    ),
    "protected-a76": VhostConfig(
        kvm_mode="protected", cpu_model="cortex-a76", smp=2, timeout_s=900
    ),
    "rt-a76": VhostConfig(kernel="bookworm:rt", cpu_model="cortex-a76", smp=2, timeout_s=900),
    # A 6.12 kernel (function_graph in tracefs instances, 6.11+) on `max`: 48-bit (52 with
    # LPA2) physical addresses for the teardown scenario's large IPA sizes; nVHE is forced.
    "trixie-max": VhostConfig(
        kernel="trixie", cpu_model="max", kvm_mode="nvhe", smp=2, timeout_s=900, ground_truth=True
    ),
    # bookworm's 6.1 with reproducer/kpatch, built by tracekit: the CI config by default
    # (KPATCH_KERNEL; the image build builds the kernel where it is not cached).
    **_kpatch_boots(KPATCH_KERNEL),
    # trixie's 6.12 with reproducer/kpatch/6.12 (KPATCH_KERNEL_612), the same three boots,
    # and two 6.12 has that 6.1 has not: hVHE (nVHE hyp code with E2H set, on max) and
    # EL2 left to the hyp stub while no VM exists (kvm.enable_virt_at_load=0).
    **_kpatch_boots(KPATCH_KERNEL_612, "-612"),
    "hvhe-kpatch-612": VhostConfig(
        kernel=KPATCH_KERNEL_612,
        kvm_mode="nvhe",
        cpu_model="max",
        smp=2,
        append="arm64_sw.hvhe=1",
        timeout_s=900,
        ground_truth=True,
    ),
    "novirt-kpatch-612": VhostConfig(
        kernel=KPATCH_KERNEL_612,
        kvm_mode="nvhe",
        cpu_model="cortex-a76",
        smp=2,
        append="kvm.enable_virt_at_load=0",
        timeout_s=900,
        ground_truth=True,
    ),
    # sid's 7.2 with reproducer/kpatch/7.2 (KPATCH_KERNEL_72): the same three boots.
    **_kpatch_boots(KPATCH_KERNEL_72, "-72"),
}


# A kpatch boot's name ends in its series' suffix (_kpatch_boots) -> its opt-in marker:
# 6.12's and 7.2's boots are opt-in, 6.1's are CI's.
KPATCH_OPT_IN = {"-612": "kpatch612", "-72": "kpatch72"}
# The series the kpatch boot tests run for, each with its opt-in marker.
KPATCH_SERIES = pytest.mark.parametrize(
    "series",
    [
        "6.1",
        pytest.param("6.12", marks=pytest.mark.kpatch612),
        pytest.param("7.2", marks=pytest.mark.kpatch72),
    ],
)


def kpatch_opt_in(config: str) -> str | None:
    """The opt-in marker of a kpatch boot's checks (None: 6.1's, in CI's run)."""
    return next((m for end, m in KPATCH_OPT_IN.items() if config.endswith(end)), None)


# Markers whose tests run only when `-m` names them: too long for every CI run.
OPT_IN = {
    "kpatch612": "the 6.12 kpatch boots (~14 min cold with their kernel's build, over CI's "
    "budget beside the rest): select with -m kpatch612",
    "kpatch72": "the 7.2 kpatch boots (~16 min cold with their kernel's build, over CI's "
    "budget beside the rest): select with -m kpatch72",
    "unproven": "a boot check that has not yet passed in a boot: select with -m unproven",
}
# The opt-in markers this session's -m names (set before test modules register checks).
_CHOSEN: set[str] = set()


def pytest_configure(config: pytest.Config) -> None:
    """Note which opt-in markers -m selects, so their boot checks are registered."""
    chosen = config.getoption("-m") or ""
    _CHOSEN.update(marker for marker in OPT_IN if marker in chosen)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Opt-in tests (OPT_IN) are skipped unless `-m` selects their marker."""
    chosen = config.getoption("-m") or ""
    for marker, reason in OPT_IN.items():
        if marker in chosen:
            continue
        for item in items:
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


_CHECKS: dict[str, dict[str, str]] = {name: {} for name in VHOST_CONFIGS}
_LATE: set[str] = set()
_FIRST: set[str] = set()


def register_vhost_check(
    config: str,
    name: str,
    script: str,
    late: bool = False,
    opt_in: str | None = None,
    first: bool = False,
) -> None:
    """Add a shell check to `config`'s single boot (call at module import time).

    `late`: run it after every check that is not (it leaves the host dirty, and the
    collect checks that are not `first` and do not pass --allow-dirty need the host no
    dirtier than `first` checks leave it). `first`: run it before every check that is not
    (it asserts on what the boot did before any other check ran a VM: EL2's boot-time
    work, a fresh VMID generation); the premise of a fresh host belongs to these alone, so
    a collect after them passes --allow-dirty where the kernel's state shows. `opt_in`: an OPT_IN
    marker; the check joins the boot only when -m selects it.
    """
    if config not in _CHECKS:
        raise KeyError(f"unknown vhost test config {config!r}; add it to VHOST_CONFIGS")
    if opt_in is not None and opt_in not in _CHOSEN:
        return
    _CHECKS[config][name] = script
    if late:
        _LATE.add(name)
    if first:
        _FIRST.add(name)


def _in_order(checks: dict[str, str]) -> dict[str, str]:
    """The checks in the order they run: first ones, then by registration, late ones last."""
    return dict(sorted(checks.items(), key=lambda item: (item[0] not in _FIRST, item[0] in _LATE)))


def registered_checks(config: str) -> tuple[str, ...]:
    """The names of the checks registered so far for `config`'s boot."""
    return tuple(_CHECKS[config])


@dataclass(frozen=True)
class CheckResult:
    """One batched check's outcome inside the emulated host."""

    status: int
    stdout: str
    stderr: str


@dataclass
class VhostBoot:
    """One finished boot: the run's result, every check's outcome, the streamed lines."""

    result: VhostResult
    checks: dict[str, CheckResult]
    streamed: list[str]


def _batch_script(checks: dict[str, str]) -> str:
    """A shell script that runs each check in turn and exits with the number that failed.

    Each check's start and end (`date +%s`, the emulated host's clock) are kept in its
    directory and its line says how long it took: where CI's time goes, next time too.
    """
    lines = ["failed=0"]
    for name in checks:
        here = f"/out/checks/{name}"
        lines += [
            f"date +%s > {here}/start",
            f"cd {here} && sh ./check.sh > stdout 2> stderr < /dev/null",
            "status=$?",
            f"date +%s > {here}/end",
            f"echo $status > {here}/status",
            f'echo "check {name}: status $status in $(($(cat {here}/end) - $(cat {here}/start)))s"',
            '[ "$status" -eq 0 ] || failed=$((failed + 1))',
        ]
    lines.append("exit $failed")
    return "\n".join(lines) + "\n"


def _read_check(directory: Path) -> CheckResult:
    """A check's saved status and output (status -1 if it never finished)."""
    status_file = directory / "status"
    status = int(status_file.read_text()) if status_file.is_file() else -1
    return CheckResult(
        status,
        (directory / "stdout").read_text(errors="replace"),
        (directory / "stderr").read_text(errors="replace"),
    )


@pytest.fixture(scope="session")
def vhost_available() -> None:
    """Skip (with the reason) where the emulated host cannot run at all."""
    if shutil.which("qemu-system-aarch64") is None:
        pytest.skip("qemu-system-aarch64 missing: apt-get install qemu-system-arm")
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("apt-get/dpkg-deb missing: the vhost image is built from Debian packages")


# Replay: TRACEKIT_VHOST_REPLAY=DIR (a --basetemp of an earlier boot run) makes every
# vhost test read that run's saved boot of its config instead of booting, so a change to
# the host-side code (ingest, analyses, reports) is checked against real boots in
# seconds. The checks' own code ran at boot time: a replay proves nothing about them.
REPLAY_ENV = "TRACEKIT_VHOST_REPLAY"
STREAMED_FILE = "streamed.txt"


class _ReplayedChecks(dict[str, CheckResult]):
    """A replayed boot's checks: one the saved boot did not run skips its test."""

    def __missing__(self, name: str) -> CheckResult:
        pytest.skip(f"{REPLAY_ENV}: the saved boot did not run check {name}")


def _replayed(config_name: str, root: Path) -> VhostBoot:
    """The saved boot of `config_name` under `root` (pytest's vhost-CONFIG0 directory)."""
    import json

    from tracekit.vhost.runner import RUN_RECORD

    out = root / f"vhost-{config_name}0"
    record_file = out / RUN_RECORD
    if not record_file.is_file():
        pytest.skip(f"{REPLAY_ENV}: no saved boot of {config_name} under {root}")
    record = json.loads(record_file.read_text())
    fields = {name: record[name] for name in VhostResult.__dataclass_fields__ if name in record}
    for name in ("out_dir", "console_log", "boot_dmesg", "ground_truth_log"):
        if fields.get(name) is not None:
            fields[name] = out / Path(fields[name]).relative_to(record["out_dir"])
    result = VhostResult(**fields)
    checks = _ReplayedChecks(
        (directory.name, _read_check(directory))
        for directory in sorted((out / "checks").iterdir())
        if directory.is_dir()
    )
    streamed_file = out / STREAMED_FILE
    streamed = streamed_file.read_text().splitlines() if streamed_file.is_file() else []
    return VhostBoot(result, checks, streamed)


@pytest.fixture(scope="session")
def vhost_boot(
    vhost_available: None, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], VhostBoot]:
    """`vhost_boot(config)`: that configuration's one boot with all its checks (cached)."""
    from tracekit.vhost.runner import run

    replay = os.environ.get(REPLAY_ENV)
    if replay:
        return lambda config_name: _replayed(config_name, Path(replay))

    boots: dict[str, VhostBoot] = {}
    # A boot that failed (e.g. timed out) fails every test of its config with the same
    # error: booting it again for each test would multiply a hang by the test count.
    failed: dict[str, Exception] = {}

    def boot(config_name: str) -> VhostBoot:
        """Boot `config_name` the first time it is asked for; reuse the result after."""
        if config_name in failed:
            raise failed[config_name]
        if config_name not in boots:
            out = tmp_path_factory.mktemp(f"vhost-{config_name}")
            for name, script in _CHECKS[config_name].items():
                (out / "checks" / name).mkdir(parents=True)
                (out / "checks" / name / "check.sh").write_text(script + "\n")
            (out / "checks.sh").write_text(_batch_script(_in_order(_CHECKS[config_name])))
            config = VHOST_CONFIGS[config_name]
            streamed: list[str] = []
            try:
                result = run(
                    VhostConfig(**{**config.__dict__, "out": out}),
                    ["sh", "/out/checks.sh"],
                    on_output=streamed.append,
                    progress=lambda message: None,
                )
            except Exception as err:
                failed[config_name] = err
                raise
            checks = {name: _read_check(out / "checks" / name) for name in _CHECKS[config_name]}
            (out / STREAMED_FILE).write_text("".join(line + "\n" for line in streamed))
            boots[config_name] = VhostBoot(result, checks, streamed)
        return boots[config_name]

    return boot
