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

# trixie's and sid's stress-ng link libEGL/libgbm, which pull in Mesa's drivers: ~185 MB
# (libLLVM, libgallium, libz3) that only its GPU stressor would dlopen, never linked by
# the tools the host runs (checked with readelf's NEEDED closure). Dropping them halves
# the initramfs and the time the kernel takes to unpack it.
TRIMMED_GLOBS = (
    "usr/lib/*/libLLVM*.so*",
    "usr/lib/*/libgallium*.so",
    "usr/lib/*/libz3.so*",
    "usr/lib/*/dri",
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
    """Remove documentation, translations and unused GPU drivers from the unpacked tree."""
    for sub in TRIMMED_DIRS:
        shutil.rmtree(root / sub, ignore_errors=True)
    for pattern in TRIMMED_GLOBS:
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


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


def _kernel_images(kernel_root: Path) -> list[tuple[Path, str]]:
    """(image, release) pairs: /boot/vmlinuz-REL, or sid's /usr/lib/modules/REL/vmlinuz."""
    found = [
        (path, path.name.removeprefix("vmlinuz-"))
        for path in (kernel_root / "boot").glob("vmlinuz-*")
    ]
    for base in ("lib/modules", "usr/lib/modules"):
        found += [(path, path.parent.name) for path in (kernel_root / base).glob("*/vmlinuz")]
    return sorted(found)


def find_kernel(kernel_root: Path) -> KernelFiles:
    """The vmlinuz, modules directory and config inside the unpacked kernel packages."""
    images = _kernel_images(kernel_root)
    if not images:
        raise TracekitError(
            "the kernel packages hold no vmlinuz (boot/vmlinuz-* or usr/lib/modules/*/vmlinuz): "
            "this suite's kernel is not packaged as expected; pick another --kernel"
        )
    image, release = images[-1]
    for base in ("lib/modules", "usr/lib/modules"):
        modules_dir = kernel_root / base / release
        if modules_dir.is_dir() and any(modules_dir.glob("kernel")):
            configs = [kernel_root / "boot" / f"config-{release}", modules_dir / "config"]
            config = next((path for path in configs if path.is_file()), None)
            return KernelFiles(image, release, modules_dir, config)
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
    dest_base.mkdir(parents=True, exist_ok=True)  # also when every module is built in
    for extra in ("modules.builtin", "modules.order"):
        if (kernel.modules_dir / extra).is_file():
            shutil.copy2(kernel.modules_dir / extra, dest_base / extra)
    (root / "etc" / "tracekit").mkdir(parents=True, exist_ok=True)
    # Empty when everything is built in (tracekit's own kernels): /init loads nothing.
    (root / "etc" / "tracekit" / "modules").write_text("".join(f"{m}\n" for m in loaded))
    if kernel.config is not None:
        (root / "boot").mkdir(exist_ok=True)
        # /boot/config-REL, where preflight and tools look for it, whatever the suite.
        shutil.copy2(kernel.config, root / "boot" / f"config-{kernel.release}")
    return loaded
