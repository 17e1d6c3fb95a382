"""Which KVM mode the emulated host's kernel actually initialised, from its log.

The mode asked for on the command line is only a wish: a CPU model without VHE stays in
nVHE, a kernel without KVM has none, so reports use what the kernel says it did.
"""

from __future__ import annotations

import re

KVM_MODES = ("nvhe", "vhe", "protected")
# What a boot can report besides those: hVHE, the nVHE hypervisor with E2H set (6.12 on a
# VHE-capable CPU with kvm-arm.mode=nvhe and arm64_sw.hvhe=1), asked for as nvhe.

# arch/arm64/kvm/arm.c prints exactly one of these once KVM is up (kvm_info lines).
_MODE_LINES = (
    # 6.12 runs pKVM with E2H set (hVHE) on a VHE-capable CPU, cortex-a76 included.
    (re.compile(r"kvm \[\d+\]: Protected [nh]VHE mode initialized successfully"), "protected"),
    (re.compile(r"kvm \[\d+\]: VHE mode initialized successfully"), "vhe"),
    (re.compile(r"kvm \[\d+\]: (?:Hyp|nVHE) mode initialized successfully"), "nvhe"),
    (re.compile(r"kvm \[\d+\]: Hyp nVHE mode initialized successfully"), "nvhe"),
    (re.compile(r"kvm \[\d+\]: Hyp hVHE mode initialized successfully"), "hvhe"),
)


def kvm_mode_from_log(kernel_log: str) -> str:
    """`nvhe`, `hvhe`, `vhe` or `protected` as the kernel reports it, else `none`."""
    for pattern, mode in _MODE_LINES:
        if pattern.search(kernel_log):
            return mode
    return "none"


def kernel_args_for(mode: str) -> list[str]:
    """The kernel arguments that ask for a KVM mode (VHE is the default where it exists)."""
    return [] if mode == "vhe" else [f"kvm-arm.mode={mode}"]
