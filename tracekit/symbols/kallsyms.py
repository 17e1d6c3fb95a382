"""Read /proc/kallsyms copies (as `tracekit collect` stores them) and find the KASLR shift."""

from __future__ import annotations

import os
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.symbols.table import Symbol, SymbolTable

# Symbols present in every arm64 kernel, used to line kallsyms up with a vmlinux.
KASLR_ANCHORS = ("_text", "_stext", "start_kernel")


def parse_line(line: str) -> Symbol | None:
    """One `ADDRESS TYPE NAME [MODULE]` line; None for lines without a usable address."""
    parts = line.split()
    if len(parts) < 3:
        return None
    try:
        address = int(parts[0], 16)
    except ValueError:
        return None
    if not address or parts[2].startswith("$"):
        return None  # $x/$d mark code/data runs in modules; the kernel never names by them
    module = parts[3].strip("[]") if len(parts) > 3 else ""
    return Symbol(address, parts[2], weak=parts[1] in "wWvV", module=module)


def is_kallsyms(path: Path) -> bool:
    """Whether a file looks like /proc/kallsyms text rather than an ELF."""
    with path.open("rb") as stream:
        head = stream.read(64)
    return not head.startswith(b"\x7fELF") and b" " in head


def read_kallsyms(path: str | os.PathLike[str]) -> SymbolTable:
    """A symbol table from a kallsyms copy; all-zero addresses are a clear error."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TracekitError(f"cannot read kallsyms copy {source}: {exc.strerror}") from None
    return parse_kallsyms(text, str(source))


def address_names(path: str | os.PathLike[str]) -> dict[int, str]:
    """Addresses -> names from a kallsyms copy, for drawing addresses as symbols."""
    return {s.address: s.name for s in read_kallsyms(path).symbols}


def parse_kallsyms(text: str, source: str) -> SymbolTable:
    """A symbol table from kallsyms text (a file, or the copy a trace.dat carries)."""
    symbols = [symbol for line in text.splitlines() if (symbol := parse_line(line)) is not None]
    if not symbols:
        raise TracekitError(
            f"{source}: no symbol with a non-zero address; copy /proc/kallsyms as root with "
            "kptr_restrict lifted (tracekit collect does this)"
        )
    return SymbolTable(symbols, ranked=False, spans=covered_spans(symbols))


def covered_spans(symbols: list[Symbol]) -> list[tuple[int, int]]:
    """Where kallsyms names addresses: the kernel image and each module, first to last symbol.

    kallsyms has no sizes, so past the last symbol of a region nothing is known: the
    kernel itself prints such addresses as bare hex, and so do we (no name is guessed).
    """
    ranges: dict[str, tuple[int, int]] = {}
    for symbol in symbols:
        low, high = ranges.get(symbol.module, (symbol.address, symbol.address))
        ranges[symbol.module] = (min(low, symbol.address), max(high, symbol.address))
    return [(low, high + 1) for low, high in ranges.values()]


def kaslr_shift(runtime: SymbolTable, linked: SymbolTable) -> int:
    """The KASLR displacement: run-time address minus link address of a common anchor."""
    for name in KASLR_ANCHORS:
        at_runtime, at_link = runtime.address_of(name), linked.address_of(name)
        if at_runtime is not None and at_link is not None:
            return at_runtime - at_link
    raise TracekitError(
        f"the kallsyms copy and the vmlinux share none of {', '.join(KASLR_ANCHORS)}; "
        "are they from the same kernel?"
    )


# scripts/kallsyms.c symbol_valid (6.1.176 :285-309, 6.12.117 :200-230): without
# --all-symbols, which link-vmlinux.sh passes for CONFIG_KALLSYMS_ALL, a symbol is kept
# only within these ranges (a symbol other than the end one at an end's address is
# dropped too; 6.12 also keeps __start_*/__stop_*).
KEPT_RANGES = (("_stext", "_etext"), ("_sinittext", "_einittext"))


def kallsyms_omission(system_map: str, name: str, all_symbols: bool) -> str | None:
    """Why the /proc/kallsyms of the kernel with this System.map will not list `name`,
    in a few words; None when it will (`all_symbols`: built with CONFIG_KALLSYMS_ALL)."""
    where: dict[str, int] = {}
    for line in system_map.splitlines():
        symbol = parse_line(line)
        if symbol is not None:
            where.setdefault(symbol.name, symbol.address)
    if name not in where:
        return f"its System.map has no {name}"
    at = where[name]
    inside = (lo in where and hi in where and where[lo] <= at < where[hi] for lo, hi in KEPT_RANGES)
    if all_symbols or any(inside):
        return None
    ranges = " and ".join(f"{lo}..{hi}" for lo, hi in KEPT_RANGES)
    return (
        f"built without CONFIG_KALLSYMS_ALL, its kallsyms keeps only {ranges}, and "
        f"{name} ({at:#x}) lies in neither"
    )
