"""Where the emulated host's downloads and images live: outside the repo, per user."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "TRACEKIT_CACHE"


def cache_root() -> Path:
    """tracekit's cache root: $TRACEKIT_CACHE, else $XDG_CACHE_HOME/tracekit, else ~/.cache."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tracekit"


def vhost_cache() -> Path:
    """The emulated host's part of the cache (apt state, images)."""
    return cache_root() / "vhost"
