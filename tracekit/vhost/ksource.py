"""Debian's kernel source for the emulated host: fetched, unpacked, optionally patched.

The source package is the `linux` one whose version is the booted image's binary
version (the signed arm64 image is built from it). It comes through a private deb-src
apt state for the suite (the host's apt untouched), is unpacked once with dpkg-source
(Debian's own patches applied) under <cache>/vhost/kernel-src/, and a patched tree is a
hard-linked copy where only the files the series touches are real copies.
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


def source_root() -> Path:
    """Where unpacked kernel trees are cached."""
    return vhost_cache() / "kernel-src"


def pristine_tree(suite: str, version: str, progress: Progress) -> Path:
    """Debian's `linux` source at `version`, unpacked with its patches (fetched once)."""
    tree = source_root() / f"linux-{version}"
    if (tree / ".tracekit-unpacked").is_file() and not built_in(tree):
        return tree
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
    (tree / ".tracekit-unpacked").write_text(version + "\n")
    return tree


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
