"""KVM events of a text trace given the columns a binary trace has.

tracefs text prints these events through their TP_printk formats (no key=value pairs),
so the text reader leaves their payload in `fields`. The VM analyses need a few of their
fields; this recovers them from the printed text, with the same names and types as the
binary readers (docs/tables.md), and leaves frames that have them untouched.
"""

from __future__ import annotations

import polars as pl

# kvm_exit prints the exception kind by name (arch/arm64/include/asm/kvm_asm.h order).
_EXIT_KINDS = {"IRQ": 0, "SERROR": 1, "TRAP": 2, "ILLEGAL": 3, "HYP_REQ": 4}
_HEX = r"0x([0-9a-fA-F]+)"


def _hex(pattern: str, name: str, dtype: pl.DataType) -> pl.Expr:
    """A hex number captured from `fields` by PATTERN (with one _HEX group)."""
    return (
        pl.col("fields").str.extract(pattern, 1).str.to_integer(base=16, strict=False).cast(dtype)
    ).alias(name)


def _toggle(frame: pl.DataFrame) -> pl.DataFrame:
    """kvm_toggle_cache: 'VM op at 0x... (cache was off, now on)' -> vcpu_pc, was, now."""
    text = pl.col("fields")
    return frame.with_columns(
        _hex(rf"at {_HEX}", "vcpu_pc", pl.UInt64()),
        (text.str.extract(r"was (on|off)", 1) == "on").alias("was"),
        (text.str.extract(r"now (on|off)", 1) == "on").alias("now"),
    )


def _fault(frame: pl.DataFrame) -> pl.DataFrame:
    """kvm_guest_fault: 'ipa 0x..., hsr 0x..., hxfar 0x..., pc 0x...'."""
    return frame.with_columns(
        _hex(rf"ipa {_HEX}", "ipa", pl.UInt64()),
        _hex(rf"hsr {_HEX}", "hsr", pl.UInt64()),
        _hex(rf"pc {_HEX}", "vcpu_pc", pl.UInt64()),
    )


def _exit(frame: pl.DataFrame) -> pl.DataFrame:
    """kvm_exit: 'TRAP: HSR_EC: 0x0020 (IABT_LOW), PC: 0x...' -> ret, esr_ec, vcpu_pc."""
    kind = pl.col("fields").str.extract(r"^\s*(\w+):", 1)
    return frame.with_columns(
        kind.replace_strict(_EXIT_KINDS, default=None, return_dtype=pl.Int32).alias("ret"),
        _hex(rf"HSR_EC: {_HEX}", "esr_ec", pl.UInt32()),
        _hex(rf"PC: {_HEX}", "vcpu_pc", pl.UInt64()),
    )


def _hvc(frame: pl.DataFrame) -> pl.DataFrame:
    """kvm_hvc_arm64: 'HVC at 0x... (r0: 0x..., imm: 0x...)' -> vcpu_pc, r0, imm."""
    return frame.with_columns(
        _hex(rf"at {_HEX}", "vcpu_pc", pl.UInt64()),
        _hex(rf"r0: {_HEX}", "r0", pl.UInt64()),
        _hex(rf"imm: {_HEX}", "imm", pl.UInt64()),
    )


_PARSERS = {
    "kvm_toggle_cache": ("was", _toggle),
    "kvm_guest_fault": ("ipa", _fault),
    "kvm_exit": ("esr_ec", _exit),
    "kvm_hvc_arm64": ("r0", _hvc),
}


def kvm_fields(event: str, frame: pl.DataFrame) -> pl.DataFrame:
    """The event's table with its binary-reader columns, recovered from text if needed."""
    parser = _PARSERS.get(event)
    if parser is None or parser[0] in frame.columns or "fields" not in frame.columns:
        return frame
    return parser[1](frame)
