"""Preflight facts about the host, read from /proc, /sys and the kernel log.

Each reader only reads and returns plain dataclasses, so the collector can record them in
the bundle and print them; none of them changes anything. The parsers take text, so
they are tested with real lines from arm64 kernels on any machine.
"""

from __future__ import annotations

import errno
import gzip
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.bundle import NO_CPUIDLE, WFI_STATE
from tracekit.cpus import parse_cpu_list
from tracekit.errors import TracekitError
from tracekit.host.afterguest import TLBI_ACTIONS

SYS_CPU = Path("/sys/devices/system/cpu")
PROC = Path("/proc")
DEVICE_TREE_COMPATIBLE = Path("/proc/device-tree/compatible")
DMI = Path("/sys/class/dmi/id")
KMSG = Path("/dev/kmsg")

# MIDR_EL1 implementer codes of the cores tracekit meets (Arm ARM, "MIDR_EL1").
IMPLEMENTERS = {
    0x00: "software (QEMU)",
    0x41: "Arm",
    0x42: "Broadcom",
    0x43: "Cavium",
    0x46: "Fujitsu",
    0x48: "HiSilicon",
    0x4E: "NVIDIA",
    0x51: "Qualcomm",
    0x61: "Apple",
    0xC0: "Ampere",
}

# (implementer, part number) -> core name: the brief's boards (A53 KV260, A55/A76 RK3588,
# Kunpeng 920) and every core QEMU models for an emulated host.
CORE_NAMES = {
    (0x41, 0xD03): "Cortex-A53",
    (0x41, 0xD04): "Cortex-A35",
    (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57",
    (0x41, 0xD08): "Cortex-A72",
    (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75",
    (0x41, 0xD0B): "Cortex-A76",
    (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77",
    (0x41, 0xD40): "Neoverse-V1",
    (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD44): "Cortex-X1",
    (0x41, 0xD46): "Cortex-A510",
    (0x41, 0xD47): "Cortex-A710",
    (0x41, 0xD48): "Cortex-X2",
    (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4B): "Cortex-A78C",
    (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD80): "Cortex-A520",
    (0x41, 0xD81): "Cortex-A720",
    (0x48, 0xD01): "HiSilicon TSV110 (Kunpeng 920)",
    # QEMU's TCG "max" CPU: implementer 0 (reserved for software), part 'Q'.
    (0x00, 0x051): "QEMU max",
}


@dataclass(frozen=True)
class Midr:
    """The fields of a MIDR_EL1 value."""

    implementer: int
    variant: int
    architecture: int
    part: int
    revision: int

    @classmethod
    def from_value(cls, value: int) -> Midr:
        """Split a MIDR_EL1 value into its fields (bits 31:24, 23:20, 19:16, 15:4, 3:0)."""
        return cls(
            implementer=(value >> 24) & 0xFF,
            variant=(value >> 20) & 0xF,
            architecture=(value >> 16) & 0xF,
            part=(value >> 4) & 0xFFF,
            revision=value & 0xF,
        )

    @property
    def core_name(self) -> str:
        """The core's marketing name, or the raw codes when the table does not know it."""
        known = CORE_NAMES.get((self.implementer, self.part))
        if known:
            return known
        vendor = IMPLEMENTERS.get(self.implementer, f"implementer {self.implementer:#04x}")
        return f"{vendor} part {self.part:#05x}"

    @property
    def revision_name(self) -> str:
        """Arm's rNpM notation, which errata notices use."""
        return f"r{self.variant}p{self.revision}"


@dataclass
class CpuCore:
    """One logical CPU: what core it is and where it sits."""

    cpu: int
    name: str
    midr: Midr | None
    cluster: int | None
    online: bool


def read_cpus(sys_cpu: Path = SYS_CPU, cpuinfo: Path = PROC / "cpuinfo") -> list[CpuCore]:
    """Every possible CPU with its core (MIDR on arm64, model name elsewhere) and cluster."""
    from_cpuinfo = parse_cpuinfo(cpuinfo.read_text()) if cpuinfo.exists() else {}
    cores = []
    for cpu in parse_cpu_list(_read(sys_cpu / "possible") or "0"):
        base = sys_cpu / f"cpu{cpu}"
        midr_text = _read(base / "regs" / "identification" / "midr_el1")
        midr = Midr.from_value(int(midr_text, 16)) if midr_text else None
        info = from_cpuinfo.get(cpu, {})
        if midr is None and "CPU part" in info:
            midr = _midr_from_cpuinfo(info)
        name = midr.core_name if midr else info.get("model name", "unknown")
        cluster_text = _read(base / "topology" / "cluster_id") or _read(
            base / "topology" / "physical_package_id"
        )
        online_text = _read(base / "online")
        cores.append(
            CpuCore(
                cpu=cpu,
                name=name,
                midr=midr,
                cluster=int(cluster_text) if cluster_text else None,
                online=online_text != "0",
            )
        )
    return cores


def parse_cpuinfo(text: str) -> dict[int, dict[str, str]]:
    """/proc/cpuinfo as {processor: {key: value}} (arm64 and x86 layouts alike)."""
    cpus: dict[int, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "processor" and value.isdigit():
            current = cpus.setdefault(int(value), {})
        elif current is not None:
            current[key] = value
    return cpus


def _midr_from_cpuinfo(info: dict[str, str]) -> Midr:
    """The MIDR fields arm64's /proc/cpuinfo prints one by one."""
    return Midr(
        implementer=int(info.get("CPU implementer", "0"), 0),
        variant=int(info.get("CPU variant", "0"), 0),
        architecture=int(info.get("CPU architecture", "8"), 0) & 0xF,
        part=int(info.get("CPU part", "0"), 0),
        revision=int(info.get("CPU revision", "0"), 0),
    )


@dataclass
class KvmMode:
    """How KVM initialised: nvhe, hvhe, vhe, protected, none, or unknown; and the line."""

    mode: str
    evidence: str


# Kernel log lines that name KVM's mode, newest wording first.
KVM_MODE_LINES = (
    # 6.12 runs pKVM with E2H set (hVHE) on a VHE-capable CPU: "Protected hVHE".
    (re.compile(r"kvm \[\d+\]: Protected [nh]VHE mode initialized successfully"), "protected"),
    (re.compile(r"kvm \[\d+\]: Hyp hVHE mode initialized successfully"), "hvhe"),
    (re.compile(r"kvm \[\d+\]: Hyp (nVHE )?mode initialized successfully"), "nvhe"),
    (re.compile(r"kvm \[\d+\]: VHE mode initialized successfully"), "vhe"),
    (re.compile(r"kvm \[\d+\]: (HYP mode not available|KVM disabled from command line)"), "none"),
)


def parse_kvm_mode(log: str) -> KvmMode:
    """KVM's mode from the kernel log (arch/arm64/kvm/arm.c reports it once at boot)."""
    for line in log.splitlines():
        for pattern, mode in KVM_MODE_LINES:
            if pattern.search(line):
                return KvmMode(mode, line.strip())
    return KvmMode("unknown", "")


def kvm_mode(log: str, cmdline: dict[str, str]) -> KvmMode:
    """The mode from the log; if the boot lines have rotated out, what was asked for."""
    found = parse_kvm_mode(log)
    if found.mode == "unknown" and "kvm-arm.mode" in cmdline:
        asked = cmdline["kvm-arm.mode"]
        return KvmMode(f"{asked}?", f"kernel log rotated; command line asks kvm-arm.mode={asked}")
    return found


def cpu_feature_lines(log: str) -> list[str]:
    """The kernel log's CPU capability and errata lines ("CPU features: detected: ...")."""
    wanted = re.compile(r"CPU features:|erratum|errata", re.IGNORECASE)
    return [line.strip() for line in log.splitlines() if wanted.search(line)]


# CPU features a comparison depends on, as the boot log names them: arm64's system
# capabilities print "CPU features: detected: <desc>" (arch/arm64/kernel/cpufeature.c,
# 6.1 and 6.12). FEAT_TLBIRANGE decides whether range/munmap probes issue range TLBIs;
# without FEAT_FWB KVM traps the guest's VM-register writes and kvm_toggle_cache runs.
# Errata workarounds print the same way: ARM64_WORKAROUND_REPEAT_TLBI ("Broken broadcast
# TLBI completion", 6.1.176 cpu_errata.c: Cortex-A55 2441007 and Cortex-A76 4118414 at all
# revisions, A77/A78/X1/N1..., A510 r0p0-r1p1) makes every DSB ISH completing a broadcast
# TLBI issue one more TLBI VALE1IS (host) or VALE2IS (hyp code), XZR, and one more DSB ISH
# (asm/tlbflush.h __tlbi_sync_s1ish[_hyp]): KVM's broadcast flushes and the probe's
# syscalls execute it. The emulated cortex-a76 matches it (QEMU's MIDR), max and
# cortex-a53 do not.
LOGGED_FEATURES = {
    "tlbirange": "TLB range maintenance instructions",  # ARM64_HAS_TLB_RANGE
    "fwb": "Stage-2 Force Write-Back",  # ARM64_HAS_STAGE2_FWB
    "repeat_tlbi": "Broken broadcast TLBI completion",  # ARM64_WORKAROUND_REPEAT_TLBI
}
THP = Path("/sys/kernel/mm/transparent_hugepage")


def logged_features(log: str, config: dict[str, str] | None = None) -> dict[str, dict[str, object]]:
    """Each LOGGED_FEATURES entry present (True), absent (False) or unknown (None), and why.

    What the CPU (or, for an erratum, the kernel's workaround) has, as the boot log says.
    Absent only when the log demonstrably starts at boot ("Booting Linux") and holds
    "CPU features: detected:" lines: a log rotated part-way keeps the later lines and
    loses the early ones (ID registers' TLB and FWB fields are hidden from user space, so
    nothing else can say). FEAT_TLBIRANGE present also says whether this kernel issues
    range TLBIs: system_supports_tlb_range() needs CONFIG_ARM64_TLB_RANGE too (`config`).
    """
    detected = [line for line in cpu_feature_lines(log) if "CPU features: detected:" in line]
    from_boot = "Booting Linux" in log
    out: dict[str, dict[str, object]] = {}
    for key, desc in LOGGED_FEATURES.items():
        found = [line for line in detected if line.endswith(desc)]
        if found:
            out[key] = {"present": True, "evidence": f"the CPU has it: {found[0]}"}
        elif detected and from_boot:
            out[key] = {"present": False, "evidence": f"no 'CPU features: detected: {desc}' line"}
        else:
            out[key] = {"present": None, "evidence": "the kernel log does not start at boot"}
    if out["tlbirange"]["present"]:
        built = (config or {}).get("CONFIG_ARM64_TLB_RANGE")
        out["tlbirange"]["kernel_uses"] = None if built is None else built == "y"
    return out


def read_thp(thp: Path = THP) -> dict[str, str | None]:
    """Transparent huge pages' enabled and defrag modes (the bracketed one), None if absent."""
    modes: dict[str, str | None] = {}
    for name in ("enabled", "defrag"):
        text = _read(thp / name)
        match = re.search(r"\[(\S+)\]", text or "")
        modes[name] = match[1] if match else None
    return modes


def read_idle_usage(cpus: list[int], sys_cpu: Path = SYS_CPU) -> dict[str, int]:
    """How often each CPU entered each power-down cpuidle state so far ("cpuN/NAME" ->
    usage; WFI left out), or "cpuN/no-cpuidle-WFI-only" -> 0 when it has none."""
    usage: dict[str, int] = {}
    for cpu in cpus:
        found = False
        for state in sorted((sys_cpu / f"cpu{cpu}" / "cpuidle").glob("state*")):
            name, count = _read(state / "name"), _read(state / "usage")
            if name and name != WFI_STATE and count and count.isdigit():
                usage[f"cpu{cpu}/{name}"] = int(count)
                found = True
        if not found:
            usage[f"cpu{cpu}/{NO_CPUIDLE}"] = 0
    return usage


def read_kernel_log(kmsg: Path = KMSG) -> str:
    """The kernel's log buffer as message lines, read from /dev/kmsg without blocking."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise TracekitError(
            f"cannot read the kernel log ({kmsg}): {err.strerror}; run as root "
            "(or set kernel.dmesg_restrict=0)"
        ) from None
    lines = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.EPIPE:  # overwritten while reading: go on
                    continue
                raise
            if not record:
                break
            # "prio,seq,usec,flags;message" then optional " KEY=value" lines.
            message = record.decode(errors="replace").split("\n", 1)[0]
            lines.append(message.partition(";")[2])
    finally:
        os.close(fd)
    return "\n".join(lines)


@dataclass
class KernelInfo:
    """Which kernel runs, and its build configuration (empty if none can be found)."""

    release: str
    version: str
    config_source: str
    config: dict[str, str] = field(default_factory=dict)


def read_kernel_info(proc: Path = PROC, boot: Path = Path("/boot")) -> KernelInfo:
    """Kernel release, version string and config (/proc/config.gz, else /boot/config-*)."""
    release = os.uname().release
    version = _read(proc / "version")
    for source in (proc / "config.gz", boot / f"config-{release}"):
        if source.exists():
            raw = source.read_bytes()
            text = gzip.decompress(raw).decode() if source.suffix == ".gz" else raw.decode()
            return KernelInfo(release, version, str(source), parse_kernel_config(text))
    return KernelInfo(release, version, "", {})


def parse_kernel_config(text: str) -> dict[str, str]:
    """A kernel .config as {CONFIG_X: value}; "is not set" lines become "n"."""
    config = {}
    for line in text.splitlines():
        unset = re.match(r"# (CONFIG_\w+) is not set", line)
        if unset:
            config[unset[1]] = "n"
        elif line.startswith("CONFIG_"):
            key, _, value = line.partition("=")
            config[key] = value.strip('"')
    return config


@dataclass
class Isolation:
    """How a CPU is shielded from the rest: isolcpus, nohz_full, rcu_nocbs."""

    cpu: int
    isolcpus: bool
    nohz_full: bool
    rcu_nocbs: bool

    @property
    def complete(self) -> bool:
        """All three, as the brief's protocol requires for the measuring CPU."""
        return self.isolcpus and self.nohz_full and self.rcu_nocbs


def read_isolation(
    cpu: int, sys_cpu: Path = SYS_CPU, cmdline: Path = PROC / "cmdline"
) -> Isolation:
    """A CPU's isolation, from sysfs where the kernel reports it, else the command line."""
    args = parse_cmdline(cmdline.read_text() if cmdline.exists() else "")
    isolated = _read(sys_cpu / "isolated")
    nohz = _read(sys_cpu / "nohz_full")
    return Isolation(
        cpu=cpu,
        isolcpus=cpu in _cpu_list(isolated if isolated is not None else args.get("isolcpus", "")),
        nohz_full=cpu in _cpu_list(nohz if nohz is not None else args.get("nohz_full", "")),
        rcu_nocbs=cpu in _cpu_list(args.get("rcu_nocbs", "")),
    )


def parse_cmdline(text: str) -> dict[str, str]:
    """Kernel command-line parameters as {name: value} (up to "--", init's arguments)."""
    args = {}
    for word in text.split():
        if word == "--":
            break
        key, _, value = word.partition("=")
        args[key] = value
    return args


def _cpu_list(text: str) -> list[int]:
    """A CPU list that may carry isolcpus flags ("nohz,domain,2-3") or be "(null)"."""
    kept = [part for part in text.strip().split(",") if part and part[0].isdigit()]
    return parse_cpu_list(",".join(kept))


@dataclass
class Emulation:
    """Whether timings here are a real board's: kind is qemu-virt, qemu, vm or bare-metal."""

    emulated: bool
    kind: str
    evidence: str


def detect_emulation(
    compatible: Path = DEVICE_TREE_COMPATIBLE, dmi: Path = DMI, cpuinfo: Path = PROC / "cpuinfo"
) -> Emulation:
    """Tell an emulated or virtual host from a board: device tree, DMI, hypervisor flag."""
    if compatible.exists():
        names = compatible.read_bytes().split(b"\0")
        if b"linux,dummy-virt" in names:
            return Emulation(True, "qemu-virt", "device tree compatible linux,dummy-virt")
    for name in ("sys_vendor", "product_name"):
        value = _read(dmi / name) or ""
        if "QEMU" in value:
            return Emulation(True, "qemu", f"DMI {name}: {value}")
    flags = next((line for line in _lines(cpuinfo) if line.startswith("flags")), "")
    if re.search(r"\bhypervisor\b", flags):
        return Emulation(True, "vm", "/proc/cpuinfo flags: hypervisor")
    return Emulation(False, "bare-metal", "no sign of QEMU or a hypervisor")


@dataclass
class CpuPower:
    """What can change a CPU's wake-up latency: idle states, frequency policy."""

    cpu: int
    idle_states: list[str]  # "name (disabled)" for states switched off
    governor: str | None
    min_khz: int | None
    max_khz: int | None


def read_cpu_power(cpu: int, sys_cpu: Path = SYS_CPU) -> CpuPower:
    """A CPU's cpuidle states and cpufreq policy (None where the kernel has no cpufreq)."""
    states = []
    for state in sorted((sys_cpu / f"cpu{cpu}" / "cpuidle").glob("state*")):
        name = _read(state / "name") or state.name
        states.append(f"{name} (disabled)" if _read(state / "disable") == "1" else name)
    freq = sys_cpu / f"cpu{cpu}" / "cpufreq"
    low, high = _read(freq / "scaling_min_freq"), _read(freq / "scaling_max_freq")
    return CpuPower(
        cpu=cpu,
        idle_states=states,
        governor=_read(freq / "scaling_governor"),
        min_khz=int(low) if low else None,
        max_khz=int(high) if high else None,
    )


def read_thermal(thermal: Path = Path("/sys/class/thermal")) -> dict[str, float]:
    """Each thermal zone's temperature in degrees C, by "zoneN:type"."""
    temps = {}
    for zone in sorted(thermal.glob("thermal_zone*")):
        millidegrees = _read(zone / "temp")
        if millidegrees and millidegrees.lstrip("-").isdigit():
            temps[f"{zone.name}:{_read(zone / 'type')}"] = int(millidegrees) / 1000
    return temps


@dataclass
class HostFacts:
    """Everything preflight knows, for the bundle's manifest (dataclasses.asdict)."""

    kernel: KernelInfo
    kvm: KvmMode
    cpus: list[CpuCore]
    cpu_features: list[str]
    isolation: list[Isolation]
    features: dict[str, dict[str, object]]  # LOGGED_FEATURES: present, and on what it rests
    thp: dict[str, str | None]  # transparent_hugepage enabled/defrag
    power: list[CpuPower]
    thermal: dict[str, float]
    emulation: Emulation
    kpatch: Kpatch | None = None


# reproducer/kpatch's debugfs directory (present only when booted kvm-arm.debug_maint=1).
KPATCH_DIR = Path("/sys/kernel/debug/kvm/arm64_debug_maint")


@dataclass
class Kpatch:
    """What tracekit's debug series offers on this kernel, and its teardown switch."""

    mode: str  # the KVM mode it reports; "protected (refused)" refuses every operation
    vmid_bits: int | None
    ops: list[str]
    # off, alle1is or last-ran, "off (inactive: vhe)" where the switch cannot act (the
    # series refuses any other choice there); None if the file is absent
    teardown_flush: str | None
    teardown_flushes: int | None
    # local flushes of last-ran that failed at EL2 (none should); None: an older series
    teardown_failures: int | None = None


def parse_kpatch(op_text: str, teardown_text: str | None) -> Kpatch:
    """The series' `op` file (mode, vmid_bits, ops) and `teardown_flush` ([choice], count)."""
    fields = dict(line.split(":", 1) for line in op_text.splitlines() if ":" in line)
    bits = fields.get("vmid_bits", "").strip()
    policy, flushes, failures = None, None, None
    if teardown_text is not None:
        chosen = re.search(r"\[([\w-]+)\]", teardown_text)
        policy = chosen.group(1) if chosen else None
        inactive = re.search(r"\(inactive: [\w ()]+?\)$", teardown_text.splitlines()[0])
        if policy is not None and inactive:
            policy = f"{policy} {inactive.group(0)}"
        count = re.search(r"flushes: (\d+)", teardown_text)
        flushes = int(count.group(1)) if count else None
        failed = re.search(r"^failed: (\d+)", teardown_text, re.M)
        failures = int(failed.group(1)) if failed else None
    return Kpatch(
        mode=fields.get("mode", "").strip(),
        vmid_bits=int(bits) if bits.isdigit() else None,
        ops=fields.get("ops", "").split(),
        teardown_flush=policy,
        teardown_flushes=flushes,
        teardown_failures=failures,
    )


def read_kpatch(directory: Path = KPATCH_DIR) -> Kpatch | None:
    """The debug series' interface on this kernel, or None (stock kernel, or not enabled)."""
    op_text = _read(directory / "op")
    if op_text is None:
        return None
    return parse_kpatch(op_text, _read(directory / "teardown_flush"))


def check_kpatch_for(action: str, kpatch: Kpatch | None, enable_virt_at_load: str) -> None:
    """One line, before anything runs, if --after-guest tlbi:... cannot be done here."""
    if action not in TLBI_ACTIONS:
        return
    op = TLBI_ACTIONS[action][0]
    if kpatch is None:
        raise TracekitError(
            f"--after-guest {action} needs tracekit's debug series, and {KPATCH_DIR} is "
            "missing (or unreadable: debugfs needs root): boot a kernel with reproducer/kpatch/"
            " and kvm-arm.debug_maint=1 (in the "
            "emulated host: --kernel bookworm:kpatch or trixie:kpatch)"
        )
    if kpatch.mode.startswith("protected"):
        raise TracekitError(
            f"--after-guest {action}: the debug series refuses EL2 maintenance in protected "
            "mode (the host does not own EL2 there); use nvhe or vhe"
        )
    if op not in kpatch.ops:
        raise TracekitError(
            f"--after-guest {action}: this kernel's debug series offers {', '.join(kpatch.ops)}"
            f", not {op}: rebuild it from this checkout's reproducer/kpatch/"
        )
    # 6.12+ with kvm.enable_virt_at_load=0 leaves EL2 at the hyp stub while no VM is
    # alive; the series then brings KVM's EL2 up for the operation, and ___kvm_hyp_init
    # runs TLBI ALLE2 and ALLE1 on every online CPU first (hyp-init.S): the requested
    # instruction would not be what removed the state, and the controls would be void.
    if enable_virt_at_load == "no" and kpatch.mode in ("nvhe", "hvhe"):
        raise TracekitError(
            f"--after-guest {action}: with kvm.enable_virt_at_load=0 each operation first "
            "re-initialises EL2 (a local TLBI ALLE1 on every online CPU), so no tlbi: result "
            "isolates its instruction; boot without kvm.enable_virt_at_load=0"
        )


def read_host_facts(isolated_cpus: list[int]) -> HostFacts:
    """Read every fact at once; the kernel log needs root (an error says so otherwise)."""
    log = read_kernel_log()
    cmdline = parse_cmdline(_read(PROC / "cmdline") or "")
    cpus = read_cpus()
    info = read_kernel_info()
    # The whole config is large; the bundle keeps what tracing and KVM depend on.
    info.config = {k: v for k, v in info.config.items() if _config_matters(k)}
    return HostFacts(
        kernel=info,
        kvm=kvm_mode(log, cmdline),
        cpus=cpus,
        cpu_features=cpu_feature_lines(log),
        isolation=[read_isolation(cpu) for cpu in isolated_cpus],
        features=logged_features(log, info.config),
        thp=read_thp(),
        power=[read_cpu_power(core.cpu) for core in cpus],
        thermal=read_thermal(),
        emulation=detect_emulation(),
        kpatch=read_kpatch(),
    )


def _config_matters(key: str) -> bool:
    """Config options that say what can be traced, and how KVM and the scheduler run."""
    return bool(
        re.match(
            r"CONFIG_(KVM|ARM64_|PREEMPT|HZ|NO_HZ|RCU_NOCB|KPROBE|FTRACE|FUNCTION_|DYNAMIC_FTRACE"
            r"|KALLSYMS|DEBUG_INFO_BTF|PROBE_EVENTS|TRACING|RING_BUFFER|CPU_IDLE|CPU_FREQ)",
            key,
        )
    )


def _read(path: Path) -> str | None:
    """A small sysfs/procfs file's stripped text, or None where the kernel has none."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _lines(path: Path) -> list[str]:
    """A file's lines, or none when it cannot be read."""
    text = _read(path)
    return text.splitlines() if text else []
