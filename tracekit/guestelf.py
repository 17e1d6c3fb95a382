"""The little of an ELF file a reproducer guest needs read: header, segments, notes.

With the standard library's struct only: importing pyelftools' ELFFile took ~10 s of
every `tracekit` start in the emulated host (cProfile in session 11's boot: tracekit.guests'
import, 11 s of a collect's 295 s), and a guest is a small static AArch64 ELF64 whose
program headers say everything the host side reads (ELF64 as in the System V gABI:
Elf64_Ehdr, Elf64_Phdr, Elf64_Nhdr with 4-byte aligned name and descriptor).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# e_ident[0:16], e_type, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags,
# e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx.
EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
# p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align.
PHDR = struct.Struct("<IIQQQQQQ")
# n_namesz, n_descsz, n_type.
NHDR = struct.Struct("<III")
ELFCLASS64, ELFDATA2LSB = 2, 1
EM_AARCH64 = 183
PT_LOAD, PT_NOTE = 1, 4


class NotAnElf(ValueError):
    """The bytes are not an ELF64 file this reader understands (the text says why)."""


@dataclass(frozen=True)
class Segment:
    """One program header, and the bytes it names in the file."""

    type: int
    paddr: int
    filesz: int
    memsz: int
    data: bytes


@dataclass(frozen=True)
class GuestElf:
    """An ELF file's machine, entry point and segments."""

    machine: int
    entry: int
    segments: tuple[Segment, ...]

    def notes(self) -> list[tuple[str, int, bytes]]:
        """Every note of the PT_NOTE segments as (name, type, descriptor)."""
        found = []
        for segment in self.segments:
            if segment.type == PT_NOTE:
                found += _notes(segment.data)
        return found


def parse_elf(data: bytes) -> GuestElf:
    """The header and program headers of an ELF file's bytes, or NotAnElf.

    The machine is read for any class and byte order (so a 32-bit ARM file is told apart
    by its machine); the rest only for little-endian ELF64, what AArch64 guests are.
    """
    if len(data) < 20 or data[:4] != b"\x7fELF":
        raise NotAnElf("no ELF header")
    machine = struct.unpack_from("<H" if data[5] == ELFDATA2LSB else ">H", data, 18)[0]
    if machine != EM_AARCH64:
        return GuestElf(machine, 0, ())
    if data[4] != ELFCLASS64 or data[5] != ELFDATA2LSB or len(data) < EHDR.size:
        raise NotAnElf("not a whole little-endian ELF64 header")
    header = EHDR.unpack_from(data)
    entry, phoff, phentsize, phnum = header[4], header[5], header[9], header[10]
    if phnum and phentsize < PHDR.size:
        raise NotAnElf(f"program headers of {phentsize} bytes")
    segments = []
    for index in range(phnum):
        at = phoff + index * phentsize
        if at + PHDR.size > len(data):
            raise NotAnElf(f"program header {index} is past the end of the file")
        kind, _, offset, _, paddr, filesz, memsz, _ = PHDR.unpack_from(data, at)
        if offset + filesz > len(data):
            raise NotAnElf(f"segment {index}'s bytes are past the end of the file")
        segments.append(Segment(kind, paddr, filesz, memsz, data[offset : offset + filesz]))
    return GuestElf(machine, entry, tuple(segments))


def _notes(data: bytes) -> list[tuple[str, int, bytes]]:
    """The notes in a PT_NOTE segment's bytes (name up to its NUL, padded fields skipped)."""
    notes, at = [], 0
    while at + NHDR.size < len(data):
        namesz, descsz, kind = NHDR.unpack_from(data, at)
        at += NHDR.size
        name = data[at : at + namesz].split(b"\0", 1)[0].decode("utf-8", "replace")
        at += _aligned(namesz)
        if at + descsz > len(data):
            raise NotAnElf("a note's descriptor is past the end of its segment")
        notes.append((name, kind, data[at : at + descsz]))
        at += _aligned(descsz)
    return notes


def _aligned(size: int) -> int:
    """A note field's size on disk: padded to 4 bytes."""
    return (size + 3) & ~3
