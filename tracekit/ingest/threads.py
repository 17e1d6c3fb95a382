"""Per-CPU work spread over the machine's cores.

The heavy parts of a binary decode (zstd/zlib inflation, numpy gathers and arithmetic
on big arrays) release the GIL, so threads share the work without copying data between
processes. Results come back in the input's order; the first exception (in input order)
is re-raised, and items not started yet are cancelled then, also on Ctrl-C.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_threads(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """fn over items, on up to one thread per usable CPU (inline for one item or one CPU)."""
    items = list(items)
    workers = min(len(items), _usable_cpus())
    if workers <= 1:
        return [fn(item) for item in items]
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        return list(pool.map(fn, items))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # nothing left on success


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: taskset, cgroups cpusets)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
