"""Debian's kernel source for the emulated host: fetched, unpacked, optionally patched.

The source package is the `linux` one whose version is the booted image's binary
version (the signed arm64 image is built from it). It comes through a private deb-src
apt state for the suite (the host's apt untouched), is unpacked once with dpkg-source
(Debian's own patches applied) under <cache>/vhost/kernel-src/, and a patched tree is a
hard-linked copy where only the files the series touches are real copies. Where the
mirror has no files for the source package (trixie's and sid's 404 although their
Sources index lists them), the binary package `linux-source-X.Y` at the same version,
built from that same source, gives the same tree with Debian's patches applied
(usr/src/linux-source-X.Y.tar.xz), through the suite's private binary apt state.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.vhost import apt
from tracekit.vhost.cache import vhost_cache

Progress = Callable[[str], None]

# "+++ b/PATH" of a git-format patch: the files a patch writes.
_PATCHED_FILE = re.compile(r"^\+\+\+ b/(\S+)", re.M)


def source_state(suite: str) -> apt.AptState:
    """The suite's private deb-src state (the suite and its -updates)."""
    return apt.AptState(
        vhost_cache() / "apt" / f"{suite}-source",
        suite,
        apt.mirror_from_env(),
        source=True,
        extra_suites=(f"{suite}-updates",),
    )


def binary_state(suite: str) -> apt.AptState:
    """The suite's private binary state: the one the image's kernel packages come from."""
    return apt.AptState(vhost_cache() / "apt" / suite, suite, apt.mirror_from_env())


def source_root() -> Path:
    """Where unpacked kernel trees are cached."""
    return vhost_cache() / "kernel-src"


def linux_source_package(version: str) -> str:
    """The binary package holding the source tree: `linux-source-6.12` for 6.12.117-1."""
    upstream = version.split(":")[-1].split("-")[0]
    return "linux-source-" + ".".join(upstream.split(".")[:2])


def pristine_tree(suite: str, version: str, progress: Progress) -> Path:
    """Debian's `linux` source at `version`, its patches applied (fetched once): from the
    source package, else from the `linux-source-X.Y` binary package of that version."""
    tree = source_root() / f"linux-{version}"
    if (tree / ".tracekit-unpacked").is_file() and not built_in(tree):
        return tree
    try:
        origin = _from_source_package(suite, version, tree, progress)
    except TracekitError as source_error:
        package = linux_source_package(version)
        progress(f"kernel source: {source_error}; trying {package} {version}")
        try:
            origin = _from_binary_package(suite, version, tree, progress)
        except TracekitError as binary_error:
            raise TracekitError(
                f"no source for Debian's linux {version}: the source package: {source_error}; "
                f"{package}: {binary_error}"
            ) from None
    (tree / ".tracekit-unpacked").write_text(f"{version}\n{origin}\n")
    return tree


def _from_source_package(suite: str, version: str, tree: Path, progress: Progress) -> str:
    """Unpack the `linux` source package into `tree` with dpkg-source; say so."""
    if shutil.which("dpkg-source") is None:
        raise TracekitError("dpkg-source not found: install the 'dpkg-dev' package")
    downloads = source_root() / f"dl-{version}"
    dsc = downloads / f"linux_{version.split(':')[-1]}.dsc"
    if not dsc.is_file():
        state = source_state(suite)
        apt.check_tools(state)
        apt.update(state, progress)
        progress(f"kernel source: downloading Debian's linux {version} (~140 MB)")
        apt.download_source(state, "linux", version, downloads)
    if tree.exists():
        shutil.rmtree(tree)  # half unpacked, or built in: unpack it again
    progress(f"kernel source: unpacking linux {version} with Debian's patches")
    done = subprocess.run(
        ["nice", "-n", "19", "dpkg-source", "--no-check", "-x", str(dsc), str(tree)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise TracekitError(f"dpkg-source could not unpack {dsc.name}: {last}")
    return f"source package linux {version}"


def _from_binary_package(suite: str, version: str, tree: Path, progress: Progress) -> str:
    """Unpack `linux-source-X.Y` at `version` (its inner tarball) into `tree`; say so."""
    package = linux_source_package(version)
    downloads = source_root() / f"dl-{version}"
    deb = apt.downloaded_deb(downloads, package, version)
    if deb is None:
        state = binary_state(suite)
        apt.check_tools(state)
        apt.update(state, progress)
        progress(f"kernel source: downloading {package} {version} (~150 MB)")
        deb = apt.download_package(state, package, version, downloads)
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    progress(f"kernel source: unpacking {deb.name} (Debian's patches applied)")
    try:
        _untar_inner(deb, f"./usr/src/{package}.tar.xz", tree)
    except TracekitError:
        shutil.rmtree(tree)
        raise
    return f"binary package {package} {version}"


def _untar_inner(deb: Path, member: str, tree: Path) -> None:
    """Stream `member` (a .tar.xz inside the .deb's data) into `tree`, its top dir cut."""
    fsys = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    inner = subprocess.Popen(
        ["tar", "-xOf", "-", member], stdin=fsys.stdout, stdout=subprocess.PIPE
    )
    assert fsys.stdout is not None and inner.stdout is not None
    fsys.stdout.close()  # tar's end of the pipe only: dpkg-deb sees SIGPIPE if tar stops
    unpack = subprocess.run(
        ["nice", "-n", "19", "tar", "-xJf", "-", "--strip-components=1", "-C", str(tree)],
        stdin=inner.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    inner.stdout.close()
    codes = (fsys.wait(), inner.wait(), unpack.returncode)
    if any(codes):
        last = (unpack.stderr.strip().splitlines() or ["no output"])[-1]
        raise TracekitError(f"could not unpack {member} from {deb.name} (exit {codes}): {last}")


def built_in(tree: Path) -> bool:
    """Whether someone ran make inside `tree`: kbuild then refuses every O= build of it."""
    return (tree / ".config").exists() or (tree / "include" / "config").exists()


def series_files(series_dir: Path) -> list[Path]:
    """The patches of a series, in the order its `series` file lists them."""
    listing = series_dir / "series"
    if not listing.is_file():
        raise TracekitError(f"{series_dir} has no `series` file listing its patches")
    names = [line.strip() for line in listing.read_text().splitlines()]
    patches = [series_dir / name for name in names if name and not name.startswith("#")]
    missing = [p.name for p in patches if not p.is_file()]
    if missing:
        raise TracekitError(f"{listing} names patches that are not there: {', '.join(missing)}")
    return patches


def series_hash(patches: list[Path]) -> str:
    """A short hash of a series' contents, in order (what the release string carries)."""
    digest = hashlib.sha256()
    for patch in patches:
        digest.update(patch.read_bytes())
    return digest.hexdigest()[:8]


def touched_files(patches: list[Path]) -> list[str]:
    """Every source file the series writes."""
    found: set[str] = set()
    for patch in patches:
        found.update(_PATCHED_FILE.findall(patch.read_text()))
    return sorted(found)


def patched_tree(pristine: Path, patches: list[Path], progress: Progress) -> Path:
    """A copy of `pristine` with the series applied (hard links except where patched)."""
    tree = pristine.with_name(f"{pristine.name}+{series_hash(patches)}")
    if (tree / ".tracekit-patched").is_file() and not built_in(tree):
        return tree
    if tree.exists():
        shutil.rmtree(tree)  # half patched, or built in: patch a new copy
    progress(f"kernel source: applying {len(patches)} patches to a copy of {pristine.name}")
    tree.mkdir()
    # Builds live inside their tree (kbuild.py): never link the pristine tree's ones.
    entries = [str(e) for e in pristine.iterdir() if not e.name.startswith("build-")]
    subprocess.run(["cp", "-al", *entries, str(tree)], check=True)
    for relative in touched_files(patches):
        # Break the hard link first: patch must not write through to the pristine tree.
        path = tree / relative
        if path.is_file():
            data = path.read_bytes()
            path.unlink()
            path.write_bytes(data)
    for patch in patches:
        done = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "-i", str(patch.resolve())],
            cwd=tree,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            shutil.rmtree(tree)
            output = (done.stdout + done.stderr).strip().splitlines()
            last = (output or ["no output"])[-1]
            raise TracekitError(f"{patch.name} does not apply to {pristine.name}: {last}")
    (tree / ".tracekit-patched").write_text("\n".join(p.name for p in patches) + "\n")
    return tree
