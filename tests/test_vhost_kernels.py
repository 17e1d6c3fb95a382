"""Kernels for the emulated host: suites, sid's split packages, layouts, built-in modules.

No network and no boot: sid's package resolution runs the real apt-get against a private
state whose package list is a cut of sid's real one (tests/fixtures/vhost/README.md).
"""

from __future__ import annotations

import lzma
import shutil
import subprocess
from pathlib import Path

import pytest

from tracekit.errors import TracekitError
from tracekit.vhost import apt
from tracekit.vhost.kernels import is_kernel_package, known_specs, parse_kernel_spec
from tracekit.vhost.kvmmode import kvm_mode_from_log
from tracekit.vhost.modules import builtin_modules, resolve_modules
from tracekit.vhost.rootfs import find_kernel

FIXTURES = Path(__file__).parent / "fixtures" / "vhost"
SID_RELEASE = "7.2.13+deb14-arm64"
ALL_SPECS = [
    "bookworm",
    "bookworm:rt",
    "bookworm:tk",
    "bookworm:kpatch",
    "bookworm:tk-ci",
    "bookworm:kpatch-ci",
    "trixie",
    "trixie:tk",
    "trixie:kpatch",
    "trixie:tk-ci",
    "trixie:kpatch-ci",
    "sid",
    "sid:16k",
    "sid:tk",
    "sid:kpatch",
    "sid:tk-ci",
    "sid:kpatch-ci",
]


def test_suites_and_flavours() -> None:
    """trixie and sid (with its 16 KB-page flavour) join bookworm (and its built kernels)."""
    assert known_specs() == ALL_SPECS
    for name in ("trixie", "sid", "sid:16k"):
        assert parse_kernel_spec(name).has_kvm
    assert parse_kernel_spec("sid:16k").packages()[0] == "linux-image-arm64-16k"
    with pytest.raises(TracekitError, match="unknown kernel flavour '16k' for suite 'trixie'"):
        parse_kernel_spec("trixie:16k")


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get")
@pytest.mark.parametrize(("kernel", "suffix"), [("sid", "arm64"), ("sid:16k", "arm64-16k")])
def test_sid_resolves_to_split_kernel_packages(tmp_path: Path, kernel: str, suffix: str) -> None:
    """sid's metapackage pulls linux-binary (vmlinuz), linux-modules and linux-base-REL."""
    state = apt.AptState(tmp_path, "sid", "http://deb.debian.org/debian")
    apt.prepare(state)
    lists = tmp_path / "lists" / "deb.debian.org_debian_dists_sid_main_binary-arm64_Packages"
    shutil.copy(FIXTURES / "sid-kernel-Packages", lists)
    spec = parse_kernel_spec(kernel)
    closure = apt.resolve(state, [spec.info.metapackage])
    kernel_debs = {p.name for p in closure if is_kernel_package(p.deb_filename)}
    release = f"7.2.13+deb14-{suffix}"
    assert {
        f"linux-binary-{release}",
        f"linux-modules-{release}",
        f"linux-base-{release}",
        f"linux-image-{release}",
    } <= kernel_debs
    other = "arm64-16k" if suffix == "arm64" else "arm64"
    assert not any(name.endswith(f"-{other}") for name in kernel_debs)
    # The generic linux-base (scripts, no kernel) goes to the rootfs like any userland.
    assert "linux-base" in {p.name for p in closure} and "linux-base" not in kernel_debs


def _touch(path: Path, data: bytes = b"") -> Path:
    """Create a file and its parents."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_find_kernel_in_sid_layout(tmp_path: Path) -> None:
    """sid keeps vmlinuz and config under /usr/lib/modules/REL/, not /boot."""
    modules = tmp_path / "usr" / "lib" / "modules" / SID_RELEASE
    _touch(modules / "vmlinuz", b"kernel")
    _touch(modules / "config", b"CONFIG_KVM=y\n")
    _touch(modules / "kernel" / "fs" / "9p" / "9p.ko.xz")
    found = find_kernel(tmp_path)
    assert (found.image, found.release) == (modules / "vmlinuz", SID_RELEASE)
    assert found.modules_dir == modules and found.config == modules / "config"


def test_find_kernel_in_boot_layout(tmp_path: Path) -> None:
    """bookworm and trixie keep /boot/vmlinuz-REL and /boot/config-REL."""
    release = "6.12.117+deb13-arm64"
    _touch(tmp_path / "boot" / f"vmlinuz-{release}", b"kernel")
    _touch(tmp_path / "boot" / f"config-{release}")
    _touch(tmp_path / "usr" / "lib" / "modules" / release / "kernel" / "x.ko")
    found = find_kernel(tmp_path)
    assert found.release == release and found.config == tmp_path / "boot" / f"config-{release}"


def test_find_kernel_without_image_is_one_error(tmp_path: Path) -> None:
    """No vmlinuz anywhere: a clear error, not a traceback."""
    with pytest.raises(TracekitError, match="hold no vmlinuz"):
        find_kernel(tmp_path)


def _module(tmp_path: Path, gcc: str, name: str, depends: str) -> bytes:
    """A relocatable ELF with a real .modinfo section, built by gcc here."""
    source = tmp_path / f"{name}.c"
    source.write_text(
        '__attribute__((section(".modinfo"), used)) static const char info[] =\n'
        f'    "depends={depends}\\0name={name}";\n'
    )
    subprocess.run([gcc, "-c", str(source), "-o", str(tmp_path / f"{name}.o")], check=True)
    return (tmp_path / f"{name}.o").read_bytes()


def test_builtin_roots_need_no_file_and_xz_modules_load(tmp_path: Path) -> None:
    """trixie builds virtio_pci in (modules.builtin); sid's .ko.xz are read uncompressed."""
    gcc = shutil.which("gcc") or shutil.which("aarch64-linux-gnu-gcc")
    if gcc is None:
        pytest.skip("no C compiler to build test ELFs: apt-get install gcc")
    modules = tmp_path / "modules"
    _touch(modules / "modules.builtin", b"kernel/drivers/virtio/virtio_pci.ko\n")
    p9 = _module(tmp_path, gcc, "9p", "9pnet,netfs")
    _touch(modules / "kernel" / "fs" / "9p" / "9p.ko.xz", lzma.compress(p9))
    _touch(modules / "kernel" / "net" / "9p" / "9pnet.ko", _module(tmp_path, gcc, "9pnet", ""))
    _touch(modules / "kernel" / "fs" / "netfs" / "netfs.ko", _module(tmp_path, gcc, "netfs", ""))
    virtio = _module(tmp_path, gcc, "9pnet_virtio", "9pnet")
    _touch(modules / "kernel" / "net" / "9p" / "9pnet_virtio.ko", virtio)
    assert builtin_modules(modules) == {"virtio_pci"}
    resolved = resolve_modules(modules, ["virtio_pci", "9pnet_virtio", "9p"])
    names = [name for name, _path, _image in resolved]
    assert names == ["9pnet", "9pnet_virtio", "netfs", "9p"]
    assert dict((name, image) for name, _path, image in resolved)["9p"] == p9
    with pytest.raises(TracekitError, match="'virtio_blk' not found"):
        resolve_modules(modules, ["virtio_blk"])


@pytest.mark.parametrize(
    ("log", "mode"),
    [
        ("dmesg-trixie-cortex-a76-nvhe.txt", "nvhe"),
        ("dmesg-trixie-max-vhe.txt", "vhe"),
        ("dmesg-sid-cortex-a76-nvhe.txt", "nvhe"),
        ("dmesg-sid-16k-cortex-a76-nvhe.txt", "nvhe"),
        ("dmesg-trixie-kpatch-max-hvhe.txt", "hvhe"),
        ("dmesg-trixie-kpatch-cortex-a76-protected.txt", "protected"),
    ],
)
def test_kvm_mode_from_newer_kernels(log: str, mode: str) -> None:
    """6.12 and 7.2 print the same KVM line as 6.1: the mode is read from real logs."""
    assert kvm_mode_from_log((FIXTURES / log).read_text()) == mode


def test_kernels_listing_on_an_empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vhost kernels` lists every choice, offline, saying what it does not know yet."""
    from click.testing import CliRunner

    from tracekit.cli import main

    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path))
    result = CliRunner().invoke(main, ["vhost", "kernels"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines()[1 : 1 + len(ALL_SPECS)]}
    assert set(rows) == set(ALL_SPECS)
    assert all("? (no package lists: --refresh)" in row for row in rows.values())
    assert rows["bookworm:rt"].endswith("no (Debian builds the PREEMPT_RT flavour without KVM)")
    assert rows["sid:16k"].split()[1] == "7.2" and rows["trixie"].endswith("yes")
    assert not any(tmp_path.iterdir())  # listing fetches and builds nothing


def test_trim_drops_mesa_drivers_but_keeps_what_tools_link(tmp_path: Path) -> None:
    """libLLVM/libgallium/libz3 and dri/ go; the GL loaders stress-ng links stay."""
    from tracekit.vhost.rootfs import trim

    lib = tmp_path / "usr" / "lib" / "aarch64-linux-gnu"
    dropped = ["libLLVM.so.19.1", "libgallium-25.0.7-2+deb13u1.so", "libz3.so.4"]
    kept = ["libEGL.so.1", "libgbm.so.1", "libpython3.13.so.1.0"]
    for name in dropped + kept:
        _touch(lib / name)
    (lib / "libLLVM-19.so").symlink_to("libLLVM.so.19.1")
    _touch(lib / "dri" / "swrast_dri.so")
    _touch(tmp_path / "usr" / "share" / "doc" / "x" / "copyright")
    trim(tmp_path)
    assert sorted(path.name for path in lib.iterdir()) == sorted(kept)
    assert not (tmp_path / "usr" / "share" / "doc").exists()


def test_16k_kernel_on_a_model_without_the_granule_is_refused(tmp_path: Path) -> None:
    """sid:16k on cortex-a53 would hang without a word (seen): refused before booting."""
    from tracekit.vhost.runner import VhostConfig, run

    config = VhostConfig(kernel="sid:16k", cpu_model="cortex-a53", out=tmp_path)
    with pytest.raises(TracekitError, match=r"cannot translate .* use --cpu-model cortex-a76"):
        run(config, ["true"])
    assert not any(tmp_path.iterdir())
