"""The bundles a report is about: bundle directories, or directories that hold bundles.

A campaign's output is a directory of bundles (each a subdirectory with manifest.json,
possibly nested); it is taken as a whole, in sorted path order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tracekit.bundle import MANIFEST
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData, load_bundle


def find_bundles(path: Path) -> list[Path]:
    """The bundle directories at or under `path` (a bundle's own runs are not searched)."""
    if not path.exists():
        raise TracekitError(f"{path}: no such file or directory; name a bundle directory")
    if not path.is_dir():
        raise TracekitError(
            f"{path} is not a directory; name a bundle (a directory with {MANIFEST})"
        )
    if (path / MANIFEST).is_file():
        return [path]
    found = sorted(m.parent for m in path.rglob(MANIFEST))
    bundles = [b for b in found if not any(o in b.parents for o in found)]
    if not bundles:
        raise TracekitError(
            f"{path} holds no tracekit bundle (no {MANIFEST} in it or below it);"
            " name the directory `tracekit collect -o` wrote"
        )
    return bundles


def load_bundles(
    paths: list[Path], progress: Callable[[str], None] | None = None, verify: bool = False
) -> list[BundleData]:
    """Load every bundle named or found under the paths, each once (`verify`: hash all)."""
    dirs = list(dict.fromkeys(d.resolve() for p in paths for d in find_bundles(p)))
    loaded = []
    for n, bundle in enumerate(dirs, 1):
        if progress is not None:
            progress(f"report: loading bundle {n}/{len(dirs)} {bundle}")
        loaded.append(load_bundle(bundle, verify=verify))
    return loaded
