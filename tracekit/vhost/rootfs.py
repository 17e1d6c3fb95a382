"""Unpack Debian packages into the emulated host's root filesystem and kernel files."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.vhost.modules import resolve_modules

# Documentation and translations are a third of the unpacked size and nobody reads them
# in the emulated host; dropping them keeps the initramfs quick to load.
TRIMMED_DIRS = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/bug",
)

# Mount points /init uses, and the merged-/usr links a non-merged suite lacks.
MOUNT_POINTS = (
    "proc",
    "sys",
    "dev",
    "tmp",
    "run",
    "ctl",
    "out",
    "share",
    "tracekit",
    "root",
    "mnt",
    "var/tmp",
)
MERGED_USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib"}


@dataclass(frozen=True)
class KernelFiles:
    """The unpacked kernel: its image, release string and modules directory."""

    image: Path
    release: str
    modules_dir: Path
    config: Path | None


def extract_deb(deb: Path, dest: Path) -> None:
    """Unpack a .deb's data archive into `dest` (dpkg-deb reads every compression)."""
    if shutil.which("dpkg-deb") is None:
        raise TracekitError("dpkg-deb not found: install the 'dpkg' package")
    done = subprocess.run(
        ["dpkg-deb", "-x", str(deb), str(dest)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise TracekitError(
            f"cannot unpack {deb.name}: {done.stderr.strip()}; delete it from the cache and "
            "build again"
        )


def trim(root: Path) -> None:
    """Remove documentation and translations from the unpacked tree."""
    for sub in TRIMMED_DIRS:
        shutil.rmtree(root / sub, ignore_errors=True)


def add_skeleton(root: Path) -> None:
    """Mount points, merged-/usr links where missing, and the minimal account files."""
    for sub in MOUNT_POINTS:
        (root / sub).mkdir(parents=True, exist_ok=True)
    for link, target in MERGED_USR_LINKS.items():
        if not (root / link).exists() and not (root / link).is_symlink():
            (root / link).symlink_to(target)
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\n")
    (etc / "hostname").write_text("vhost\n")


def find_kernel(kernel_root: Path) -> KernelFiles:
    """The vmlinuz and the modules directory inside the unpacked kernel packages."""
    images = sorted((kernel_root / "boot").glob("vmlinuz-*"))
    if not images:
        raise TracekitError(
            "the kernel packages hold no boot/vmlinuz-*: this suite's kernel is not packaged "
            "as expected; pick another --kernel"
        )
    release = images[-1].name.removeprefix("vmlinuz-")
    for base in ("lib/modules", "usr/lib/modules"):
        modules_dir = kernel_root / base / release
        if modules_dir.is_dir():
            config = kernel_root / "boot" / f"config-{release}"
            return KernelFiles(
                images[-1], release, modules_dir, config if config.is_file() else None
            )
    raise TracekitError(f"no modules directory for kernel {release} in its packages")


def install_modules(kernel: KernelFiles, root: Path, names: list[str]) -> list[str]:
    """Copy the modules' closure into the rootfs, uncompressed; write their load order."""
    dest_base = root / "lib" / "modules" / kernel.release
    loaded: list[str] = []
    for _name, source, image in resolve_modules(kernel.modules_dir, names):
        relative = source.relative_to(kernel.modules_dir).as_posix().removesuffix(".xz")
        (dest_base / relative).parent.mkdir(parents=True, exist_ok=True)
        (dest_base / relative).write_bytes(image)
        loaded.append(f"/lib/modules/{kernel.release}/{relative}")
    for extra in ("modules.builtin", "modules.order"):
        if (kernel.modules_dir / extra).is_file():
            shutil.copy2(kernel.modules_dir / extra, dest_base / extra)
    (root / "etc" / "tracekit").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "tracekit" / "modules").write_text("\n".join(loaded) + "\n")
    if kernel.config is not None:
        (root / "boot").mkdir(exist_ok=True)
        shutil.copy2(kernel.config, root / "boot" / kernel.config.name)
    return loaded
