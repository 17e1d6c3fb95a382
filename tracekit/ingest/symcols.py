"""Kernel address fields -> `<field>_sym` String columns, named from kallsyms or a vmlinux.

Address fields are every pointer field (`void *function` of hrtimer_start, `struct x *`)
and the `unsigned long` fields the kernel fills with code addresses (ADDRESS_FIELDS:
function and function_graph `ip`/`func`, kprobe `__probe_ip`, ...). Guest addresses
(kvm's `vcpu_pc`) are not host symbols and get no column. Names come from the trace's own
kallsyms copy (a raw capture's `kallsyms`, a trace.dat's kallsyms section) unless a
kallsyms copy or a vmlinux is given; a vmlinux is shifted for KASLR by the trace's own
copy when it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest.formats import FieldSpec, Kind
from tracekit.symbols.kallsyms import is_kallsyms, kaslr_shift, parse_kallsyms
from tracekit.symbols.table import SymbolTable

# `unsigned long` fields that hold kernel code addresses, by the name the kernel gives them.
ADDRESS_FIELDS = frozenset(
    {"ip", "parent_ip", "func", "call_site", "__probe_ip", "__probe_func", "__probe_ret_ip"}
)
SUFFIX = "_sym"


@dataclass(frozen=True)
class Symbols:
    """The index that names addresses (None: no source) and what it came from."""

    table: AddressIndex | None
    source: str | None  # meta["symbols"]: shown by the summary, null without a source


@dataclass(frozen=True)
class AddressIndex:
    """A symbol table as sorted numpy arrays, for looking up a whole column at once.

    Same rules as tracekit.symbols.table.SymbolTable.lookup: the closest symbol at or
    below (the first alias listed wins), within a covered span, under a KASLR shift.
    """

    addresses: np.ndarray  # uint64 link addresses, sorted, one per symbol
    names: list[str]  # symbol names, and their modules ("" for the kernel itself)
    modules: list[str]
    span_lo: np.ndarray  # uint64, sorted; span_hi[i] ends span i (excluded)
    span_hi: np.ndarray
    shift: int = 0

    @classmethod
    def from_table(cls, table: SymbolTable) -> AddressIndex:
        """From a SymbolTable (a vmlinux's, or any other)."""
        spans = table.spans if table.spans is not None else [(0, table.end or 1 << 64)]
        if table.spans is not None and table.end is not None:
            spans = [(lo, min(hi, table.end)) for lo, hi in spans]
        lo, hi = zip(*spans, strict=True) if spans else ((), ())
        return cls(
            np.array(table.addresses, dtype=np.uint64), [s.name for s in table.symbols],
            [s.module for s in table.symbols], _u64(lo), _u64(hi), table.shift,
        )  # fmt: skip

    @classmethod
    def from_kallsyms(cls, text: str) -> AddressIndex | None:
        """From kallsyms text, parsed in bulk (a distribution kernel lists 100k+ symbols)."""
        parts = pl.Series("line", text.splitlines(), dtype=pl.String).str.extract_groups(
            r"^(?<addr>[0-9a-fA-F]+) \S+ (?<name>[^\s$]\S*)(?:\s+\[(?<module>[^\]]+)\])?"
        )
        frame = (
            parts.struct.unnest()
            .drop_nulls("addr")
            .with_columns(
                address=pl.col("addr").str.to_integer(base=16, dtype=pl.UInt64, strict=False),
                module=pl.col("module").fill_null(""),
            )
        )
        frame = frame.filter(pl.col("address").fill_null(0) > 0, pl.col("name").is_not_null())
        if frame.is_empty():
            return None
        spans = frame.group_by("module").agg(lo=pl.col("address").min(), hi=pl.col("address").max())
        spans = spans.sort("lo")
        first = frame.unique("address", keep="first", maintain_order=True).sort("address")
        return cls(
            first["address"].to_numpy(), first["name"].to_list(), first["module"].to_list(),
            spans["lo"].to_numpy(), spans["hi"].to_numpy() + np.uint64(1),
        )  # fmt: skip

    def names_of(self, link: np.ndarray) -> list[str | None]:
        """`name [module]` for each (distinct) run-time address, as the kernel's %ps prints
        it: the symbol covering the address, no offset; None where nothing covers it."""
        link = link - np.uint64(self.shift & 0xFFFFFFFFFFFFFFFF)
        at = np.searchsorted(self.addresses, link, side="right") - 1
        span = np.searchsorted(self.span_lo, link, side="right") - 1
        inside = (span >= 0) & (link < self.span_hi[np.maximum(span, 0)]) & (at >= 0)
        out: list[str | None] = []
        for ok, i in zip(inside.tolist(), at.tolist(), strict=True):
            if not ok:
                out.append(None)
            elif self.modules[i]:
                out.append(f"{self.names[i]} [{self.modules[i]}]")
            else:
                out.append(self.names[i])
        return out


def _u64(values: tuple[int, ...]) -> np.ndarray:
    """A uint64 array (values up to 2**64 - 1; 2**64 itself is clipped)."""
    return np.array([min(v, (1 << 64) - 1) for v in values], dtype=np.uint64)


def is_address_field(spec: FieldSpec, long_size: int) -> bool:
    """Whether a field holds a kernel address worth a `_sym` column."""
    if spec.kind == Kind.POINTER:
        return True
    return (
        spec.kind == Kind.INT
        and not spec.signed
        and spec.size == long_size
        and spec.name in ADDRESS_FIELDS
    )


def load_symbols(own_kallsyms: str, given: Path | None, where: str) -> Symbols:
    """The trace's own kallsyms copy, or the given kallsyms/vmlinux (KASLR-shifted)."""
    if given is None:
        own = AddressIndex.from_kallsyms(own_kallsyms)  # None: absent, or addresses hidden
        return Symbols(own, f"kallsyms copy in {where}" if own else None)
    if not given.is_file():
        raise TracekitError(f"symbols: {given} does not exist; give a vmlinux or a kallsyms copy")
    if is_kallsyms(given):
        text = given.read_text(errors="replace")
        index = AddressIndex.from_kallsyms(text)
        if index is None:
            parse_kallsyms(text, str(given))  # raises the clear error about hidden addresses
        return Symbols(index, f"kallsyms copy {given}")
    from tracekit.symbols.vmlinux import open_vmlinux  # pyelftools: only when needed

    with open_vmlinux(given) as vmlinux:
        linked = vmlinux.symbols()
    if not own_kallsyms.strip():
        return Symbols(
            AddressIndex.from_table(linked),
            f"vmlinux {given} at link addresses (no kallsyms: KASLR unknown)",
        )
    shift = kaslr_shift(parse_kallsyms(own_kallsyms, f"{where} kallsyms"), linked)
    return Symbols(
        AddressIndex.from_table(linked.shifted(shift)), f"vmlinux {given}, KASLR shift {shift:#x}"
    )


def symbol_column(values: pl.Series, table: AddressIndex | None, name: str) -> pl.Series:
    """The symbol name (`name [module]`, the kernel's %ps form) per address; null where unknown.

    Each distinct address is looked up once, then gathered back to every row.
    """
    if table is None or values.len() == 0:
        return pl.Series(name, [None] * values.len(), dtype=pl.String)
    uniq, inverse = np.unique(values.to_numpy().astype(np.uint64), return_inverse=True)
    names = table.names_of(uniq)
    if len(uniq) and uniq[0] == 0:
        names[0] = None  # a NULL pointer names nothing
    return pl.Series(name, names, dtype=pl.String).gather(inverse.ravel())


def add_symbol_columns(
    cols: list[pl.Series], specs: tuple[FieldSpec, ...], symbols: Symbols, long_size: int
) -> list[pl.Series]:
    """The field columns, each address field followed by its `_sym` column."""
    out: list[pl.Series] = []
    for col, spec in zip(cols, specs, strict=True):
        out.append(col)
        if is_address_field(spec, long_size):
            out.append(symbol_column(col, symbols.table, col.name + SUFFIX))
    return out
