"""A sorted symbol table: address -> `name+0xoff`, chosen among aliases as kallsyms does."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Linker-script symbols (`__start_X`, `__X_end`...) mark section edges; scripts/kallsyms.c
# ranks them after other names at the same address.
_LINKER_PREFIXES = ("__start_", "__stop_", "__end_")
_LINKER_SUFFIXES = ("_start", "_end")


@dataclass(frozen=True)
class Symbol:
    """One named address: `weak` and `module` follow the kallsyms columns."""

    address: int
    name: str
    weak: bool = False
    module: str = ""


@dataclass(frozen=True)
class Resolved:
    """An address resolved to the symbol that covers it."""

    address: int
    symbol: Symbol
    offset: int

    def __str__(self) -> str:
        """`name+0xoff [module]`, the way the kernel prints %pS."""
        text = self.symbol.name if not self.offset else f"{self.symbol.name}+{self.offset:#x}"
        return f"{text} [{self.symbol.module}]" if self.symbol.module else text


def alias_rank(symbol: Symbol) -> tuple[bool, bool, int, str]:
    """Sort key among symbols at one address, lowest first, as scripts/kallsyms.c orders them.

    The kernel resolves an address to the first alias in that order: strong before weak,
    code names before linker-script edges, fewer leading underscores first, then the
    order of `nm -n` (by name).
    """
    name = symbol.name
    linker_edge = name.startswith("__") and (
        name.startswith(_LINKER_PREFIXES) or name[2:].endswith(_LINKER_SUFFIXES)
    )
    return (symbol.weak, linker_edge, len(name) - len(name.lstrip("_")), name)


class SymbolTable:
    """Symbols sorted by address; an address resolves to the closest one at or below it.

    With `ranked`, aliases are ordered as scripts/kallsyms.c would (for ELF symbols);
    without, the first one given wins (a kallsyms copy is already in the kernel's order).
    `spans` (link-address ranges, end excluded), when given, are where the symbols are
    known to cover: an address outside every span (the linear map, vmalloc, a module's
    data past its last symbol) resolves to nothing rather than to the nearest name below.
    """

    def __init__(
        self,
        symbols: Iterable[Symbol],
        shift: int = 0,
        end: int | None = None,
        ranked: bool = True,
        spans: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        best: dict[int, Symbol] = {}
        self.by_name: dict[str, int] = {}  # every alias, even those lookups never return
        for symbol in symbols:
            self.by_name.setdefault(symbol.name, symbol.address)
            known = best.get(symbol.address)
            if known is None or (ranked and alias_rank(symbol) < alias_rank(known)):
                best[symbol.address] = symbol
        self.addresses = sorted(best)
        self.symbols = [best[address] for address in self.addresses]
        self.shift = shift
        # Link address past the image (a vmlinux's _end): beyond it lie modules and
        # vmalloc, which the nearest symbol below would name wrongly.
        self.end = end
        self.spans = sorted(spans) if spans is not None else None

    def __len__(self) -> int:
        """How many distinct addresses carry a symbol."""
        return len(self.symbols)

    def shifted(self, shift: int) -> SymbolTable:
        """The same symbols seen at run time under a KASLR displacement of `shift` bytes."""
        table = SymbolTable([])
        table.addresses, table.symbols, table.by_name = self.addresses, self.symbols, self.by_name
        table.shift, table.end, table.spans = shift, self.end, self.spans
        return table

    def covers(self, link_address: int) -> bool:
        """Whether a link address lies where these symbols name things (see `spans`)."""
        if self.end is not None and link_address >= self.end:
            return False
        if self.spans is None:
            return True
        index = bisect.bisect_right(self.spans, (link_address, 1 << 64)) - 1
        return index >= 0 and link_address < self.spans[index][1]

    def lookup(self, address: int) -> Resolved | None:
        """The symbol covering a run-time address, or None below the first symbol."""
        link_address = address - self.shift
        index = bisect.bisect_right(self.addresses, link_address) - 1
        if index < 0 or not self.covers(link_address):
            return None
        symbol = self.symbols[index]
        return Resolved(address, symbol, link_address - symbol.address)

    def address_of(self, name: str) -> int | None:
        """The run-time address of the first symbol called `name`."""
        address = self.by_name.get(name)
        return None if address is None else address + self.shift
