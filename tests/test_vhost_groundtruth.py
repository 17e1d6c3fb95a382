"""The ground-truth plugin's build side: QEMU version checks, the header out of Debian's
source tarballs, the deb-src apt state, and the plugin built by make against the header.

The tarballs here are generated; the build uses the header `tracekit vhost build
--ground-truth` cached (the real one of the installed QEMU), and is skipped without it.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from tracekit.errors import TracekitError
from tracekit.vhost import apt, groundtruth

HEADER = b"/* qemu-plugin.h */\n#define QEMU_PLUGIN_VERSION 1\n"


def _tarball(path: Path, files: dict[str, bytes]) -> Path:
    """An .tar.xz holding `files`."""
    with tarfile.open(path, "w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_debian_version_from_qemu_version_output() -> None:
    """The Debian version is read from `qemu-system-aarch64 --version`, or None."""
    line = "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright"
    assert groundtruth.parse_debian_version(line) == "1:7.2+dfsg-7+deb12u18+b3"
    assert groundtruth.parse_debian_version("QEMU emulator version 9.1.0") is None


def test_version_mismatch_is_one_line() -> None:
    """A QEMU on PATH other than the packaged one is refused, naming both versions."""
    groundtruth.check_same_version("1:7.2+dfsg-7+deb12u18+b3", "1:7.2+dfsg-7+deb12u18+b3")
    with pytest.raises(TracekitError, match="reports Debian version none, but qemu-system-arm"):
        groundtruth.check_same_version("1:7.2+dfsg-7+deb12u18+b3", None)


def test_header_cut_from_the_upstream_tarball(tmp_path: Path) -> None:
    """include/qemu/qemu-plugin.h comes out of the .orig tarball; its API is checked."""
    orig = _tarball(
        tmp_path / "qemu_7.2+dfsg.orig.tar.xz",
        {"qemu-7.2.0/include/qemu/qemu-plugin.h": HEADER, "qemu-7.2.0/README": b"x"},
    )
    assert groundtruth.header_from_tarball(orig) == HEADER
    groundtruth.check_api(HEADER)
    with pytest.raises(TracekitError, match="plugin API 2"):
        groundtruth.check_api(HEADER.replace(b"VERSION 1", b"VERSION 2"))
    empty = _tarball(tmp_path / "other.tar.xz", {"x/README": b"x"})
    with pytest.raises(TracekitError, match="not a QEMU source tarball"):
        groundtruth.header_from_tarball(empty)


def test_a_debian_patch_to_the_header_is_refused(tmp_path: Path) -> None:
    """If Debian patches the header, the tarball's copy is not the installed QEMU's."""
    clean = _tarball(tmp_path / "a.debian.tar.xz", {"debian/patches/x.patch": b"--- a/foo.c\n"})
    groundtruth.check_not_patched(clean)
    patched = _tarball(
        tmp_path / "b.debian.tar.xz",
        {"debian/patches/y.patch": b"--- a/include/qemu/qemu-plugin.h\n+++ b/..."},
    )
    with pytest.raises(TracekitError, match=r"patches qemu-plugin\.h"):
        groundtruth.check_not_patched(patched)


def test_source_state_lists_deb_src(tmp_path: Path) -> None:
    """The private source state asks for deb-src lines of the suite and its -updates."""
    state = apt.AptState(
        tmp_path,
        "bookworm",
        "http://mirror.example/debian",
        source=True,
        extra_suites=("bookworm-updates",),
    )
    lines = apt.sources_list(state).splitlines()
    assert [line.split()[0] for line in lines] == ["deb-src", "deb-src"]
    assert [line.split()[3] for line in lines] == ["bookworm", "bookworm-updates"]


def test_plugin_argv_refuses_commas(tmp_path: Path) -> None:
    """QEMU's option parser splits on commas: such a path is one clear error."""
    argv = groundtruth.plugin_argv(tmp_path / "tkgt.so", tmp_path / "log", 10)
    assert argv == ["-plugin", f"file={tmp_path}/tkgt.so,out={tmp_path}/log,limit=10"]
    with pytest.raises(TracekitError, match="comma"):
        groundtruth.plugin_argv(tmp_path / "a,b" / "tkgt.so", tmp_path / "log")


def _cached_header() -> Path | None:
    """The header of the installed QEMU, if `vhost build --ground-truth` cached it."""
    try:
        version = groundtruth.installed_qemu()
    except TracekitError:
        return None
    header = groundtruth.header_dir(version) / groundtruth.HEADER
    return header if header.is_file() else None


@pytest.mark.skipif(_cached_header() is None, reason="run `tracekit vhost build --ground-truth`")
def test_plugin_builds_with_werror_and_exports_install(tmp_path: Path) -> None:
    """make builds the plugin -Wall -Wextra -Werror; it exports what QEMU looks up."""
    header = _cached_header()
    assert header is not None
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(groundtruth.plugin_source_dir()),
            f"QEMU_PLUGIN_INCLUDE={header.parent}",
            f"O={tmp_path}",
        ],
        check=True,
    )
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(tmp_path / groundtruth.PLUGIN)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "qemu_plugin_install" in symbols and "qemu_plugin_version" in symbols
    assert "intern_site" not in symbols  # everything else stays hidden
