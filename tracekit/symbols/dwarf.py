"""Struct field offsets and enumerators from DWARF, parsing only the units that hold them.

A distribution vmlinux carries hundreds of MB of DWARF in thousands of compilation units;
walking it all takes minutes. Instead a type is looked up in the unit of an *anchor*
function known to use it: the function's address leads, through .debug_aranges, straight
to its unit, and only that unit's top-level DIEs are read.
"""

from __future__ import annotations

from dataclasses import dataclass

from elftools.dwarf.compileunit import CompileUnit
from elftools.dwarf.die import DIE
from elftools.dwarf.dwarfinfo import DWARFInfo

from tracekit.errors import TracekitError
from tracekit.symbols.vmlinux import Vmlinux, function_address

# Functions whose compilation units define the KVM types tracekit needs (arm.c, mmu.c,
# the nVHE hyp-main.c); tried in order. Any other type needs an --anchor function.
DEFAULT_ANCHORS = ("kvm_arch_init", "kvm_init_stage2_mmu", "__kvm_nvhe_handle_trap")

TYPEDEF_LIKE = frozenset(
    {"DW_TAG_typedef", "DW_TAG_const_type", "DW_TAG_volatile_type", "DW_TAG_atomic_type"}
)
AGGREGATES = frozenset({"DW_TAG_structure_type", "DW_TAG_union_type"})


@dataclass(frozen=True)
class FieldOffset:
    """Where a (possibly nested) field sits inside a struct, and how wide it is."""

    path: str
    offset: int
    size: int | None


def _dwarf(vmlinux: Vmlinux) -> DWARFInfo:
    """The DWARF of a vmlinux, or a clear error when it has none."""
    if not vmlinux.has_dwarf():
        raise TracekitError(
            f"{vmlinux.path}: no DWARF (.debug_info); use the debug vmlinux "
            "(Debian: linux-image-<version>-arm64-dbg, `tracekit symbols fetch`)"
        )
    # Kernel DWARF in a linked vmlinux needs no relocation; skipping it saves time.
    return vmlinux.elf.get_dwarf_info(relocate_dwarf_sections=False)


def anchor_unit(vmlinux: Vmlinux, dwarf: DWARFInfo, anchor: str) -> CompileUnit | None:
    """The compilation unit holding function `anchor`, through .debug_aranges."""
    address = function_address(vmlinux, anchor)
    aranges = dwarf.get_aranges()
    if address is None or aranges is None:
        return None
    offset = aranges.cu_offset_at_addr(address)
    return None if offset is None else dwarf.get_CU_at(offset)


def _name(die: DIE) -> str | None:
    """A DIE's DW_AT_name as text."""
    attribute = die.attributes.get("DW_AT_name")
    return attribute.value.decode("utf-8", "replace") if attribute else None


def find_type(unit: CompileUnit, tags: frozenset[str], name: str) -> DIE | None:
    """A complete top-level type DIE with this tag and name in one unit."""
    for die in unit.get_top_DIE().iter_children():
        if die.tag in tags and _name(die) == name and "DW_AT_declaration" not in die.attributes:
            return die
    return None


def locate_type(vmlinux: Vmlinux, tags: frozenset[str], name: str, anchors: tuple[str, ...]) -> DIE:
    """Find a type in the units of the anchor functions, first hit wins."""
    dwarf = _dwarf(vmlinux)
    for anchor in anchors:
        unit = anchor_unit(vmlinux, dwarf, anchor)
        found = find_type(unit, tags, name) if unit is not None else None
        if found:
            return found
    raise TracekitError(
        f"{vmlinux.path}: type {name!r} not found in the units of {', '.join(anchors)}; "
        "name a function whose source file uses it with --anchor FUNCTION"
    )


def _strip_typedefs(die: DIE) -> DIE:
    """Follow typedefs and qualifiers down to the underlying type."""
    while die.tag in TYPEDEF_LIKE and "DW_AT_type" in die.attributes:
        die = die.get_DIE_from_attribute("DW_AT_type")
    return die


def _member(struct: DIE, name: str) -> tuple[DIE, int] | None:
    """A direct member by name and its offset; looks inside anonymous struct/union members."""
    for child in struct.iter_children():
        if child.tag != "DW_TAG_member":
            continue
        location = child.attributes.get("DW_AT_data_member_location")
        offset = location.value if location and isinstance(location.value, int) else 0
        child_name = _name(child)
        if child_name == name:
            return child, offset
        if child_name is None and "DW_AT_type" in child.attributes:
            inner = _strip_typedefs(child.get_DIE_from_attribute("DW_AT_type"))
            nested = _member(inner, name) if inner.tag in AGGREGATES else None
            if nested:
                return nested[0], offset + nested[1]
    return None


def field_offset(struct: DIE, struct_name: str, fields: list[str]) -> FieldOffset:
    """The byte offset of `fields` (a path of member names) from the start of `struct`."""
    total, current, walked = 0, struct, struct_name
    size: int | None = None
    for name in fields:
        if current.tag not in AGGREGATES:
            raise TracekitError(f"{walked} is not a struct or union, so it has no field {name!r}")
        found = _member(current, name)
        if found is None:
            raise TracekitError(f"struct {walked} has no field {name!r}; check the spelling")
        member, offset = found
        total += offset
        walked = f"{walked}.{name}"
        current = _strip_typedefs(member.get_DIE_from_attribute("DW_AT_type"))
        byte_size = current.attributes.get("DW_AT_byte_size")
        size = byte_size.value if byte_size else None
    return FieldOffset(walked, total, size)


def enumerators(enum: DIE) -> dict[str, int]:
    """The name -> value pairs of an enumeration DIE."""
    return {
        _name(child) or "": child.attributes["DW_AT_const_value"].value
        for child in enum.iter_children()
        if child.tag == "DW_TAG_enumerator"
    }
