"""The bundles a report is about: bundle directories, directories that hold bundles, or
a results dataset (`tracekit dataset`).

A campaign's output is a directory of bundles (each a subdirectory with manifest.json,
possibly nested); it is taken as a whole, in sorted path order. A dataset gives its
bundles as tables only: the report then runs the sections that need no raw files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tracekit.bundle import find_bundles
from tracekit.ingest.bundle import BundleData, load_bundle
from tracekit.ingest.dataset import is_dataset, read_dataset


def load_bundles(
    paths: list[Path], progress: Callable[[str], None] | None = None, verify: bool = False
) -> list[BundleData]:
    """Load every bundle named or found under the paths, each once (`verify`: hash all)."""
    loaded = [b for p in paths if is_dataset(p) for b in read_dataset(p)]
    dirs = list(
        dict.fromkeys(d.resolve() for p in paths if not is_dataset(p) for d in find_bundles(p))
    )
    for n, bundle in enumerate(dirs, 1):
        if progress is not None:
            progress(f"report: loading bundle {n}/{len(dirs)} {bundle}")
        loaded.append(load_bundle(bundle, verify=verify))
    return loaded
