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
    if not address:
        return None
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
        lines = source.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise TracekitError(f"cannot read kallsyms copy {source}: {exc.strerror}") from None
    symbols = [symbol for line in lines if (symbol := parse_line(line)) is not None]
    if not symbols:
        raise TracekitError(
            f"{source}: no symbol with a non-zero address; copy /proc/kallsyms as root with "
            "kptr_restrict lifted (tracekit collect does this)"
        )
    return SymbolTable(symbols, ranked=False)


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
