"""`struct.field[.field]` specs -> byte offsets, from DWARF, cached by build-id."""

from __future__ import annotations

from dataclasses import asdict

from tracekit.errors import TracekitError
from tracekit.symbols import cache, dwarf
from tracekit.symbols.vmlinux import Vmlinux


def parse_spec(spec: str) -> tuple[str, list[str]]:
    """Split `kvm_s2_mmu.vmid.id` into the struct name and its field path."""
    parts = spec.strip().removeprefix("struct ").split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        raise TracekitError(
            f"bad field spec {spec!r}: write STRUCT.FIELD[.FIELD...], e.g. kvm_s2_mmu.vmid.id"
        )
    return parts[0], parts[1:]


def offsetof(
    vmlinux: Vmlinux, spec: str, anchors: tuple[str, ...] = dwarf.DEFAULT_ANCHORS
) -> dwarf.FieldOffset:
    """The offset of a field path inside a struct, e.g. `kvm_s2_mmu.vmid.id`."""
    struct_name, fields = parse_spec(spec)
    key = f"offsetof-{struct_name}." + ".".join(fields)
    cached = cache.load(vmlinux.build_id, key)
    if cached is not None:
        return dwarf.FieldOffset(**cached)
    struct = dwarf.locate_type(vmlinux, dwarf.AGGREGATES, struct_name, anchors)
    found = dwarf.field_offset(struct, struct_name, fields)
    cache.store(vmlinux.build_id, key, asdict(found))
    return found
