"""Host hypercall (SMCCC) function IDs -> names, from DWARF or a bundled per-series table.

In nVHE the host calls its hypervisor with `hvc #0`, x0 = 0xC6000000 | n (SMCCC fast
call, 64-bit, vendor-specific hypervisor service), where n is an enumerator of
`enum __kvm_host_smccc_func` in arch/arm64/include/asm/kvm_asm.h. The numbering changes
between kernel versions, so the running kernel's own debug info is preferred.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.errors import TracekitError
from tracekit.symbols import cache, dwarf
from tracekit.symbols.hypcall_tables import BUNDLED
from tracekit.symbols.vmlinux import Vmlinux

ENUM_NAME = "__kvm_host_smccc_func"
ENUMERATOR_PREFIX = "__KVM_HOST_SMCCC_FUNC_"
# Calls are named after their functions (`__kvm_vcpu_run`); the enum's range markers
# (`__KVM_HOST_SMCCC_FUNC_MAX`, `_MIN_PKVM`, 7.x) are not and share a call's value.
CALL_PREFIX = "__"
# __kvm_hyp_init is a #define (0), not an enumerator: DWARF never shows it.
HYP_INIT = "__kvm_hyp_init"
# ARM_SMCCC_CALL_VAL(FAST_CALL, SMC_64, OWNER_VENDOR_HYP, 0) in include/linux/arm-smccc.h.
SMCCC_HOST_BASE = 0xC6000000
_ENUM_TAGS = frozenset({"DW_TAG_enumeration_type"})


@dataclass(frozen=True)
class HypcallTable:
    """Host hypercall numbers -> names, and where the table came from."""

    names: dict[int, str]
    source: str

    def name_of(self, function_id: int) -> str | None:
        """The name of a full SMCCC function ID (0xC60000nn) or of a bare number n."""
        number = function_id - SMCCC_HOST_BASE if function_id >= SMCCC_HOST_BASE else function_id
        return self.names.get(number)


def from_enumerators(values: dict[str, int]) -> dict[int, str]:
    """Number -> call name from the DWARF enumerators, adding the #define'd __kvm_hyp_init."""
    names = {0: HYP_INIT}
    for enumerator, value in values.items():
        call = enumerator.removeprefix(ENUMERATOR_PREFIX)
        if enumerator.startswith(ENUMERATOR_PREFIX) and call.startswith(CALL_PREFIX):
            names[value] = call
    return names


def from_vmlinux(vmlinux: Vmlinux) -> HypcallTable:
    """The table from the vmlinux's own DWARF (cached by build-id)."""
    cached = cache.load(vmlinux.build_id, "hypcalls")
    if cached is None:
        enum = dwarf.locate_type(vmlinux, _ENUM_TAGS, ENUM_NAME, dwarf.DEFAULT_ANCHORS)
        cached = {str(n): name for n, name in from_enumerators(dwarf.enumerators(enum)).items()}
        cache.store(vmlinux.build_id, "hypcalls", cached)
    names = {int(number): name for number, name in cached.items()}
    return HypcallTable(names, f"DWARF of {vmlinux.path.name} (build-id {vmlinux.build_id})")


def series_of(release: str) -> str:
    """The kernel series `MAJOR.MINOR` of a release string such as 6.1.0-50-arm64."""
    return ".".join(release.split(".")[:2])


def bundled(release: str) -> HypcallTable:
    """The bundled table for a kernel release's series, or a clear error naming the known ones."""
    series = series_of(release)
    if series not in BUNDLED:
        raise TracekitError(
            f"no bundled hypercall table for kernel {release} (series {series}; known: "
            f"{', '.join(sorted(BUNDLED))}); give the kernel's debug vmlinux instead"
        )
    names = dict(enumerate(BUNDLED[series]))
    return HypcallTable(names, f"bundled table for Linux {series} (kvm_asm.h)")
