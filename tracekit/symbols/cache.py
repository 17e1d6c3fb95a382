"""Parsed results (symbols, offsets, hypercalls) cached as JSON, keyed by the build-id.

A vmlinux's build-id names its exact contents, so a cached answer never goes stale; the
files live under the symbols cache, never in the repo.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tracekit.symbols.fetch import symbols_cache

FORMAT = 5  # 5: hypercall tables skip the enum's range markers


def cache_file(build_id: str, kind: str) -> Path:
    """Where the `kind` results of one build-id are kept."""
    return symbols_cache() / "parsed" / build_id / f"{kind}.json"


def load(build_id: str, kind: str) -> Any | None:
    """The cached value, or None when absent, unreadable or of another format."""
    path = cache_file(build_id, kind)
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        return None
    return stored.get("value")


def store(build_id: str, kind: str, value: Any) -> None:
    """Write a value atomically (rename), so readers never see half a file."""
    path = cache_file(build_id, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps({"format": FORMAT, "value": value}))
    partial.replace(path)
