"""The QEMU command line of the emulated arm64 host (pure: no process is started here)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError

QEMU = "qemu-system-aarch64"

# QEMU 7.2 models with EL2. `max` has VHE; the cortex models do not, and they trap the
# guest's writes to VM registers as the real cores do.
CPU_MODELS = ("cortex-a76", "cortex-a72", "cortex-a53", "max")

# QEMU's cortex-a53 and cortex-a72 have no 16 KB translation granule (ID_AA64MMFR0_EL1
# TGran16 is 0, as on the real cores): a 16 KB-page kernel prints nothing and hangs there.
NO_16K_GRANULE = ("cortex-a53", "cortex-a72")

# The kernel console stays quiet so the command's output is readable; the full log is
# read from dmesg inside and saved next to the console log.
BASE_KERNEL_ARGS = ("console=ttyAMA0", "panic=-1", "quiet", "loglevel=3")


@dataclass(frozen=True)
class Share:
    """One host directory exported to the emulated host over virtio-9p."""

    tag: str
    path: Path
    readonly: bool = False


# QEMU 7.2 virt with GICv3: MPIDR Aff0 = vCPU index % 16, Aff1 = index / 16.
QEMU_AFF0_CPUS = 16
# What the kernel logs of each CPU it starts, by MPIDR: the boot CPU, and each secondary
# every time it comes up (arch/arm64/kernel/smp.c secondary_start_kernel, 6.1.176 :253,
# 6.12.117 :260, 7.2.13 :252: once per bring-up, after its CPU_ON entry, before it is
# marked online); a CPU that entered but did not come up is "failed to come online"
# (printed by the CPU that started it: 6.1 :141, 6.12 :148, 7.2 :140).
BOOTING_LINUX = re.compile(r"Booting Linux on physical CPU (0x[0-9a-f]+)")
BOOTED_SECONDARY = re.compile(r"CPU(\d+): Booted secondary processor (0x[0-9a-f]+)")
FAILED_TO_COME_ONLINE = re.compile(r"CPU(\d+): failed to come online")


def qemu_mpidr(vcpu: int) -> int:
    """The MPIDR affinity QEMU 7.2's virt machine (GICv3) gives vCPU index `vcpu`."""
    return (vcpu // QEMU_AFF0_CPUS) << 8 | vcpu % QEMU_AFF0_CPUS


def qemu_vcpu(mpidr: int) -> int:
    """The vCPU index QEMU 7.2's virt machine gave MPIDR `mpidr` (qemu_mpidr's inverse)."""
    return (mpidr >> 8 & 0xFF) * QEMU_AFF0_CPUS + (mpidr & 0xFF)


# Where `-M virt` puts RAM (QEMU 7.2 hw/arm/virt.c, base_memmap[VIRT_MEM]: 1 GiB up).
VIRT_RAM_BASE = 0x4000_0000
# QEMU 7.2 hw/arm/boot.c, load_aarch64_image: an arm64 Image (magic "ARM\x64" at byte 56)
# goes to RAM base + its header's text_offset (byte 8), or + 2 MiB more when that offset
# is below the 4 KiB QEMU's own boot stub takes at the bottom of RAM (BOOTLOADER_MAX_SIZE);
# a header whose image_size (byte 16) is 0 (kernels before 3.17) goes to + 0x80000.
_IMAGE_MAGIC = b"ARM\x64"
_BOOTLOADER_MAX_SIZE = 4096
_OLD_KERNEL_LOAD = 0x80000


@dataclass(frozen=True)
class ImageLoad:
    """Where QEMU puts a kernel Image: its _text, and its _stext above the head."""

    text_pa: int
    stext_pa: int


# arch/arm64/kernel/vmlinux.lds.S (6.1 and 6.12): `.text : ALIGN(SEGMENT_ALIGN) { _stext = .`
# right after .head.text, which holds only the 64-byte header and, with CONFIG_EFI, the PE
# header that efi-header.S ends with `.balign SEGMENT_ALIGN`; its BaseOfCode
# (.Lefi_header_end - .L_head) is that size. Without a PE header, one SEGMENT_ALIGN
# (asm/memory.h: SZ_64K for every page size). Both of Debian's arm64 Images: BaseOfCode =
# SizeOfHeaders = SectionAlignment = 0x10000; tracekit's CI kernels (no CONFIG_EFI): byte
# 60 is 0 and System.map has _stext - _text = 0x10000. Checked in 6.1, 6.12 and 7.2; the
# 64 KiB padding dates from v5.10 (a2d50c1c77aa), older kernels are not covered.
_SEGMENT_ALIGN = 0x10000
_PE_MAGIC = b"PE\0\0"


def image_load(header: bytes, ram_base: int = VIRT_RAM_BASE) -> ImageLoad:
    """Where QEMU loads this arm64 Image, from its first 4 KiB (the Image and PE headers)."""
    text_pa = kernel_text_pa(header[:64], ram_base)
    return ImageLoad(text_pa, text_pa + _head_size(header))


def _head_size(header: bytes) -> int:
    """How far _stext is above _text: the PE header's BaseOfCode (checked against its
    SizeOfHeaders and SectionAlignment, the same in efi-header.S), or one SEGMENT_ALIGN
    where the kernel wrote no PE header (byte 60 is 0 without CONFIG_EFI); any other header
    is one clear error, never a guess."""
    pe = int.from_bytes(header[60:64], "little")
    if not pe:
        return _SEGMENT_ALIGN
    optional = pe + 4 + 20  # PE signature, then the COFF file header
    if header[pe : pe + 4] != _PE_MAGIC or len(header) < optional + 64:
        raise TracekitError(
            f"the kernel Image names a PE header at {pe:#x} that is not there or is cut short"
        )
    if header[optional : optional + 2] != b"\x0b\x02":
        raise TracekitError("the kernel Image's PE header is not PE32+")
    base_of_code = int.from_bytes(header[optional + 20 : optional + 24], "little")
    alignment = int.from_bytes(header[optional + 32 : optional + 36], "little")
    headers = int.from_bytes(header[optional + 60 : optional + 64], "little")
    if not base_of_code or base_of_code != headers or base_of_code % max(alignment, 1):
        raise TracekitError(
            f"the kernel Image's PE header gives BaseOfCode {base_of_code:#x}, SizeOfHeaders "
            f"{headers:#x}, SectionAlignment {alignment:#x}: not the head arm64 kernels write"
        )
    return base_of_code


def kernel_text_pa(header: bytes, ram_base: int = VIRT_RAM_BASE) -> int:
    """The physical address QEMU loads an arm64 Image at (its _text), from the Image's
    first 64 bytes; one clear error if they are not an Image header."""
    if len(header) < 64 or header[56:60] != _IMAGE_MAGIC:
        raise TracekitError("the kernel is not an arm64 Image (no 'ARM\\x64' at byte 56)")
    text_offset = int.from_bytes(header[8:16], "little")
    image_size = int.from_bytes(header[16:24], "little")
    if image_size == 0:
        return ram_base + _OLD_KERNEL_LOAD
    if text_offset < _BOOTLOADER_MAX_SIZE:
        text_offset += 2 * 2**20
    return ram_base + text_offset


def cpu_option(model: str) -> str:
    """The -cpu value; `max` with the implementation-defined PAuth is much faster in TCG."""
    if model not in CPU_MODELS:
        raise TracekitError(f"unknown CPU model {model!r}; use one of: {', '.join(CPU_MODELS)}")
    return "max,pauth-impdef=on" if model == "max" else model


def check_page_size(model: str, page_kb: int, kernel: str) -> None:
    """Refuse a kernel whose page size the CPU model cannot translate (it would hang)."""
    if page_kb == 16 and model in NO_16K_GRANULE:
        raise TracekitError(
            f"kernel {kernel} uses 16 KB pages, which the {model} model cannot translate "
            "(it would hang silently); use --cpu-model cortex-a76 or max"
        )


def smp_option(cpus: int, clusters: int) -> str:
    """The -smp value, with the CPUs split evenly into `clusters` clusters."""
    if cpus < 1 or clusters < 1:
        raise TracekitError("--smp and --clusters must be at least 1")
    if cpus % clusters:
        raise TracekitError(
            f"--smp {cpus} cannot be split into {clusters} equal clusters; pick --smp as a "
            "multiple of --clusters"
        )
    if clusters == 1:
        return str(cpus)
    return f"{cpus},sockets=1,clusters={clusters},cores={cpus // clusters},threads=1"


def virtfs_option(share: Share) -> list[str]:
    """The -virtfs arguments for one share (security_model=none: files stay the user's)."""
    value = f"local,path={share.path},mount_tag={share.tag},security_model=none"
    if share.readonly:
        value += ",readonly=on"
    return ["-virtfs", value]


def qemu_argv(
    kernel: Path,
    initramfs: Path,
    *,
    cpu_model: str,
    cpus: int,
    clusters: int,
    memory_mb: int,
    kernel_args: list[str],
    shares: list[Share],
) -> list[str]:
    """The full qemu-system-aarch64 command: virt with EL2, GICv3, TCG, serial on stdio."""
    argv = [
        QEMU,
        "-M",
        "virt,virtualization=on,gic-version=3",
        "-cpu",
        cpu_option(cpu_model),
        "-accel",
        "tcg,thread=multi",
        "-smp",
        smp_option(cpus, clusters),
        "-m",
        str(memory_mb),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
        "-kernel",
        str(kernel),
        "-initrd",
        str(initramfs),
        "-append",
        " ".join([*BASE_KERNEL_ARGS, *kernel_args]),
    ]
    for share in shares:
        argv += virtfs_option(share)
    return argv
