"""Turn run-time addresses into names from a vmlinux or a kallsyms copy, minding KASLR."""

from __future__ import annotations

import os
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.symbols.kallsyms import is_kallsyms, kaslr_shift, read_kallsyms
from tracekit.symbols.table import Resolved, SymbolTable
from tracekit.symbols.vmlinux import open_vmlinux


def parse_address(text: str) -> int:
    """A hex address as traces print it, with or without 0x."""
    try:
        return int(text.removeprefix("0x").removeprefix("0X"), 16)
    except ValueError:
        raise TracekitError(f"bad address {text!r}: give hex such as ffff800008a1b2c0") from None


def load_table(
    path: str | os.PathLike[str],
    kallsyms: str | os.PathLike[str] | None = None,
    kaslr_offset: int | None = None,
) -> SymbolTable:
    """A table for run-time addresses: a kallsyms copy as is, or a vmlinux shifted for KASLR.

    A vmlinux holds link addresses; the shift comes from `kaslr_offset` or from a kallsyms
    copy of the same boot. Without either, addresses are taken as link addresses.
    """
    source = Path(path)
    if not source.is_file():
        raise TracekitError(f"{source} does not exist; give a vmlinux or a /proc/kallsyms copy")
    if is_kallsyms(source):
        return read_kallsyms(source)
    with open_vmlinux(source) as vmlinux:
        linked = vmlinux.symbols()
    if kaslr_offset is not None:
        return linked.shifted(kaslr_offset)
    if kallsyms is not None:
        return linked.shifted(kaslr_shift(read_kallsyms(kallsyms), linked))
    return linked


def resolve_all(table: SymbolTable, addresses: list[int]) -> list[Resolved | None]:
    """Resolve each address; None where no symbol lies at or below it."""
    return [table.lookup(address) for address in addresses]
