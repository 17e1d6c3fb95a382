"""Kernel address fields -> `<field>_sym` Categorical columns, named from kallsyms or a vmlinux.

Address fields are every pointer field (`void *function` of hrtimer_start, `struct x *`)
and the `unsigned long` fields the kernel fills with code addresses (ADDRESS_FIELDS:
function and function_graph `ip`/`func`, kprobe `__probe_ip`, ...). Guest addresses
(kvm's `vcpu_pc`) are not host symbols and get no column. Names come from the trace's own
kallsyms copy (a raw capture's `kallsyms`, a trace.dat's kallsyms section) unless a
kallsyms copy or a vmlinux is given; a vmlinux is shifted for KASLR by the trace's own
copy when it has one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
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

# kallsyms_rows: address, name start and end in the packed names, the names, module per
# row (an index into the module names, 0: the kernel itself), the module names.
KallsymsRows = tuple[np.ndarray, np.ndarray, np.ndarray, bytes, np.ndarray, tuple[str, ...]]


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
    Names stay packed in one UTF-8 buffer (a distribution kernel lists 100k+ symbols:
    as Python strings they would cost tens of MB); only those looked up are decoded.
    """

    addresses: np.ndarray  # uint64 link addresses, sorted, one per symbol
    name_at: np.ndarray  # int64: symbol i's name is names[name_at[i]:name_end[i]]
    name_end: np.ndarray
    names: bytes  # the names, UTF-8, back to back
    module_of: np.ndarray  # int32 index into modules, per symbol
    modules: tuple[str, ...]  # module names ("" for the kernel itself)
    span_lo: np.ndarray  # uint64, sorted; span_hi[i] ends span i (excluded)
    span_hi: np.ndarray
    shift: int = 0
    # Names already decoded, by symbol: an address column is named block by block, and a
    # function_graph trace names the same tens of thousands of functions in every block.
    decoded: dict[int, str] = field(default_factory=dict, compare=False, repr=False)
    named: _Named = field(default_factory=lambda: _Named(), compare=False, repr=False)

    @classmethod
    def from_table(cls, table: SymbolTable) -> AddressIndex:
        """From a SymbolTable (a vmlinux's, or any other)."""
        spans = table.spans if table.spans is not None else [(0, table.end or 1 << 64)]
        if table.spans is not None and table.end is not None:
            spans = [(lo, min(hi, table.end)) for lo, hi in spans]
        lo, hi = zip(*spans, strict=True) if spans else ((), ())
        encoded = [s.name.encode() for s in table.symbols]
        ends = np.cumsum([len(e) for e in encoded], dtype=np.int64)
        modules = tuple(dict.fromkeys(["", *(s.module for s in table.symbols)]))
        number = {m: i for i, m in enumerate(modules)}
        return cls(
            np.array(table.addresses, dtype=np.uint64), ends - [len(e) for e in encoded], ends,
            b"".join(encoded), np.array([number[s.module] for s in table.symbols], np.int32),
            modules, _u64(lo), _u64(hi), table.shift,
        )  # fmt: skip

    @classmethod
    def from_kallsyms(cls, text: str) -> AddressIndex | None:
        """From kallsyms text, parsed with numpy in a few passes over its bytes."""
        rows = kallsyms_rows(text)
        if rows is None:
            return None
        addr, name_at, name_end, names, module_of, modules = rows
        lo = np.full(len(modules), np.iinfo(np.uint64).max, np.uint64)
        hi = np.zeros(len(modules), np.uint64)
        np.minimum.at(lo, module_of, addr)
        np.maximum.at(hi, module_of, addr)
        present = np.flatnonzero(hi >= lo)  # the kernel itself may list nothing
        by_lo = present[np.argsort(lo[present], kind="stable")]
        order = np.argsort(addr, kind="stable")  # aliases: the first listed comes first
        keep = order[np.r_[True, addr[order][1:] != addr[order][:-1]]]
        return cls(
            addr[keep], name_at[keep], name_end[keep], names, module_of[keep], modules,
            lo[by_lo], hi[by_lo] + np.uint64(1),
        )  # fmt: skip

    def name(self, i: int) -> str:
        """Symbol i as %ps prints it: `name`, or `name [module]`."""
        text = self.names[self.name_at[i] : self.name_end[i]].decode("utf-8", "replace")
        module = self.modules[self.module_of[i]]
        return f"{text} [{module}]" if module else text

    def covering(self, link: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each run-time address, the symbol covering it, and whether one does."""
        link = link - np.uint64(self.shift & 0xFFFFFFFFFFFFFFFF)
        at = np.searchsorted(self.addresses, link, side="right") - 1
        span = np.searchsorted(self.span_lo, link, side="right") - 1
        inside = (span >= 0) & (link < self.span_hi[np.maximum(span, 0)]) & (at >= 0)
        return at, inside

    def codes(self, link: np.ndarray) -> tuple[pl.Series, np.ndarray]:
        """The Categorical of every name looked up so far (its first value null), and each
        address's position in it (0: no symbol covers it).

        Each symbol is named once per index, not once per block and table: on function_graph
        traces (tens of thousands of functions in every block) naming was half the CPU.
        """
        at, inside = self.covering(link)
        sym = at[inside]
        named = self.named
        with named.lock:  # two event types' pieces may be named at once (bytype's threads)
            if named.code is None:
                named.code = np.full(len(self.addresses), -1, np.int32)
            new = np.unique(sym[named.code[sym] < 0])
            if len(new):
                fresh = pl.Series([self.name(i) for i in new.tolist()], dtype=pl.Categorical)
                named.code[new] = np.arange(len(named.series), len(named.series) + len(new))
                # a new Series, not an append: another thread may be gathering from the old
                named.series = pl.concat([named.series, fresh], rechunk=False)
            out = np.zeros(len(link), np.int32)
            out[inside] = named.code[sym]
            return named.series, out

    def names_of(self, link: np.ndarray) -> list[str | None]:
        """`name [module]` for each (distinct) run-time address, as the kernel's %ps prints
        it: the symbol covering the address, no offset; None where nothing covers it."""
        at, inside = self.covering(link)
        known, name = self.decoded, self.name
        return [
            (known.get(i) or known.setdefault(i, name(i))) if ok else None
            for ok, i in zip(inside.tolist(), at.tolist(), strict=True)
        ]


class _Named:
    """The symbols an index has named so far: a Categorical of their names (position 0:
    null) and, per symbol, its position there (-1: not named yet)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.code: np.ndarray | None = None  # int32 per symbol, made at the first lookup
        self.series = pl.Series([None], dtype=pl.Categorical)


def _u64(values: tuple[int, ...]) -> np.ndarray:
    """A uint64 array (values up to 2**64 - 1; 2**64 itself is clipped)."""
    return np.array([min(v, (1 << 64) - 1) for v in values], dtype=np.uint64)


# Byte -> hex digit value (255: not a hex digit), and which bytes are whitespace.
_HEX = np.full(256, 255, np.uint8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)
_SPACE = np.zeros(256, bool)
_SPACE[np.frombuffer(b" \t\n\v\f\r", np.uint8)] = True
_ADDRESS_DIGITS = 16  # a 64-bit address in hex


def kallsyms_rows(text: str) -> KallsymsRows | None:
    """The `ADDRESS TYPE NAME [MODULE]` lines with a non-zero address and a name not
    starting with `$`, as arrays (None: there are none, e.g. addresses hidden as zero).

    Works on the text's bytes with numpy: no Python object per line.
    """
    if not text:
        return None
    raw = np.frombuffer(text.encode("utf-8", "replace"), np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    if not len(raw) or raw[-1] != ord("\n"):
        ends = np.r_[ends, len(raw)]
    starts = np.r_[0, ends[:-1] + 1]
    gaps = np.r_[np.flatnonzero(_SPACE[raw]), [len(raw)] * 3]  # whitespace bytes, sentinels
    first = np.searchsorted(gaps, starts)
    after_addr, after_type, after_name = gaps[first], gaps[first + 1], gaps[first + 2]
    after_name = np.minimum(after_name, ends)
    ok = (
        (_byte(raw, after_addr) == ord(" ")) & (after_type < ends)
        & (_byte(raw, after_type) == ord(" ")) & (after_type > after_addr + 1)
        & (after_name > after_type + 1)
        & (_byte(raw, after_type + 1) != ord("$")) & (after_addr > starts)
        & (after_addr - starts <= _ADDRESS_DIGITS)
    )  # fmt: skip
    address, hex_ok = _hex_before(raw, after_addr, after_addr - starts)
    ok &= hex_ok & (address > 0)
    if not ok.any():
        return None
    keep = np.flatnonzero(ok)
    name_at, name_end = after_type[keep] + 1, after_name[keep]
    module_of, modules = _modules(raw, gaps, after_name[keep], ends[keep])
    names, name_at, name_end = _packed(raw, name_at, name_end)
    return address[keep], name_at, name_end, names, module_of, modules


def _byte(raw: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The bytes at `at`; past the end, the last byte (never the space or name a check
    there needs: a line running to the end has no whitespace after it)."""
    return raw[np.minimum(at, len(raw) - 1)]


def _hex_before(
    raw: np.ndarray, stop: np.ndarray, width: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The hex number of `width` digits ending before each `stop`, and whether all were hex."""
    value = np.zeros(len(stop), np.uint64)
    ok = np.ones(len(stop), bool)
    for k in range(_ADDRESS_DIGITS, 0, -1):  # most significant digit first
        used = width >= k
        digit = _HEX[raw[np.where(used, stop - k, 0)]]
        ok &= ~used | (digit != 255)
        value = (value << np.uint64(4)) | np.where(used, digit, 0).astype(np.uint64)
    return value, ok


def _modules(
    raw: np.ndarray, gaps: np.ndarray, after_name: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Each line's module (`\\s+[name]` after the symbol name) as an index into the names."""
    opens = np.r_[np.flatnonzero(raw == ord("[")), len(raw)]
    closes = np.r_[np.flatnonzero(raw == ord("]")), len(raw)]
    bra = opens[np.searchsorted(opens, after_name)]
    ket = closes[np.searchsorted(closes, bra)]
    blank = np.searchsorted(gaps, bra) - np.searchsorted(gaps, after_name) == bra - after_name
    has = (after_name < ends) & (bra < ends) & blank & (ket < ends) & (ket > bra + 1)
    module_of = np.zeros(len(after_name), np.int32)
    if not has.any():
        return module_of, ("",)
    at, width = bra[has] + 1, ket[has] - bra[has] - 1
    cols = np.arange(width.max())
    grid = raw[np.minimum(at[:, None] + cols, len(raw) - 1)] * (cols < width[:, None])
    fixed = np.ascontiguousarray(grid).view(f"S{grid.shape[1]}").ravel()
    unique, inverse = np.unique(fixed, return_inverse=True)
    module_of[has] = inverse.ravel() + 1
    return module_of, ("", *(u.decode("utf-8", "replace") for u in unique.tolist()))


def _packed(
    raw: np.ndarray, at: np.ndarray, end: np.ndarray
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The byte ranges [at, end) (in order, not overlapping) copied back to back, and where
    each now lies: the rest of the text is not kept."""
    inside = np.zeros(len(raw) + 1, np.int8)
    inside[at] = 1
    inside[end] -= 1
    packed = raw[np.cumsum(inside[:-1], dtype=np.int8).view(bool)].tobytes()
    new_end = np.cumsum(end - at)
    return packed, new_end - (end - at), new_end


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

    Each distinct address is looked up once, then gathered back to every row. Categorical:
    a few thousand names repeat over millions of rows, and a String column would hold
    16 bytes of view per row (50 MB of 2 M function_graph calls) against 4 of code.
    """
    if table is None or values.len() == 0:
        return pl.Series(name, [None] * values.len(), dtype=pl.Categorical)
    # Distinct values and each row's code by hashing (polars): numpy's sort-based unique
    # and search took 55 ms per 256 k rows against 21, and several row-sized temporaries.
    values = values.cast(pl.UInt64)
    uniq = values.unique()
    addr = uniq.to_numpy()
    names, code = table.codes(addr)
    code[addr == 0] = 0  # a NULL pointer names nothing
    rows = values.replace_strict(uniq, pl.Series(code), return_dtype=pl.UInt32)
    return names.gather(rows).alias(name)


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
