"""Kernels tracekit builds for the emulated host: Debian's config, trimmed, cross-compiled.

The config is the booted Debian image's own, trimmed to what the emulated host needs:
every module off, the 9p chain the image mounts built in, the SoC platforms off (QEMU's
`virt` board needs none), no DWARF and no BTF (the build's cost; pahole is not needed).
A build lives in a directory directly under its source tree (`build-<config hash>`), so
Kbuild names sources as `../` and a patched tree can start from a copy of the unpatched
build: only what the series changes is recompiled. The cache of builds is capped in size.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError

Progress = Callable[[str], None]

CROSS_COMPILE = "aarch64-linux-gnu-"
# Bump when the trimming or the build recipe changes in a way the config hash misses.
RECIPE_VERSION = 1
BUILD_RECORD = "tracekit-build.json"
BUILD_LOG = "tracekit-build.log"
CACHE_CAP_ENV = "TRACEKIT_KBUILD_CACHE_GB"
DEFAULT_CACHE_CAP_GB = 20.0

# Built in: what /init mounts (virtio-pci transport, 9p over virtio).
FORCE_BUILTIN = ("VIRTIO_PCI", "NET_9P", "NET_9P_VIRTIO", "9P_FS")
# Must still be set after olddefconfig, or the image cannot do its job.
REQUIRED = (
    *FORCE_BUILTIN,
    "KVM",
    "KPROBES",
    "KPROBE_EVENTS",
    "FTRACE",
    "FUNCTION_TRACER",
    "FUNCTION_GRAPH_TRACER",
    "DEBUG_FS",
    "TMPFS",
    "DEVTMPFS",
    "SERIAL_AMBA_PL011_CONSOLE",
    "PCI_HOST_GENERIC",
    "ARM_GIC_V3",
)
# Off: no DWARF (the build's largest cost), no BTF (needs pahole), no module signing
# (Debian's keys are not in the source).
FORCE_OFF = ("DEBUG_INFO_BTF", "DEBUG_INFO_BTF_MODULES", "MODULE_SIG", "MODULE_SIG_ALL")
# Built-in subsystems QEMU's virt board and the image never use (no network devices,
# disks, displays, USB, power management or LSMs): each is compile time saved.
UNUSED_SUBSYSTEMS = (
    "XEN",
    "WIRELESS",
    "WLAN",
    "ETHERNET",
    "NETFILTER",
    "HIBERNATION",
    "SUSPEND",
    "CPU_FREQ",
    "MD",
    "USB_SUPPORT",
    "STAGING",
    "FB",
    "VT",
    "TCG_TPM",
    "SECURITY_SELINUX",
    "SECURITY_TOMOYO",
    "SECURITY_APPARMOR",
    "IMA",
    "INTEGRITY",
    "AUDIT",
    "SPI",
    "MMC",
    "PWM",
    "HWMON",
    "THERMAL",
    "WATCHDOG",
    "POWER_SUPPLY",
    "DMADEVICES",
    "ARM_SMMU",
    "ARM_SMMU_V3",
)
FORCE_STRING = {"SYSTEM_TRUSTED_KEYS": "", "SYSTEM_REVOCATION_KEYS": "", "LOCALVERSION": ""}

# The CI config (`:tk-ci`, `:kpatch-ci`): `allnoconfig` plus a fragment, the smallest
# kernel the emulated host boots with what the kpatch tests use. From the full trimmed
# config it keeps, as they are, every symbol these Kconfig files define: the CPU, its
# errata and features (REPEAT_TLBI, VHE, TLB range, ...), KVM, tracing, preemption, ticks,
# RCU, idle and the PMU, so the CI kernel runs the same arm64 and KVM code as the full one.
CI_KEPT_KCONFIGS = (
    "arch/arm64/Kconfig",
    "arch/arm64/kvm/Kconfig",
    "virt/kvm/Kconfig",
    "kernel/trace/Kconfig",
    "kernel/Kconfig.preempt",
    "kernel/Kconfig.hz",
    "kernel/time/Kconfig",
    "kernel/rcu/Kconfig",
    "drivers/cpuidle/Kconfig",
    "drivers/cpuidle/Kconfig.arm",
    "drivers/firmware/psci/Kconfig",
)
# Kept from the files above, but not wanted: QEMU boots the Image directly with a device
# tree (no EFI, no ACPI), nothing runs 32-bit, nothing kexecs or hibernates.
CI_OFF = ("EFI", "ACPI", "COMPAT", "KEXEC", "KEXEC_FILE", "CRASH_DUMP", "HIBERNATION")
# On (with what they depend on): the boot chain /init uses (initramfs, PL011 console,
# generic PCI host, virtio-pci, 9p), what the image's programs need from the kernel
# (python3, cyclictest, stress-ng, the VMM: ELF and #! binaries, procfs, sysfs, tmpfs,
# devtmpfs, ptys, futexes, epoll, POSIX timers, SysV IPC, file locks), the PMU,
# THP and hugetlbfs (collect's --backing), kprobes, jump labels and the stack protector the
# full one has, and the debug series (which the unpatched tree's Kconfig drops, as in the
# full config).
CI_ON = (
    "BLK_DEV_INITRD",
    "BINFMT_ELF",
    "BINFMT_SCRIPT",
    "TTY",
    "UNIX98_PTYS",
    "SERIAL_AMBA_PL011",
    "SERIAL_AMBA_PL011_CONSOLE",
    "PCI",
    "PCI_MSI",
    "PCI_HOST_GENERIC",
    "ARM_GIC_V3_ITS",
    "VIRTIO_MENU",
    "VIRTIO_PCI",
    "NET",
    "INET",  # 6.1's 9P_FS depends on it
    "UNIX",
    "NET_9P",
    "NET_9P_VIRTIO",
    "NETWORK_FILESYSTEMS",
    "9P_FS",
    "PROC_FS",
    "PROC_SYSCTL",
    "SYSFS",
    "TMPFS",
    "DEVTMPFS",
    "HUGETLBFS",
    "TRANSPARENT_HUGEPAGE",
    "MULTIUSER",
    "SYSVIPC",
    "FUTEX",
    "EPOLL",
    "SIGNALFD",
    "TIMERFD",
    "EVENTFD",
    "SHMEM",
    "AIO",
    "FILE_LOCKING",
    "POSIX_TIMERS",
    "PRINTK",
    "KALLSYMS",
    "PERF_EVENTS",
    "ARM_PMU",
    "CPU_ISOLATION",
    "DEBUG_FS",
    "MODULES",  # 6.1's KPROBES depends on it (none is built: allnoconfig)
    "KPROBES",
    "KPROBE_EVENTS",
    "JUMP_LABEL",  # static keys patched as in the full config, not loads and compares
    "STACKPROTECTOR",
    "STACKPROTECTOR_STRONG",
    "VIRTUALIZATION",
    "KVM",
    "KVM_ARM_DEBUG_MAINT",
)
TOOLS = {"make": "make", "flex": "flex", "bison": "bison", "bc": "bc", "perl": "perl"}


@dataclass(frozen=True)
class BuiltKernel:
    """One finished build: its Image, release and what it was made from."""

    directory: Path
    release: str
    source_version: str
    patch_hash: str  # "" for the unpatched tree
    config_hash: str
    build_s: float  # wall seconds of the make run that finished it (a resumed build: its part)
    # CPU seconds of that make run (all its processes), objects in the build and how many
    # that run compiled: on a shared machine the wall time alone says little. None in
    # records written before they were kept.
    cpu_s: float | None = None
    objects: int | None = None
    objects_built: int | None = None

    @property
    def image(self) -> Path:
        """The uncompressed arm64 Image QEMU boots."""
        return self.directory / "arch" / "arm64" / "boot" / "Image"


def platform_symbols(tree: Path) -> list[str]:
    """Every ARCH_* SoC platform arm64 offers (arch/arm64/Kconfig.platforms)."""
    text = (tree / "arch" / "arm64" / "Kconfig.platforms").read_text()
    return [line.split()[1] for line in text.splitlines() if line.startswith("config ARCH_")]


def symbol_of(line: str) -> str | None:
    """The CONFIG_ name a config line sets or unsets, without the prefix."""
    if line.startswith("CONFIG_"):
        return line[len("CONFIG_") :].split("=", 1)[0]
    if line.startswith("# CONFIG_") and line.endswith(" is not set"):
        return line[len("# CONFIG_") : -len(" is not set")]
    return None


def _setting(name: str, platforms: set[str], line: str) -> str:
    """The trimmed form of one config line."""
    if name in FORCE_BUILTIN:
        return f"CONFIG_{name}=y"
    if name in FORCE_STRING:
        return f'CONFIG_{name}="{FORCE_STRING[name]}"'
    off = name in FORCE_OFF or name in UNUSED_SUBSYSTEMS or name in platforms
    off = off or line.endswith("=m")
    if name == "DEBUG_INFO_NONE":
        return "CONFIG_DEBUG_INFO_NONE=y"
    if off or name.startswith("DEBUG_INFO"):
        return f"# CONFIG_{name} is not set"
    return line


def trimmed_config(debian_config: str, platforms: list[str]) -> str:
    """Debian's config with modules, SoC platforms and debug info off (olddefconfig after)."""
    wanted = set(platforms)
    lines, seen = [], set()
    for line in debian_config.splitlines():
        name = symbol_of(line)
        if name is None:
            continue
        seen.add(name)
        lines.append(_setting(name, wanted, line))
    lines += [f"CONFIG_{name}=y" for name in FORCE_BUILTIN if name not in seen]
    return "\n".join(lines) + "\n"


def kconfig_symbols(tree: Path, files: tuple[str, ...]) -> set[str]:
    """The symbols the named Kconfig files of `tree` define (`config NAME` lines)."""
    names: set[str] = set()
    for name in files:
        path = tree / name
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.startswith(("config ", "menuconfig ")):
                    names.add(line.split()[1])
    return names


def ci_fragment(full_config: str, tree: Path) -> str:
    """The allnoconfig fragment of the CI config: the full config's settings of the kept
    Kconfig files (CI_OFF off), and REQUIRED and CI_ON on."""
    kept = kconfig_symbols(tree, CI_KEPT_KCONFIGS) - set(CI_OFF)
    lines = [line for line in full_config.splitlines() if symbol_of(line) in kept]
    lines += [f"# CONFIG_{name} is not set" for name in CI_OFF]
    lines += [f"CONFIG_{name}=y" for name in dict.fromkeys((*REQUIRED, *CI_ON))]
    return "\n".join(lines) + "\n"


def ci_config(tree: Path, fragment: str, scratch: Path) -> str:
    """`make allnoconfig` with `fragment` in a scratch build directory: the whole .config."""
    check_tools()  # kconfig itself needs flex and bison
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "ci-fragment.config").write_text(fragment)
    argv = [
        "make",
        "-s",
        "-C",
        str(tree),
        f"O={scratch}",
        "ARCH=arm64",
        f"CROSS_COMPILE={CROSS_COMPILE}",
        f"KCONFIG_ALLCONFIG={scratch / 'ci-fragment.config'}",
        "allnoconfig",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output = done.stderr or done.stdout
        raise TracekitError(f"the CI kernel config failed in {scratch}: {make_error(output)}")
    return (scratch / ".config").read_text()


def make_error(output: str) -> str:
    """The line of make's output that says what went wrong: its first error, not the last
    `Error 2` of the sub-make that only says one happened."""
    lines = [line.strip() for line in output.strip().splitlines()]
    for line in lines:
        said = line.strip("* ").strip()
        if said and line.startswith("***"):
            return said
    for line in lines:
        if "error:" in line.lower() or "Error 1" in line:
            return line
    return lines[-1] if lines else "no output"


def config_hash(config: str) -> str:
    """A short hash of the config fed to olddefconfig, with the recipe's version."""
    return hashlib.sha256(f"recipe={RECIPE_VERSION}\n{config}".encode()).hexdigest()[:10]


def release_suffix(config_digest: str, patch_hash: str) -> str:
    """LOCALVERSION: `-tk<config>` unpatched, `-tk<config>-kp<patch>` patched."""
    return f"-tk{config_digest[:6]}" + (f"-kp{patch_hash}" if patch_hash else "")


def check_tools() -> None:
    """One line naming the Debian packages if a build tool is missing."""
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if shutil.which(CROSS_COMPILE + "gcc") is None:
        missing.append("gcc-aarch64-linux-gnu")
    if missing:
        raise TracekitError(
            f"building a kernel needs {', '.join(missing)}: "
            f"`apt-get install {' '.join(missing)} libssl-dev`"
        )


def _objects(build: Path, since: float = 0.0) -> int:
    """How many object files a build directory holds (written at or after `since`)."""
    return sum(1 for path in build.rglob("*.o") if path.stat().st_mtime >= since)


def _children_cpu_s() -> float:
    """CPU seconds used so far by this process's finished children (the make runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _make(build: Path, args: list[str], log: Path) -> None:
    """Run make for the arm64 cross build at the lowest priority, its output into `log`."""
    argv = [
        "nice",
        "-n",
        "19",
        "make",
        f"-j{os.cpu_count() or 1}",
        "-C",
        str(build.parent),
        f"O={build.name}",
        "ARCH=arm64",
        f"CROSS_COMPILE={CROSS_COMPILE}",
        *args,
    ]
    with log.open("a") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise TracekitError(
            f"kernel build failed in {build} ({make_error(log.read_text())}); full log: {log}"
        )


def image_targets(tree: Path) -> list[str]:
    """make's targets for the Image and the list of built-in modules: up to 6.x the top
    Makefile has a `modules.builtin` rule; 7.2's vmlinux writes it (scripts/Makefile.vmlinux),
    and naming it there fails with `No rule to make target`."""
    makefile = (tree / "Makefile").read_text(errors="replace")
    rule = re.search(r"^[^\t#].*\bmodules\.builtin:", makefile, re.M)
    return ["Image", "modules.builtin"] if rule else ["Image"]


def _check_required(config_text: str) -> None:
    """One line if olddefconfig dropped something the image needs."""
    lines = set(config_text.splitlines())
    lost = [name for name in REQUIRED if f"CONFIG_{name}=y" not in lines]
    if lost:
        raise TracekitError(
            f"the trimmed kernel config lost {', '.join(lost)}: this source's Kconfig "
            "differs from what tracekit expects (kbuild.REQUIRED)"
        )


def _reproducible_env(suffix: str) -> list[str]:
    """make variables that keep the build's identity fixed (no date, user or host)."""
    return [
        f"LOCALVERSION={suffix}",
        "KBUILD_BUILD_TIMESTAMP=tracekit",
        "KBUILD_BUILD_USER=tracekit",
        "KBUILD_BUILD_HOST=tracekit",
    ]


def _write_if_changed(path: Path, text: str) -> None:
    """Write `text` unless the file holds it: an unchanged mtime spares make a rerun."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def load_build(build: Path) -> BuiltKernel | None:
    """The finished build in `build`, or None (the record is written last)."""
    try:
        record = json.loads((build / BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return None
    kernel = BuiltKernel(build, **record)
    return kernel if kernel.image.is_file() else None


def build_kernel(
    tree: Path,
    config: str,
    source_version: str,
    patch_hash: str,
    progress: Progress,
    seed: Path | None = None,
    changed: Sequence[str] = (),
) -> BuiltKernel:
    """Build `tree` with `config` (cached); `seed` is a finished build to start from, of a
    tree that differs from `tree` only in the files `changed` (paths relative to it)."""
    build = tree / f"build-{config_hash(config)}"
    cached = load_build(build)
    if cached is not None:
        os.utime(build)  # the cache's eviction goes by last use
        return cached
    check_tools()
    # Two builds in one directory would corrupt it: the second waits for the first.
    # The lock sits beside the tree: inside, a patched copy of the tree would link it.
    with _locked(tree.parent / f".{tree.name}-{build.name}.lock", progress):
        return load_build(build) or _build(
            build, config, source_version, patch_hash, progress, (seed, changed)
        )


@contextlib.contextmanager
def _locked(path: Path, progress: Progress) -> Iterator[None]:
    """Hold an exclusive flock on `path`, saying so when another build holds it."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"kernel build: waiting for the other build of {path.parent.name}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def seed_build(seed: Path, build: Path, changed: Sequence[str]) -> None:
    """Start `build` as a copy of the finished build `seed`, the `changed` files of its
    tree made newer than every copied object."""
    subprocess.run(["cp", "-a", str(seed), str(build)], check=True)
    (build / BUILD_RECORD).unlink()
    # The log is this build's own: the seed's warnings are not the series'.
    (build / BUILD_LOG).unlink(missing_ok=True)
    # make rebuilds by mtime: where the patched tree is older than the seed (the unpatched
    # build of a new config, made after the tree was patched), it kept the seed's objects
    # of the files the series writes and linked a kernel without the series' hyp code.
    # Those files are real copies in the patched tree (ksource.patched_tree): touching
    # them leaves the pristine tree's times alone.
    for relative in changed:
        path = build.parent / relative
        if path.is_file():
            os.utime(path)


def _build(
    build: Path,
    config: str,
    source_version: str,
    patch_hash: str,
    progress: Progress,
    seeding: tuple[Path | None, Sequence[str]],
) -> BuiltKernel:
    """The build itself, under the lock: seeded, resumed or cold."""
    digest = config_hash(config)
    tree = build.parent
    seed, changed = seeding
    # An interrupted build is resumed (make redoes only what is missing), never restarted.
    if not build.exists() and seed is not None and load_build(seed) is not None:
        progress(f"kernel build: starting from {seed.name} of {seed.parent.name}")
        seed_build(seed, build, changed)
    build.mkdir(exist_ok=True)
    log = build / BUILD_LOG
    _write_if_changed(build / ".config", config)
    suffix = release_suffix(digest, patch_hash)
    env = _reproducible_env(suffix)
    # Wall time for the object count: a recompiled object of a seeded copy counts too.
    started, cpu, wall = time.monotonic(), _children_cpu_s(), time.time()
    _make(build, [*env, "olddefconfig"], log)
    _check_required((build / ".config").read_text())
    progress(f"kernel build: {tree.name} {suffix} (nice 19; log {log})")
    _make(build, [*env, *image_targets(tree)], log)
    elapsed = round(time.monotonic() - started, 1)
    objects, compiled = _objects(build), _objects(build, since=wall)
    # Kbuild writes the release it built with here (no second make, no other compiler).
    release = (build / "include" / "config" / "kernel.release").read_text().strip()
    record = {
        "release": release,
        "source_version": source_version,
        "patch_hash": patch_hash,
        "config_hash": digest,
        "build_s": elapsed,
        "cpu_s": round(_children_cpu_s() - cpu, 1),
        "objects": objects,
        "objects_built": compiled,
    }
    (build / BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    progress(
        f"kernel build: {release} built in {elapsed:.0f} s ({record['cpu_s']:.0f} CPU-s; "
        f"{compiled} of its {objects} objects compiled)"
    )
    return BuiltKernel(build, **record)


def _size(path: Path) -> int:
    """Bytes under `path`, hard links counted once per directory walk."""
    total, seen = 0, set()
    for entry in path.rglob("*"):
        stat = entry.lstat()
        if entry.is_file() and (stat.st_dev, stat.st_ino) not in seen:
            seen.add((stat.st_dev, stat.st_ino))
            total += stat.st_blocks * 512
    return total


def cache_cap_bytes() -> int:
    """The builds' size cap: $TRACEKIT_KBUILD_CACHE_GB, else 20 GB."""
    raw = os.environ.get(CACHE_CAP_ENV, str(DEFAULT_CACHE_CAP_GB))
    try:
        return int(float(raw) * 1e9)
    except ValueError:
        raise TracekitError(f"${CACHE_CAP_ENV}={raw!r} is not a number of GB") from None


def enforce_cap(root: Path, keep: list[Path], progress: Progress) -> list[Path]:
    """Delete the least recently used builds under `root` until they fit the cap."""
    builds = sorted(root.glob("*/build-*"), key=lambda b: b.stat().st_mtime)
    sizes = {build: _size(build) for build in builds}
    total, removed = sum(sizes.values()), []
    for build in builds:
        if total <= cache_cap_bytes():
            break
        if build in keep:
            continue
        progress(f"kernel build cache over its cap: removing {build.parent.name}/{build.name}")
        shutil.rmtree(build)
        total -= sizes[build]
        removed.append(build)
    return removed
