"""The bundles a report is about: bundle directories, or directories that hold bundles.

A campaign's output is a directory of bundles (each a subdirectory with manifest.json,
possibly nested); it is taken as a whole, in sorted path order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tracekit.bundle import find_bundles
from tracekit.ingest.bundle import BundleData, load_bundle


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
