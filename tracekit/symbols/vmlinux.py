"""Open a kernel vmlinux: check it is an arm64 ELF with symbols, read its build-id and symbols.

The ELF symbol table includes the hypervisor's own symbols, linked into the kernel image
with a `__kvm_nvhe_` prefix; their addresses are kernel addresses (EL2 runs the same code
at its own hyp VA, which these do not translate).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.construct import ConstructError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection

from tracekit.errors import TracekitError
from tracekit.symbols import cache
from tracekit.symbols.table import Symbol, SymbolTable

NVHE_PREFIX = "__kvm_nvhe_"
# The linker's end of the kernel image; addresses past it belong to modules or vmalloc.
IMAGE_END = "_end"
# Symbol kinds that name code or data; mapping symbols ($x, $d) and files are noise.
_NAMED_KINDS = frozenset({"STT_FUNC", "STT_OBJECT", "STT_NOTYPE"})


@dataclass
class Vmlinux:
    """An open vmlinux with its identity; close it when done (or use `with`)."""

    path: Path
    stream: BinaryIO
    elf: ELFFile
    build_id: str
    _symbols: SymbolTable | None = field(default=None, repr=False)

    def __enter__(self) -> Vmlinux:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.close()

    def has_dwarf(self) -> bool:
        """Whether the file carries DWARF type information (.debug_info)."""
        return self.elf.get_section_by_name(".debug_info") is not None

    def symbols(self) -> SymbolTable:
        """The ELF symbol table at link addresses, cached by build-id."""
        if self._symbols is None:
            rows = cache.load(self.build_id, "symbols")
            if rows is None:
                rows = [[s.address, s.name, s.weak] for s in read_elf_symbols(self)]
                cache.store(self.build_id, "symbols", rows)
            table = SymbolTable(Symbol(a, n, weak=w) for a, n, w in rows)
            table.end = table.address_of(IMAGE_END)
            self._symbols = table
        return self._symbols


def _check_elf(path: Path, elf: ELFFile) -> None:
    """Refuse another architecture or a stripped kernel, saying what to use instead."""
    if elf["e_machine"] != "EM_AARCH64":
        raise TracekitError(
            f"{path}: ELF machine {elf['e_machine']} is not AArch64; give the arm64 kernel's "
            "vmlinux (Debian: linux-image-<version>-arm64-dbg)"
        )
    if not isinstance(elf.get_section_by_name(".symtab"), SymbolTableSection):
        raise TracekitError(
            f"{path}: stripped (no .symtab); give the unstripped vmlinux from the kernel build "
            "or the -dbg package (`tracekit symbols fetch`), or a /proc/kallsyms copy"
        )


def _build_id(path: Path, elf: ELFFile) -> str:
    """The GNU build-id as hex; a vmlinux without one cannot be cached safely."""
    for section in elf.iter_sections():
        if not isinstance(section, NoteSection):
            continue
        for note in section.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return str(note["n_desc"])
    raise TracekitError(f"{path}: no GNU build-id note; build the kernel with --build-id")


def open_vmlinux(path: str | os.PathLike[str]) -> Vmlinux:
    """Open and check a vmlinux; TracekitError for a missing, non-ELF, foreign or stripped file."""
    source = Path(path)
    try:
        stream = source.open("rb")
    except OSError as exc:
        raise TracekitError(f"cannot read vmlinux {source}: {exc.strerror}") from None
    try:
        elf = ELFFile(stream)
        _check_elf(source, elf)
        return Vmlinux(source, stream, elf, _build_id(source, elf))
    except (ELFError, ConstructError) as exc:
        stream.close()
        raise TracekitError(
            f"{source}: not an ELF file ({exc}); give a vmlinux or a /proc/kallsyms copy"
        ) from None
    except TracekitError:
        stream.close()
        raise


def read_elf_symbols(vmlinux: Vmlinux) -> list[Symbol]:
    """Every named code/data symbol of .symtab, at its link address."""
    symtab = vmlinux.elf.get_section_by_name(".symtab")
    assert isinstance(symtab, SymbolTableSection)  # checked by open_vmlinux
    found = []
    for entry in symtab.iter_symbols():
        name, value = entry.name, entry["st_value"]
        if not name or not value or name.removeprefix(NVHE_PREFIX).startswith("$"):
            continue  # $x/$d mark code/data runs (also inside the hyp objects), not symbols
        if entry["st_info"]["type"] not in _NAMED_KINDS or entry["st_shndx"] == "SHN_ABS":
            continue  # absolute symbols are constants (sizes, offsets), not addresses
        found.append(Symbol(value, name, weak=entry["st_info"]["bind"] == "STB_WEAK"))
    return found


def function_address(vmlinux: Vmlinux, name: str) -> int | None:
    """The link address of a named symbol (used to find its compilation unit)."""
    return vmlinux.symbols().address_of(name)
