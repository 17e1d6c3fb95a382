"""Fetch the debug vmlinux of a Debian arm64 kernel, streaming only that one file.

Debian ships it in linux-image-<release>-dbg (about 800 MB). The package is resolved
through the same private apt state the emulated host uses (tracekit.vhost.apt), so the
version matches the kernel it boots; then the .deb is streamed from the mirror
(ar -> data.tar.xz -> usr/lib/debug/boot/vmlinux-<release>) and only the vmlinux is
written, under the cache. The whole stream is hashed against apt's recorded hash before the file
is moved into place, so a truncated or tampered download never lands in the cache.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tracekit.errors import TracekitError
from tracekit.vhost import apt
from tracekit.vhost.cache import cache_root, vhost_cache
from tracekit.vhost.kernels import parse_kernel_spec

AR_MAGIC = b"!<arch>\n"
AR_HEADER_SIZE = 60
CHUNK = 1 << 20
# `apt-get --print-uris install` prints: 'URL' FILENAME SIZE HASHTYPE:HEX (apt picks the
# hash type it prints: bookworm's apt shows MD5Sum even when the lists carry SHA256).
_URI_LINE = re.compile(r"^'(\S+)' (\S+) (\d+) (MD5Sum|SHA1|SHA256|SHA512):([0-9a-f]+)$")
# The versioned image a kernel metapackage depends on: linux-image-6.1.0-50-arm64.
_IMAGE_PACKAGE = re.compile(r"^linux-image-(\d+\.\d+\.\d+-\d+-[\w-]+?)(-unsigned)?$")
_HASHLIB_NAMES = {"MD5Sum": "md5", "SHA1": "sha1", "SHA256": "sha256", "SHA512": "sha512"}


@dataclass(frozen=True)
class DebUri:
    """Where apt would download one .deb from, and what it must hash to."""

    url: str
    filename: str
    size: int
    hash_name: str  # a hashlib name: md5, sha256, ...
    hash_hex: str


def symbols_cache() -> Path:
    """The symbols part of tracekit's cache (vmlinux files, parsed-result JSON)."""
    return cache_root() / "symbols"


def dbg_package(release: str) -> str:
    """The Debian package holding the debug vmlinux of a kernel release, e.g. 6.1.0-50-arm64."""
    return f"linux-image-{release}-dbg"


def vmlinux_member(release: str) -> str:
    """The path of the debug vmlinux inside the -dbg package's data tarball."""
    return f"usr/lib/debug/boot/vmlinux-{release}"


def parse_print_uris(output: str, package: str) -> DebUri:
    """The URI line of `package` in `apt-get --print-uris` output."""
    for line in output.splitlines():
        match = _URI_LINE.match(line.strip())
        if match and match.group(2).startswith(f"{package}_"):
            url, filename, size, kind, digest = match.groups()
            return DebUri(url, filename, int(size), _HASHLIB_NAMES[kind], digest)
    raise TracekitError(
        f"apt did not list a download for {package}; it may already be gone from the mirror "
        f"(check ${apt.MIRROR_ENV}) or the package name is wrong"
    )


def locate(suite: str, release: str, progress: apt.Progress) -> DebUri:
    """Resolve the -dbg package through the emulated host's private apt state."""
    state = apt.AptState(vhost_cache() / "apt" / suite, suite, apt.mirror_from_env())
    apt.check_tools(state)
    apt.update(state, progress)
    package = dbg_package(release)
    apt.resolve(state, [package])  # one clear error if the suite lacks the package
    argv = ["apt-get", "-q", *apt.apt_options(state), "--print-uris", "-y", "install", package]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TracekitError(f"apt-get --print-uris {package} failed: {done.stderr.strip()}")
    return parse_print_uris(done.stdout, package)


class _HashingReader:
    """A read-only stream that hashes every byte that passes through it."""

    def __init__(self, raw: BinaryIO, hash_name: str) -> None:
        self.raw = raw
        self.digest = hashlib.new(hash_name)
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        """Read and hash up to `size` bytes."""
        data = self.raw.read(size)
        self.digest.update(data)
        self.count += len(data)
        return data

    def drain(self) -> None:
        """Read (and hash) the rest of the stream."""
        while self.read(CHUNK):
            pass


class _Limited:
    """A view of the next `size` bytes of a stream (one ar member)."""

    def __init__(self, raw: _HashingReader, size: int) -> None:
        self.raw = raw
        self.left = size

    def read(self, size: int = -1) -> bytes:
        """Read at most the bytes left in this member."""
        if size < 0 or size > self.left:
            size = self.left
        data = self.raw.read(size)
        self.left -= len(data)
        return data


def _read_exact(stream: _HashingReader, size: int) -> bytes:
    """Read exactly `size` bytes or fail: a short read is a truncated .deb."""
    data = stream.read(size)
    if len(data) != size:
        raise TracekitError("the .deb stream ended early (truncated download); try again")
    return data


def _next_ar_member(stream: _HashingReader) -> tuple[str, int] | None:
    """Read one ar member header: its name and size, or None at the end."""
    header = stream.read(AR_HEADER_SIZE)
    if not header:
        return None
    if len(header) != AR_HEADER_SIZE or header[58:60] != b"`\n":
        raise TracekitError("the .deb is not a valid ar archive (bad member header)")
    name = header[:16].decode("ascii").strip().rstrip("/")
    return name, int(header[48:58].decode("ascii").strip())


def extract_member(stream: _HashingReader, member: str, out: Path) -> bool:
    """Stream a .deb, writing `member` of its data.tar.xz to `out`; True if found."""
    if _read_exact(stream, len(AR_MAGIC)) != AR_MAGIC:
        raise TracekitError("the download is not a .deb (no ar magic)")
    while (entry := _next_ar_member(stream)) is not None:
        name, size = entry
        body = _Limited(stream, size)
        if name.startswith("data.tar"):
            return _extract_from_tar(body, name, member, out)
        _read_exact(stream, size + (size & 1))  # ar pads members to even sizes
    return False


def _extract_from_tar(body: _Limited, name: str, member: str, out: Path) -> bool:
    """Walk a streamed data.tar.* for `member`; write it to `out` when met."""
    mode = {"data.tar.xz": "r|xz", "data.tar.gz": "r|gz", "data.tar": "r|"}.get(name)
    if mode is None:
        raise TracekitError(f"the .deb's {name} uses a compression tracekit cannot stream")
    with tarfile.open(fileobj=body, mode=mode) as tar:  # type: ignore[call-overload]
        for info in tar:
            if info.name.lstrip("./") != member:
                continue
            source = tar.extractfile(info)
            if source is None:
                raise TracekitError(f"{member} in the .deb is not a regular file")
            with out.open("wb") as sink:
                shutil.copyfileobj(source, sink, CHUNK)
            return True
    return False


def _stream_member(uri: DebUri, member: str, out: Path) -> tuple[bool, _HashingReader]:
    """Read the whole .deb at `uri`, writing `member` to `out` on the way."""
    try:
        with urllib.request.urlopen(uri.url, timeout=60) as response:
            stream = _HashingReader(response, uri.hash_name)
            found = extract_member(stream, member, out)
            stream.drain()
    except (OSError, EOFError, tarfile.TarError) as exc:
        raise TracekitError(f"download of {uri.url} failed: {exc}; try again") from None
    return found, stream


def download_vmlinux(uri: DebUri, member: str, dest: Path, progress: apt.Progress) -> Path:
    """Stream the .deb at `uri`, keep only `member` as `dest`, once apt's hash checks out."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    progress(f"symbols: streaming {member} out of {uri.filename} ({uri.size >> 20} MiB)")
    try:
        found, stream = _stream_member(uri, member, partial)
    except BaseException:
        partial.unlink(missing_ok=True)  # never leave half a vmlinux in the cache
        raise
    if stream.digest.hexdigest() != uri.hash_hex or stream.count != uri.size:
        partial.unlink(missing_ok=True)
        raise TracekitError(f"{uri.filename} does not match apt's size and hash; try again")
    if not found:
        partial.unlink(missing_ok=True)
        raise TracekitError(f"{uri.filename} holds no {member}; is it a kernel -dbg package?")
    partial.rename(dest)
    return dest


def current_release(suite: str, progress: apt.Progress) -> str:
    """The kernel release the emulated host boots for `suite`, e.g. 6.1.0-50-arm64."""
    spec = parse_kernel_spec(suite)
    state = apt.AptState(vhost_cache() / "apt" / spec.suite, spec.suite, apt.mirror_from_env())
    apt.check_tools(state)
    apt.update(state, progress)
    for package in apt.resolve(state, [spec.info.metapackage]):
        match = _IMAGE_PACKAGE.match(package.name)
        if match:
            return match.group(1)
    raise TracekitError(f"{spec.info.metapackage} in {suite} depends on no versioned image")


def fetch_debug_vmlinux(suite: str, release: str, progress: apt.Progress) -> Path:
    """The cached debug vmlinux of `release` (e.g. 6.1.0-50-arm64), fetched when missing."""
    dest = symbols_cache() / "vmlinux" / suite / f"vmlinux-{release}"
    if dest.is_file():
        return dest
    uri = locate(suite, release, progress)
    return download_vmlinux(uri, vmlinux_member(release), dest, progress)
