"""Uprobe targets for the tests on this machine's tracefs (it has uprobes, not kprobes)."""

from __future__ import annotations

from pathlib import Path

from elftools.elf.elffile import ELFFile


def libc_uprobe_target(symbol: str) -> str:
    """ "path:0xoffset" of a libc function, as uprobe_events wants it (a file offset)."""
    maps = Path("/proc/self/maps").read_text()
    libc = next(line.split()[-1] for line in maps.splitlines() if "/libc.so" in line)
    with open(libc, "rb") as file:
        elf = ELFFile(file)
        dynsym = elf.get_section_by_name(".dynsym")
        address = dynsym.get_symbol_by_name(symbol)[0]["st_value"]
        for segment in elf.iter_segments("PT_LOAD"):
            if segment["p_vaddr"] <= address < segment["p_vaddr"] + segment["p_memsz"]:
                return f"{libc}:{address - segment['p_vaddr'] + segment['p_offset']:#x}"
    raise AssertionError(f"{symbol} is in no loadable segment of {libc}")
