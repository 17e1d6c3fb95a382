"""The fixtures of the tests on this machine's real tracefs (skipped without root/tracefs)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracekit.host.cleanup import CleanupStack
from tracekit.host.tracefs import Tracefs, snapshot


def tracefs_unusable() -> str | None:
    """Why the real-tracefs tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (tracefs)"
    if "tracefs" not in Path("/proc/filesystems").read_text():
        return "this kernel has no tracefs"
    return None


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    """tracefs mounted for the whole module (and unmounted after, if it was not)."""
    reason = tracefs_unusable()
    if reason:
        pytest.skip(reason)
    with CleanupStack() as stack:
        yield Tracefs.open(stack).root


@pytest.fixture
def unchanged(root: Path) -> Iterator[dict[str, object]]:
    """Assert that the test leaves every tracefs setting as it found it."""
    before = snapshot(root)
    yield before
    assert snapshot(root) == before
