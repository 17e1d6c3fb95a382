"""End to end: the emulated arm64 host boots each configuration once and runs its checks.

Every check below is batched into its configuration's single boot (see conftest.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import VhostBoot, register_vhost_check

from tracekit.errors import TracekitError
from tracekit.vhost.image import build_image
from tracekit.vhost.kernels import parse_kernel_spec
from tracekit.vhost.runner import VhostConfig, run

pytestmark = pytest.mark.vhost

NVHE = "nvhe-a76"
register_vhost_check(NVHE, "exit7", "echo to-stdout; echo to-stderr >&2; exit 7")
register_vhost_check(NVHE, "dev_kvm", "test -c /dev/kvm")
register_vhost_check(
    NVHE,
    "tracefs",
    "grep ' /sys/kernel/tracing tracefs ' /proc/mounts && "
    "grep -c '^kvm:kvm_entry$' /sys/kernel/tracing/available_events",
)
register_vhost_check(NVHE, "tracekit_version", "python3 -m tracekit --version")
register_vhost_check(
    NVHE, "python_libs", "python3 -c 'import click, elftools; print(\"imports ok\")'"
)
register_vhost_check(NVHE, "cyclictest", "cyclictest -m -p 99 -i 1000 -l 20 -q")
register_vhost_check(NVHE, "stress_ng", "stress-ng --cpu 1 --timeout 1 2>&1")
register_vhost_check(
    NVHE,
    "trace_cmd",
    "trace-cmd record -q -e sched:sched_switch -o /tmp/t.dat "
    "sleep 0.2 > /dev/null && trace-cmd report -i /tmp/t.dat | grep -c sched_switch",
)
register_vhost_check(NVHE, "perf", "perf stat -e task-clock true 2>&1")
register_vhost_check(
    NVHE,
    "topology",
    "grep -c ^processor /proc/cpuinfo; cat /sys/devices/system/cpu/isolated; "
    "cat /sys/devices/system/cpu/cpu3/topology/cluster_cpus_list",
)
register_vhost_check(
    NVHE,
    "shares",
    "grep -E ' /(tracekit|out) 9p ' /proc/mounts; "
    "touch /out/written-inside && ! touch /tracekit/not-writable 2>/dev/null",
)
register_vhost_check(NVHE, "shm", "grep ' /dev/shm tmpfs ' /proc/mounts")
register_vhost_check(NVHE, "env", "echo $PYTHONPATH $TRACEKIT_VHOST $TRACEKIT_VHOST_KERNEL")
register_vhost_check("vhe-max", "dev_kvm", "test -c /dev/kvm")
register_vhost_check("protected-a76", "dev_kvm", "test -c /dev/kvm")
register_vhost_check("rt-a76", "preempt_rt", "uname -v")
register_vhost_check("rt-a76", "cyclictest", "cyclictest -m -p 99 -i 1000 -l 20 -q")
register_vhost_check("rt-a76", "dev_kvm", "test -c /dev/kvm")
register_vhost_check("rt-a76", "no_kvm_note", "echo $TRACEKIT_VHOST_NO_KVM")
TRIXIE = "trixie-max"
register_vhost_check(
    TRIXIE,
    "instance_tracers",
    "mkdir /sys/kernel/tracing/instances/tk-tracers && "
    "cat /sys/kernel/tracing/instances/tk-tracers/available_tracers; "
    "rmdir /sys/kernel/tracing/instances/tk-tracers",
)
register_vhost_check(TRIXIE, "dev_kvm", "test -c /dev/kvm && uname -r")
# trixie's stress-ng links Mesa's loaders; the image drops the drivers they never load.
register_vhost_check(TRIXIE, "stress_ng", "stress-ng --cpu 1 --timeout 1 2>&1")


def _ok(boot: VhostBoot, name: str) -> str:
    """The stdout of a check that must have succeeded (its stderr in the failure message)."""
    check = boot.checks[name]
    assert check.status == 0, f"{name}: status {check.status}, stderr: {check.stderr}"
    return check.stdout


def test_nvhe_reports_mode_and_carries_exit_status(vhost_boot) -> None:
    """nVHE on cortex-a76 initialises nVHE; the command's non-zero status comes back."""
    boot = vhost_boot(NVHE)
    assert boot.result.kvm_mode == "nvhe"
    assert boot.result.dev_kvm
    failed = sum(1 for check in boot.checks.values() if check.status != 0)
    assert failed >= 1  # exit7 at least
    assert boot.result.exit_status == failed
    assert boot.checks["exit7"] == type(boot.checks["exit7"])(7, "to-stdout\n", "to-stderr\n")
    assert any("emulated" in note and "not hardware timings" in note for note in boot.result.notes)


def test_nvhe_streams_output_and_saves_logs(vhost_boot) -> None:
    """The console streams the command's lines only; kernel logs are saved to the out dir."""
    boot = vhost_boot(NVHE)
    assert any(re.fullmatch(r"check exit7: status 7 in \d+s", line) for line in boot.streamed)
    assert not any("Booting Linux" in line for line in boot.streamed)
    assert "Booting Linux" in boot.result.boot_dmesg.read_text()
    assert (boot.result.out_dir / "vhost-dmesg.txt").is_file()
    assert boot.result.console_log.is_file()
    assert (boot.result.out_dir / "written-inside").is_file()


def test_nvhe_environment(vhost_boot) -> None:
    """/dev/kvm, tracefs, /dev/shm, the shares, topology and isolation are as asked."""
    boot = vhost_boot(NVHE)
    _ok(boot, "dev_kvm")
    assert _ok(boot, "tracefs").splitlines()[-1] == "1"
    _ok(boot, "shm")
    assert len(_ok(boot, "shares").splitlines()) == 2
    assert _ok(boot, "topology").split() == ["4", "3", "2-3"]
    assert _ok(boot, "env").split() == ["/tracekit", "1", "bookworm"]


def test_nvhe_tools_run(vhost_boot) -> None:
    """tracekit itself, click/pyelftools and the measurement tools start inside."""
    boot = vhost_boot(NVHE)
    assert _ok(boot, "tracekit_version").startswith("tracekit, version")
    assert "imports ok" in _ok(boot, "python_libs")
    assert "C:     20" in _ok(boot, "cyclictest")
    assert "successful run completed" in _ok(boot, "stress_ng")
    assert int(_ok(boot, "trace_cmd").strip()) > 0
    assert "task-clock" in _ok(boot, "perf")


def test_vhe_on_max(vhost_boot) -> None:
    """`max` has VHE: the kernel reports VHE mode and KVM works."""
    boot = vhost_boot("vhe-max")
    assert boot.result.kvm_mode == "vhe"
    _ok(boot, "dev_kvm")


def test_protected_mode(vhost_boot) -> None:
    """kvm-arm.mode=protected initialises pKVM."""
    boot = vhost_boot("protected-a76")
    assert boot.result.kvm_mode == "protected"
    _ok(boot, "dev_kvm")


def test_rt_flavour_boots_without_kvm(vhost_boot) -> None:
    """The PREEMPT_RT kernel boots, cyclictest runs, and the missing KVM is explained."""
    boot = vhost_boot("rt-a76")
    assert "PREEMPT_RT" in _ok(boot, "preempt_rt")
    assert "C:     20" in _ok(boot, "cyclictest")
    assert boot.checks["dev_kvm"].status != 0
    assert boot.result.kvm_mode == "none"
    assert not boot.result.dev_kvm
    assert "without KVM" in _ok(boot, "no_kvm_note")
    assert any("guests cannot run" in note for note in boot.result.notes)


def test_trixie_on_max_in_nvhe_with_instance_function_graph(vhost_boot) -> None:
    """trixie (6.12) on max: KVM forced to nVHE, function_graph offered in an instance."""
    boot = vhost_boot(TRIXIE)
    assert boot.result.kvm_mode == "nvhe", boot.result.notes
    assert _ok(boot, "dev_kvm").startswith("6.12.")
    assert boot.result.kernel == "trixie"
    assert "function_graph" in _ok(boot, "instance_tracers").split()
    assert "successful run completed" in _ok(boot, "stress_ng")


def test_second_build_does_nothing(vhost_boot) -> None:
    """With the image built, `build` resolves the same versions and builds nothing. The
    boot used the cached image as it was: if Debian's mirror has moved since, the first
    build here brings it up to date, and the second must then do nothing."""
    vhost_boot(NVHE)
    build_image(parse_kernel_spec("bookworm"), lambda message: None)
    messages: list[str] = []
    image = build_image(parse_kernel_spec("bookworm"), messages.append)
    assert any("nothing to do" in message for message in messages)
    assert not any("unpacking" in message for message in messages)
    assert image.initramfs.is_file()


def _qemu_using(path: Path) -> list[str]:
    """Command lines of running QEMUs that share `path` (other runs may be going on)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"qemu-system-aarch64")
            and str(path).encode() in b" ".join(argv)
        ):
            found.append(proc.name)
    return found


def test_timeout_stops_qemu(vhost_available, tmp_path: Path) -> None:
    """A command that outlives --timeout gives a clear error and leaves no QEMU behind."""
    config = VhostConfig(out=tmp_path, timeout_s=5, smp=1)
    with pytest.raises(TracekitError, match="did not finish within 5 s") as caught:
        run(config, ["sleep", "600"], progress=lambda message: None)
    assert caught.value.exit_code == 124
    assert _qemu_using(tmp_path) == []


def test_interrupt_stops_qemu(vhost_available, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) once the command runs: exit 130, one line, no QEMU behind."""
    argv = [
        sys.executable,
        "-m",
        "tracekit",
        "vhost",
        "run",
        "--smp",
        "1",
        "--out",
        str(tmp_path),
        "--",
        "sleep",
        "600",
    ]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    # /init prints nothing before `sleep`; its begin marker is in the console log.
    console = tmp_path / "vhost-console.log"
    while proc.poll() is None and b"@@tracekit-vhost:begin:" not in (
        console.read_bytes() if console.is_file() else b""
    ):
        time.sleep(0.2)  # polling for a state, not timing anything
    assert proc.poll() is None, proc.communicate()[1]
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert stderr.strip().splitlines()[-1] == "tracekit: interrupted"
    assert _qemu_using(tmp_path) == []
