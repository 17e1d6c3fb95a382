"""Kernel modules the emulated host needs at boot, with their dependencies, in load order.

A .deb kernel carries no modules.dep (depmod runs at install time), so the dependencies
come from each module's own `.modinfo` section (`depends=a,b`).
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

from elftools.elf.elffile import ELFFile

from tracekit.errors import TracekitError

MODULE_SUFFIXES = (".ko", ".ko.xz")


def module_name(path: Path) -> str:
    """The kernel's name for a module file: stem without .ko[.xz], '-' read as '_'."""
    name = path.name
    for suffix in sorted(MODULE_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name.replace("-", "_")


def module_bytes(path: Path) -> bytes:
    """The module's ELF image, decompressing .ko.xz (sid ships them compressed)."""
    data = path.read_bytes()
    return lzma.decompress(data) if path.name.endswith(".xz") else data


def modinfo(elf_image: bytes) -> dict[str, list[str]]:
    """The key=value pairs of a module's .modinfo section (keys may repeat)."""
    section = ELFFile(io.BytesIO(elf_image)).get_section_by_name(".modinfo")
    if section is None:
        return {}
    info: dict[str, list[str]] = {}
    for entry in section.data().split(b"\0"):
        key, sep, value = entry.decode(errors="replace").partition("=")
        if sep:
            info.setdefault(key, []).append(value)
    return info


def dependencies(elf_image: bytes) -> list[str]:
    """The modules this one needs loaded first (its `depends=` list)."""
    depends = modinfo(elf_image).get("depends", [""])[0]
    return [name for name in depends.split(",") if name]


def index_modules(modules_dir: Path) -> dict[str, Path]:
    """Map every module name under a kernel's modules directory to its file."""
    return {
        module_name(path): path
        for path in sorted(modules_dir.rglob("*"))
        if path.name.endswith(MODULE_SUFFIXES)
    }


def builtin_modules(modules_dir: Path) -> set[str]:
    """Names of the modules built into the kernel (modules.builtin), which need no file."""
    listing = modules_dir / "modules.builtin"
    if not listing.is_file():
        return set()
    return {module_name(Path(line)) for line in listing.read_text().split() if line}


def load_order(roots: list[str], depends_of: dict[str, list[str]]) -> list[str]:
    """Dependencies before dependents, each once: a depth-first post-order of `roots`."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        """Append `name` after everything it depends on."""
        if name in order or name in visiting:
            return
        visiting.add(name)
        for dep in depends_of.get(name, []):
            visit(dep)
        order.append(name)

    for root in roots:
        visit(root)
    return order


def resolve_modules(modules_dir: Path, roots: list[str]) -> list[tuple[str, Path, bytes]]:
    """The closure of `roots` in load order: (name, source file, uncompressed image).

    Roots built into the kernel are left out: trixie builds virtio_pci in, bookworm not.
    """
    index = index_modules(modules_dir)
    builtin = builtin_modules(modules_dir)
    images: dict[str, bytes] = {}
    depends_of: dict[str, list[str]] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in images or (name in builtin and name not in index):
            continue
        if name not in index:
            raise TracekitError(
                f"kernel module {name!r} not found under {modules_dir}: this kernel "
                "cannot mount the 9p shares the emulated host needs"
            )
        images[name] = module_bytes(index[name])
        depends_of[name] = dependencies(images[name])
        pending += depends_of[name]
    order = load_order([root for root in roots if root in images], depends_of)
    return [(name, index[name], images[name]) for name in order]
