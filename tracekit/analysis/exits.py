"""Names for KVM exit reasons, so an "in guest" slice says why the guest left.

arm64: kvm_exit records the exception class (ESR_ELx.EC, from the Arm ARM) when the exit
was a trap, and the kind of exit (ARM_EXCEPTION_* in the kernel) as `ret`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_EXCEPTION_CLASSES = {
    0x00: "UNKNOWN",
    0x01: "WFx",
    0x03: "CP15_32",
    0x04: "CP15_64",
    0x05: "CP14_MR",
    0x06: "CP14_LS",
    0x07: "FP_ASIMD",
    0x0C: "CP14_64",
    0x0E: "ILL",
    0x11: "SVC32",
    0x12: "HVC32",
    0x13: "SMC32",
    0x15: "SVC64",
    0x16: "HVC64",
    0x17: "SMC64",
    0x18: "SYS64",
    0x19: "SVE",
    0x1F: "IMP_DEF",
    0x20: "IABT_LOW",
    0x21: "IABT_CUR",
    0x22: "PC_ALIGN",
    0x24: "DABT_LOW",
    0x25: "DABT_CUR",
    0x26: "SP_ALIGN",
    0x28: "FP_EXC32",
    0x2C: "FP_EXC64",
    0x2F: "SERROR",
    0x30: "BREAKPT_LOW",
    0x32: "SOFTSTP_LOW",
    0x34: "WATCHPT_LOW",
    0x38: "BKPT32",
    0x3C: "BRK64",
}

# kvm_exit's `ret` on arm64: the kind of exception that ended the guest's run.
_EXIT_KINDS = {0: "IRQ", 1: "EL1_SERROR", 2: "TRAP", 3: "IL", 4: "HYP_REQ"}
_TRAP = 2


def exit_reason(fields: Mapping[str, Any]) -> str:
    """A short reason for one kvm_exit: `TRAP HVC64`, `IRQ`, or x86's exit_reason."""
    if "esr_ec" in fields and "ret" in fields:
        kind = _EXIT_KINDS.get(fields["ret"], f"ret={fields['ret']}")
        if fields["ret"] == _TRAP and fields["esr_ec"] is not None:
            ec = fields["esr_ec"]
            return f"{kind} {_EXCEPTION_CLASSES.get(ec, f'EC=0x{ec:02x}')}"
        return kind
    if fields.get("exit_reason") is not None:
        return f"exit_reason={fields['exit_reason']}"
    return "exit"
