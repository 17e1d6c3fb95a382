"""Preflight readers: parsers on real arm64 kernel lines, readers on this machine's files."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from tracekit.host.preflight import (
    Midr,
    cpu_feature_lines,
    detect_emulation,
    kvm_mode,
    logged_features,
    parse_cmdline,
    parse_cpuinfo,
    parse_kernel_config,
    parse_kvm_mode,
    read_cpu_power,
    read_cpus,
    read_host_facts,
    read_idle_usage,
    read_isolation,
    read_kernel_info,
    read_kernel_log,
    read_thermal,
    read_thp,
)

# Boot lines as arm64 kernels print them. The first two were quoted by a kernel developer
# on the kvmarm list (an nVHE boot of an older kernel, then a VHE one); the "not
# available" one is from Debian's 6.1.0-39-arm64 booted under QEMU TCG without EL2; the
# "Hyp nVHE"/"Protected nVHE"/"Hyp hVHE" and "disabled" ones are the wording of newer
# kernels' arch/arm64/kvm/arm.c (read there, not captured from a boot).
KVM_LINES = [
    ("[    1.352302] kvm [1]: Hyp mode initialized successfully", "nvhe"),
    ("[    0.037683] kvm [1]: VHE mode initialized successfully", "vhe"),
    ("[    1.596879] kvm [1]: HYP mode not available", "none"),
    ("[    0.562114] kvm [1]: Hyp nVHE mode initialized successfully", "nvhe"),
    ("[    0.562114] kvm [1]: Protected nVHE mode initialized successfully", "protected"),
    ("[    0.562114] kvm [1]: Hyp hVHE mode initialized successfully", "hvhe"),
    # 6.12's protected mode on a VHE-capable CPU (the protected-kpatch-612 boot, cortex-a76).
    ("[    0.520000] kvm [1]: Protected hVHE mode initialized successfully", "protected"),
    ("[    0.100000] kvm [1]: KVM disabled from command line", "none"),
]


@pytest.mark.parametrize(("line", "mode"), KVM_LINES)
def test_kvm_mode_from_the_kernel_log(line: str, mode: str) -> None:
    log = f"[    0.000000] Booting Linux on physical CPU 0x0000000000 [0x410fd034]\n{line}\n"
    found = parse_kvm_mode(log)
    assert found.mode == mode
    assert found.evidence == line


def test_kvm_mode_falls_back_to_the_command_line_when_the_log_rotated() -> None:
    assert parse_kvm_mode("nothing about kvm\n").mode == "unknown"
    assert kvm_mode("", {"kvm-arm.mode": "nvhe"}).mode == "nvhe?"
    assert kvm_mode("", {}).mode == "unknown"


@pytest.mark.parametrize(
    ("midr", "name", "revision"),
    [
        (0x410FD034, "Cortex-A53", "r0p4"),  # KV260 (Zynq UltraScale+), QEMU cortex-a53
        (0x412FD050, "Cortex-A55", "r2p0"),  # RK3588 little cores
        (0x414FD0B0, "Cortex-A76", "r4p0"),  # RK3588 big cores
        (0x481FD010, "HiSilicon TSV110 (Kunpeng 920)", "r1p0"),
        (0x000F0510, "QEMU max", "r0p0"),  # QEMU TCG -cpu max
        (0x410FD999, "Arm part 0xd99", "r0p9"),
    ],
)
def test_midr_names_the_core(midr: int, name: str, revision: str) -> None:
    fields = Midr.from_value(midr)
    assert fields.core_name == name
    assert fields.revision_name == revision


def test_arm64_cpuinfo_fields() -> None:
    # The layout of arm64's /proc/cpuinfo (arch/arm64/kernel/cpuinfo.c), one A55.
    text = (
        "processor\t: 0\nBogoMIPS\t: 48.00\nFeatures\t: fp asimd evtstrm aes\n"
        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x2\n"
        "CPU part\t: 0xd05\nCPU revision\t: 0\n\n"
    )
    info = parse_cpuinfo(text)
    assert info[0]["CPU part"] == "0xd05"
    assert info[0]["CPU implementer"] == "0x41"


def test_kernel_config_and_cmdline_parsers() -> None:
    config = parse_kernel_config(
        'CONFIG_KVM=y\n# CONFIG_KPROBES is not set\nCONFIG_LOCALVERSION="-rt"\n'
    )
    assert config == {"CONFIG_KVM": "y", "CONFIG_KPROBES": "n", "CONFIG_LOCALVERSION": "-rt"}
    args = parse_cmdline("isolcpus=nohz,domain,3 nohz_full=3 rcu_nocbs=3 quiet -- init-arg=1\n")
    assert args == {"isolcpus": "nohz,domain,3", "nohz_full": "3", "rcu_nocbs": "3", "quiet": ""}


def test_isolation_from_the_command_line(tmp_path: Path) -> None:
    # A sysfs without the isolated/nohz_full files, as on older kernels.
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("isolcpus=nohz,domain,2-3 nohz_full=3 rcu_nocbs=3\n")
    three = read_isolation(3, sys_cpu=tmp_path, cmdline=cmdline)
    assert three.complete
    two = read_isolation(2, sys_cpu=tmp_path, cmdline=cmdline)
    assert two.isolcpus and not two.nohz_full and not two.complete


def test_cpu_feature_and_errata_lines() -> None:
    log = (
        "CPU features: detected: ARM erratum 845719\n"
        "Booting Linux\n"
        "CPU features: detected: Spectre-v2\n"
        "arm-smmu: applying workaround for errata 1234\n"
    )
    assert len(cpu_feature_lines(log)) == 3


@pytest.mark.parametrize(
    ("boot", "present"),
    [("dmesg-bookworm-max-vhe.txt", True), ("dmesg-bookworm-cortex-a76-nvhe.txt", False)],
)
def test_range_tlbi_and_fwb_rest_on_the_boot_logs_cpu_features(boot: str, present: bool) -> None:
    """Real emulated boots (tests/fixtures/vhost): QEMU's max has both, cortex-a76 neither;
    cortex-a76 (not max) gets 6.1.176's REPEAT_TLBI workaround ("Broken broadcast TLBI
    completion")."""
    log = (Path(__file__).parent / "fixtures" / "vhost" / boot).read_text()
    features = logged_features(log)
    assert {k: v["present"] for k, v in features.items()} == {
        "tlbirange": present,
        "fwb": present,
        "repeat_tlbi": not present,
    }
    if present:
        assert str(features["fwb"]["evidence"]).endswith("detected: Stage-2 Force Write-Back")
        assert str(features["tlbirange"]["evidence"]).startswith("the CPU has it")
    rotated = logged_features("Booting Linux\n")
    assert [v["present"] for v in rotated.values()] == [None, None, None]
    # Rotated part-way: the late "detected:" lines survive, the early ones (the
    # erratum's, at 0.000000) are gone: unknown, never "no".
    late = "\n".join(line for line in log.splitlines() if not line.startswith("[    0.000000]"))
    assert all(v["present"] in (None, True) for v in logged_features(late).values())


def test_range_tlbis_need_the_kernel_config_as_well_as_the_cpu() -> None:
    """system_supports_tlb_range(): the CPU's FEAT_TLBIRANGE and CONFIG_ARM64_TLB_RANGE."""
    log = (Path(__file__).parent / "fixtures" / "vhost" / "dmesg-bookworm-max-vhe.txt").read_text()
    assert logged_features(log)["tlbirange"]["kernel_uses"] is None
    off = logged_features(log, {"CONFIG_ARM64_TLB_RANGE": "n"})["tlbirange"]
    assert off["present"] is True and off["kernel_uses"] is False
    assert logged_features(log, {"CONFIG_ARM64_TLB_RANGE": "y"})["tlbirange"]["kernel_uses"]


def test_thp_modes_and_idle_state_usage_from_sysfs(tmp_path: Path) -> None:
    thp = tmp_path / "thp"
    thp.mkdir()
    (thp / "enabled").write_text("[always] madvise never\n")
    (thp / "defrag").write_text("always defer defer+madvise [madvise] never\n")
    assert read_thp(thp) == {"enabled": "always", "defrag": "madvise"}
    assert read_thp(tmp_path / "none") == {"enabled": None, "defrag": None}
    for n, (name, usage) in enumerate((("WFI", 120), ("cpu-sleep", 7))):
        state = tmp_path / "cpu1" / "cpuidle" / f"state{n}"
        state.mkdir(parents=True)
        (state / "name").write_text(f"{name}\n")
        (state / "usage").write_text(f"{usage}\n")
    # WFI loses nothing (no CPU_PM): left out; CPU 2 has no cpuidle and says so.
    assert read_idle_usage([1, 2], sys_cpu=tmp_path) == {
        "cpu1/cpu-sleep": 7,
        "cpu2/no-cpuidle-WFI-only": 0,
    }


# --- this machine's own files ---------------------------------------------------------------


def test_read_cpus_here() -> None:
    cores = read_cpus()
    assert [core.cpu for core in cores][: os.cpu_count() or 1] == list(range(os.cpu_count() or 1))
    assert all(core.name for core in cores)
    if os.uname().machine == "aarch64":
        assert all(core.midr is not None for core in cores)


def test_read_kernel_info_here() -> None:
    info = read_kernel_info()
    assert info.release == os.uname().release
    assert info.release in info.version
    if info.config_source:
        assert info.config.get("CONFIG_FTRACE") == "y" or "CONFIG_FTRACE" in info.config


@pytest.mark.skipif(os.geteuid() != 0, reason="reading /dev/kmsg needs root here")
def test_read_kernel_log_here() -> None:
    log = read_kernel_log()
    assert log.strip()
    # Only the messages: no "prio,seq,usec,flags;" record headers are left.
    assert not any(re.match(r"^\d+,\d+,\d+,", line) for line in log.splitlines())


def test_detect_emulation(tmp_path: Path) -> None:
    compatible = tmp_path / "compatible"
    compatible.write_bytes(b"linux,dummy-virt\0")
    none = tmp_path / "none"
    found = detect_emulation(compatible=compatible, dmi=none, cpuinfo=none)
    assert found.emulated and found.kind == "qemu-virt"
    dmi = tmp_path / "dmi"
    dmi.mkdir()
    (dmi / "sys_vendor").write_text("QEMU\n")
    assert detect_emulation(compatible=none, dmi=dmi, cpuinfo=none).kind == "qemu"
    assert detect_emulation(compatible=none, dmi=none, cpuinfo=none).kind == "bare-metal"


def test_detect_emulation_here() -> None:
    found = detect_emulation()
    flags = Path("/proc/cpuinfo").read_text()
    if " hypervisor" in flags:
        assert found.emulated


def test_cpu_power_from_a_sysfs_tree(tmp_path: Path) -> None:
    # The layout of /sys/devices/system/cpu/cpuN/{cpuidle,cpufreq} on arm64 boards.
    cpu = tmp_path / "cpu2"
    for index, (name, disabled) in enumerate([("WFI", "0"), ("cpu-sleep", "1")]):
        (cpu / "cpuidle" / f"state{index}").mkdir(parents=True)
        (cpu / "cpuidle" / f"state{index}" / "name").write_text(f"{name}\n")
        (cpu / "cpuidle" / f"state{index}" / "disable").write_text(f"{disabled}\n")
    (cpu / "cpufreq").mkdir()
    for name, value in [
        ("scaling_governor", "performance"),
        ("scaling_min_freq", "408000"),
        ("scaling_max_freq", "1800000"),
    ]:
        (cpu / "cpufreq" / name).write_text(f"{value}\n")
    power = read_cpu_power(2, sys_cpu=tmp_path)
    assert power.idle_states == ["WFI", "cpu-sleep (disabled)"]
    assert (power.governor, power.min_khz, power.max_khz) == ("performance", 408000, 1800000)
    assert read_cpu_power(5, sys_cpu=tmp_path).governor is None


def test_thermal_zones(tmp_path: Path) -> None:
    zone = tmp_path / "thermal_zone0"
    zone.mkdir()
    (zone / "type").write_text("soc-thermal\n")
    (zone / "temp").write_text("45384\n")
    assert read_thermal(tmp_path) == {"thermal_zone0:soc-thermal": 45.384}


@pytest.mark.skipif(os.geteuid() != 0, reason="reading /dev/kmsg needs root here")
def test_host_facts_here_are_plain_data() -> None:
    facts = read_host_facts(isolated_cpus=[0])
    as_dict = dataclasses.asdict(facts)
    json.dumps(as_dict)  # goes into the bundle's manifest as is
    assert as_dict["kernel"]["release"] == os.uname().release
    assert len(as_dict["power"]) == len(as_dict["cpus"])
    assert all(key.startswith("CONFIG_") for key in as_dict["kernel"]["config"])
