"""The `--probe-args` file: kprobe fetch arguments computed from DWARF for kernels without BTF.

Format (text, UTF-8), written by `tracekit symbols probe-args` and read by
`tracekit collect --probe-args FILE` on a board that need not hold the vmlinux:

    # tracekit probe-args 1
    # build-id 338d20205ee321570ed1bbd998bf2e1a2b8aa92c
    kvm_arm_vmid_update vmid=+0(%x0):u64

The first line is the format header. Other `#` lines are comments (the build-id of the
vmlinux the offsets came from, and probes skipped because the kernel lacks them). Every
other line is `FUNCTION FETCHARG...`: a kernel function and the kprobe_events fetch
arguments to add to its probe, each `NAME=+OFFSET(%xN):TYPE` (a field at OFFSET bytes
from the pointer in argument register xN).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.symbols.offsets import offsetof
from tracekit.symbols.vmlinux import Vmlinux

HEADER = "# tracekit probe-args 1"
_FETCHARG = re.compile(r"^[A-Za-z_]\w*=\+\d+\(%x[0-7]\):[us](8|16|32|64)$")
_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*$")
_TYPES = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}


@dataclass(frozen=True)
class ProbeField:
    """One fetch argument to derive: argument NAME reads FIELD through pointer argument ARG."""

    function: str
    name: str
    register: int  # the AAPCS64 argument register x0..x7 holding the struct pointer
    field: str  # STRUCT.FIELD[.FIELD]


# Where the VMID is readable at function entry in the host (arch/arm64/kvm/{vmid,mmu,arm}.c).
VMID_PROBES = (
    ProbeField("kvm_arm_vmid_update", "vmid", 0, "kvm_vmid.id"),
    ProbeField("kvm_free_stage2_pgd", "vmid", 0, "kvm_s2_mmu.vmid.id"),
    ProbeField("kvm_uninit_stage2_mmu", "vmid", 0, "kvm_s2_mmu.vmid.id"),
    ProbeField("kvm_arch_destroy_vm", "vmid", 0, "kvm.arch.mmu.vmid.id"),
)


def fetch_arg(vmlinux: Vmlinux, probe: ProbeField) -> str:
    """The kprobe fetch argument for one probe field, sized from DWARF."""
    found = offsetof(vmlinux, probe.field)
    kind = _TYPES.get(found.size or 0, "u64")
    return f"{probe.name}=+{found.offset}(%x{probe.register}):{kind}"


def compute(
    vmlinux: Vmlinux, probes: tuple[ProbeField, ...] = VMID_PROBES
) -> tuple[dict[str, list[str]], list[str]]:
    """Fetch arguments per function, and the functions skipped as absent from this kernel."""
    args: dict[str, list[str]] = {}
    skipped: list[str] = []
    symbols = vmlinux.symbols()
    for probe in probes:
        if symbols.address_of(probe.function) is None:
            skipped.append(probe.function)
            continue
        args.setdefault(probe.function, []).append(fetch_arg(vmlinux, probe))
    return args, skipped


def render(args: dict[str, list[str]], build_id: str, skipped: list[str]) -> str:
    """The file text for computed arguments."""
    lines = [HEADER, f"# build-id {build_id}"]
    lines += [f"# skipped {name}: not in this kernel" for name in skipped]
    lines += [" ".join([function, *fetch]) for function, fetch in args.items()]
    return "\n".join(lines) + "\n"


def parse(text: str, source: str = "probe-args") -> dict[str, list[str]]:
    """Read probe-args text; every malformed line is an error naming its line number."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != HEADER:
        raise TracekitError(
            f"{source}: first line is not {HEADER!r}; write the file with "
            "`tracekit symbols probe-args VMLINUX -o FILE`"
        )
    args: dict[str, list[str]] = {}
    for number, line in enumerate(lines[1:], start=2):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        function, fetch = words[0], words[1:]
        bad = [arg for arg in fetch if not _FETCHARG.match(arg)]
        if not _FUNCTION.match(function) or not fetch or bad:
            raise TracekitError(
                f"{source}:{number}: expected 'FUNCTION NAME=+OFF(%xN):TYPE...', got {line!r}"
            )
        args.setdefault(function, []).extend(fetch)
    return args


def read_probe_args(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Read a probe-args file: function -> fetch arguments."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TracekitError(f"cannot read probe-args file {source}: {exc}") from None
    return parse(text, str(source))
