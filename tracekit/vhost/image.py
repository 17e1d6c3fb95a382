"""Build and find the emulated host's images: kernel + initramfs, cached by versions.

An image lives in <cache>/vhost/images/<kernel>/<key>/, where the key hashes the
resolved package versions and this builder's own inputs (/init, layout version). A
`current` file per kernel names the newest image, so `vhost run` needs no network.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.vhost import apt, kcustom
from tracekit.vhost.cache import vhost_cache
from tracekit.vhost.cpio import CpioWriter, add_tree
from tracekit.vhost.kbuild import BuiltKernel
from tracekit.vhost.kernels import BOOT_MODULES, KernelSpec, is_kernel_package
from tracekit.vhost.rootfs import add_skeleton, extract_deb, find_kernel, install_modules, trim

# Bump when the rootfs layout changes in a way the package versions do not show.
LAYOUT_VERSION = 2
# What an image holds and was built from (not a bundle manifest, so not called one).
IMAGE_RECORD = "image.json"


@dataclass(frozen=True)
class VhostImage:
    """A built image: what QEMU boots, and what it was built from."""

    directory: Path
    spec: KernelSpec
    kernel_release: str
    packages: list[str]

    @property
    def kernel(self) -> Path:
        """The kernel image QEMU loads (-kernel)."""
        return self.directory / "vmlinuz"

    @property
    def initramfs(self) -> Path:
        """The initramfs QEMU loads (-initrd)."""
        return self.directory / "initramfs.cpio"

    def build_dir(self) -> Path | None:
        """The build directory of a kernel tracekit built (its System.map and .config),
        as the image record names it; None for a Debian kernel, or a record without it."""
        try:
            found = json.loads((self.directory / IMAGE_RECORD).read_text()).get("build_dir")
        except (OSError, ValueError, AttributeError):
            return None
        return Path(found) if isinstance(found, str) else None


def init_script() -> bytes:
    """The /init shell script shipped inside the package."""
    return resources.files("tracekit.vhost").joinpath("init.sh").read_bytes()


def image_key(spec: KernelSpec, closure: list[apt.PackageVersion], built: str = "") -> str:
    """A short hash of everything an image is made from (`built`: tracekit's kernel build)."""
    digest = hashlib.sha256()
    digest.update(f"layout={LAYOUT_VERSION}\nkernel={spec.name}\nbuilt={built}\n".encode())
    digest.update(init_script())
    for package in closure:
        digest.update(f"{package.name}={package.version}:{package.arch}\n".encode())
    return digest.hexdigest()[:16]


def _spec_dir(spec: KernelSpec) -> Path:
    """The directory holding every image built for one kernel spec."""
    return vhost_cache() / "images" / spec.name.replace(":", "-")


def _load(directory: Path, spec: KernelSpec) -> VhostImage | None:
    """The image in `directory` if it is complete (manifest written last), else None."""
    try:
        manifest = json.loads((directory / IMAGE_RECORD).read_text())
    except (OSError, ValueError):
        return None
    image = VhostImage(directory, spec, manifest["kernel_release"], manifest["packages"])
    return image if image.kernel.is_file() and image.initramfs.is_file() else None


def find_image(spec: KernelSpec) -> VhostImage | None:
    """The newest complete image for `spec`, built with today's /init, or None."""
    current = _spec_dir(spec) / "current"
    if not current.is_file():
        return None
    image = _load(_spec_dir(spec) / current.read_text().strip(), spec)
    if image is None:
        return None
    built_init = image.directory / "init.sh"
    return image if built_init.is_file() and built_init.read_bytes() == init_script() else None


def build_image(spec: KernelSpec, progress: apt.Progress, force: bool = False) -> VhostImage:
    """Resolve, download and assemble the image for `spec`, unless it is already built."""
    check_build_tools()
    state = apt.AptState(vhost_cache() / "apt" / spec.suite, spec.suite, apt.mirror_from_env())
    apt.check_tools(state)
    apt.update(state, progress)
    packages = spec.packages()
    closure = apt.resolve(state, packages)
    built = None
    if spec.info.build:
        # The kernel is built from the Debian kernel's source and config: download first.
        built = kcustom.build_for(spec, apt.download(state, packages, closure, progress), progress)
    identity = f"{built.release}:{built.config_hash}:{built.patch_hash}" if built else ""
    key = image_key(spec, closure, identity)
    directory = _spec_dir(spec) / key
    existing = _load(directory, spec)
    if existing is not None and not force:
        (_spec_dir(spec) / "current").write_text(key + "\n")
        progress(
            f"vhost image for {spec.name} is up to date ({len(closure)} packages, "
            f"kernel {existing.kernel_release}): nothing to do"
        )
        return existing
    debs = apt.download(state, packages, closure, progress)
    image = _assemble(spec, closure, debs, directory, progress, built)
    (_spec_dir(spec) / "current").write_text(key + "\n")
    return image


def _assemble(
    spec: KernelSpec,
    closure: list[apt.PackageVersion],
    debs: list[Path],
    directory: Path,
    progress: apt.Progress,
    built: BuiltKernel | None = None,
) -> VhostImage:
    """Unpack the packages, add modules and /init, write the cpio, then the manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="staging-", dir=directory) as staging:
        root, kernel_root = Path(staging) / "root", Path(staging) / "kernel"
        root.mkdir()
        kernel_root.mkdir()
        for count, deb in enumerate(debs, 1):
            if count % 20 == 0 or count == len(debs):
                progress(f"unpacking packages: {count}/{len(debs)}")
            if not (built and is_kernel_package(deb.name)):
                extract_deb(deb, kernel_root if is_kernel_package(deb.name) else root)
        trim(root)
        add_skeleton(root)
        kernel = kcustom.kernel_files(built) if built else find_kernel(kernel_root)
        modules = install_modules(kernel, root, list(BOOT_MODULES))
        progress(
            f"kernel {kernel.release}: {len(modules)} boot modules ({', '.join(BOOT_MODULES)} "
            "and dependencies)"
        )
        (root / "init").write_bytes(init_script())
        (root / "init").chmod(0o755)
        shutil.copy2(kernel.image, directory / "vmlinuz")
        entries = _write_initramfs(root, directory / "initramfs.cpio")
    size_mb = (directory / "initramfs.cpio").stat().st_size / 1e6
    # Uncompressed: lz4 measured no faster to boot under TCG (docs/vhost.md).
    progress(f"initramfs: {entries} entries, {size_mb:.0f} MB, uncompressed")
    (directory / "init.sh").write_bytes(init_script())
    manifest = {
        "kernel": spec.name,
        "kernel_release": kernel.release,
        "packages": [f"{p.name}={p.version}" for p in closure],
        "modules": modules,
        **(_built_record(built) if built else {}),
    }
    (directory / IMAGE_RECORD).write_text(json.dumps(manifest, indent=1) + "\n")
    return VhostImage(directory, spec, kernel.release, manifest["packages"])


def _built_record(built: BuiltKernel) -> dict[str, str]:
    """What the image record says of a kernel tracekit built."""
    return {
        "built_from": f"linux {built.source_version} (Debian source)",
        "config_hash": built.config_hash,
        "patch_hash": built.patch_hash,
        "build_dir": str(built.directory),
    }


def _write_initramfs(root: Path, dest: Path) -> int:
    """Pack `root` into an uncompressed newc cpio with a /dev/console node."""
    partial = dest.with_suffix(".partial")
    with partial.open("wb") as stream:
        writer = CpioWriter(stream)
        count = add_tree(writer, root)
        # The kernel opens /dev/console for /init before devtmpfs is mounted.
        writer.add_char_device("dev/console", 5, 1)
        writer.close()
    partial.replace(dest)
    return count + 1


def require_image(spec: KernelSpec, progress: apt.Progress) -> VhostImage:
    """The image to boot: the cached one, else build it now."""
    image = find_image(spec)
    if image is not None:
        return image
    progress(f"no vhost image for {spec.name} yet: building it (once)")
    return build_image(spec, progress)


def check_build_tools() -> None:
    """Fail before any download if the .deb unpacker is missing (apt is checked by apt.py)."""
    if shutil.which("dpkg-deb") is None:
        raise TracekitError("dpkg-deb not found: install the 'dpkg' package")
