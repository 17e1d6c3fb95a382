"""Per-CPU work spread over the machine's cores.

The heavy parts of a binary decode (zstd/zlib inflation, numpy gathers and arithmetic
on big arrays) release the GIL, so threads share the work without copying data between
processes. Results come back in the input's order; the first exception is re-raised.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_threads(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """fn over items, on up to one thread per CPU (inline when there is one item)."""
    items = list(items)
    workers = min(len(items), os.cpu_count() or 1)
    if workers <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))
