"""LAVA's own job schema for the tests: lava_common from Debian's lava-common package.

lava-common is not on PyPI. Its .deb (Debian bookworm, 45 kB, pure Python) is fetched
with `apt-get download` into the tracekit cache and unpacked there, never installed;
its one dependency, voluptuous, is in the test extras.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tracekit.vhost.cache import cache_root

PACKAGE = "lava-common"


def lava_schemas() -> ModuleType:
    """lava_common.schemas, fetched once; the test skips in one line where apt cannot."""
    root = cache_root() / "lava" / "root"
    site = root / "usr" / "lib" / "python3" / "dist-packages"
    if not (site / "lava_common" / "schemas").is_dir():
        _fetch(root)
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    import lava_common.schemas

    return lava_common.schemas


def _fetch(root: Path) -> None:
    """apt-get download lava-common and unpack it under root."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip(f"apt-get/dpkg-deb missing: {PACKAGE} (LAVA's job schema) comes from Debian")
    debs = root.parent / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(
        ["apt-get", "download", PACKAGE], cwd=debs, capture_output=True, text=True, check=False
    )
    found = sorted(debs.glob(f"{PACKAGE}_*.deb"))
    if got.returncode != 0 or not found:
        pytest.skip(f"apt-get download {PACKAGE} failed: {got.stderr.strip()[-200:]}")
    subprocess.run(["dpkg-deb", "-x", str(found[-1]), str(root)], check=True)
