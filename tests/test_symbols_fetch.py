"""Streaming one file out of a .deb: a real package built here with dpkg-deb, read by URL."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tracekit.errors import TracekitError
from tracekit.symbols.fetch import DebUri, download_vmlinux, parse_print_uris, vmlinux_member

RELEASE = "6.1.0-99-arm64"
# Bigger than one read chunk, so the member spans many reads of the stream.
PAYLOAD = bytes(range(256)) * 9000


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A -dbg-like .deb (xz data) holding a vmlinux and a decoy, built by dpkg-deb."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is missing (Debian package dpkg)")
    root = tmp_path_factory.mktemp("pkg")
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text(
        f"Package: linux-image-{RELEASE}-dbg\nVersion: 1\nArchitecture: arm64\n"
        "Maintainer: tracekit tests <tests@invalid>\nDescription: test package\n"
    )
    boot = root / "usr" / "lib" / "debug" / "boot"
    boot.mkdir(parents=True)
    (boot / f"System.map-{RELEASE}").write_text("decoy\n")
    (boot / f"vmlinux-{RELEASE}").write_bytes(PAYLOAD)
    out = root.parent / "test.deb"
    subprocess.run(
        ["dpkg-deb", "-Zxz", "--root-owner-group", "--build", str(root), str(out)],
        check=True,
        capture_output=True,
    )
    return out


def uri_for(deb: Path, digest: str | None = None) -> DebUri:
    """A DebUri for a local file, with its real MD5 unless told otherwise."""
    real = hashlib.md5(deb.read_bytes()).hexdigest()
    return DebUri(deb.as_uri(), deb.name, deb.stat().st_size, "md5", digest or real)


def test_streams_only_the_vmlinux(deb: Path, tmp_path: Path) -> None:
    """The vmlinux member lands byte for byte; nothing else is written."""
    dest = tmp_path / "cache" / f"vmlinux-{RELEASE}"
    assert download_vmlinux(uri_for(deb), vmlinux_member(RELEASE), dest, print) == dest
    assert dest.read_bytes() == PAYLOAD
    assert [p.name for p in dest.parent.iterdir()] == [dest.name]


def test_hash_mismatch_leaves_nothing(deb: Path, tmp_path: Path) -> None:
    """A download that does not hash to apt's value is refused and removed."""
    dest = tmp_path / f"vmlinux-{RELEASE}"
    with pytest.raises(TracekitError, match="does not match"):
        download_vmlinux(uri_for(deb, "0" * 32), vmlinux_member(RELEASE), dest, print)
    assert list(tmp_path.iterdir()) == []


def test_missing_member_is_an_error(deb: Path, tmp_path: Path) -> None:
    """A package without the expected vmlinux says so."""
    with pytest.raises(TracekitError, match="holds no"):
        download_vmlinux(uri_for(deb), vmlinux_member("5.10.0-1-arm64"), tmp_path / "v", print)
    assert list(tmp_path.iterdir()) == []


def test_not_a_deb(tmp_path: Path) -> None:
    """Anything without the ar magic is refused."""
    junk = tmp_path / "junk.deb"
    junk.write_bytes(b"<html>proxy error</html>")
    with pytest.raises(TracekitError, match=r"not a \.deb"):
        download_vmlinux(uri_for(junk), vmlinux_member(RELEASE), tmp_path / "v", print)


def test_print_uris_line() -> None:
    """apt's --print-uris line (as bookworm's apt prints it) gives URL, size and hash."""
    line = (
        "'http://deb.debian.org/debian/pool/main/l/linux/linux-image-6.1.0-50-arm64-dbg_"
        "6.1.176-1_arm64.deb' linux-image-6.1.0-50-arm64-dbg_6.1.176-1_arm64.deb 800336016 "
        "MD5Sum:1003ec18ab80592f51645dc3bea1c6bc"
    )
    uri = parse_print_uris(f"Reading package lists...\n{line}\n", "linux-image-6.1.0-50-arm64-dbg")
    assert (uri.size, uri.hash_name, uri.hash_hex) == (
        800336016,
        "md5",
        "1003ec18ab80592f51645dc3bea1c6bc",
    )
    with pytest.raises(TracekitError, match="did not list"):
        parse_print_uris("Reading package lists...\n", "linux-image-6.1.0-50-arm64-dbg")
