"""Byte buffers whose pages can be handed back to the OS while the rest is still in use.

The ring-buffer data of a big trace is as large as the tables decoded from it. The
per-event tables are built in row order, which walks every CPU's pages from the start to
the end, so the pages behind the last row decoded are no longer needed: `release` drops
them (madvise MADV_DONTNEED) instead of keeping the whole buffer alive until the end.
That only works for memory we map ourselves (anonymous or file mappings); for any other
array `release` does nothing, which is always correct, only less frugal.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

PAGE = mmap.PAGESIZE


def alloc(nbytes: int, populate: bool = False) -> np.ndarray:
    """A writable uint8 array of nbytes backed by an anonymous mapping (releasable);
    `populate`: its pages mapped now, in one call, rather than one fault at a time."""
    if nbytes <= 0:
        return np.zeros(0, dtype=np.uint8)
    if not hasattr(mmap, "MAP_PRIVATE"):  # not a POSIX system: an ordinary array
        return np.empty(nbytes, dtype=np.uint8)
    # Private: MADV_DONTNEED then frees the pages (on a shared mapping they would stay
    # allocated in shmem, only unmapped from this process). No MADV_HUGEPAGE: with THP
    # defrag on madvise (the kernel's default) each 2 MB fault may compact memory first,
    # and on a machine up for a while that cost twice the system time of 4 kB faults
    # (benchmarks/results/ingest.txt).
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if populate:
        flags |= getattr(mmap, "MAP_POPULATE", 0)
    mapping = _Private(-1, nbytes, flags=flags)
    return np.frombuffer(mapping, dtype=np.uint8)


class _Private(mmap.mmap):
    """An anonymous mapping of alloc's: memory of this process only (a file mapping's
    bytes change, or fault, when someone rewrites or truncates the file)."""


def is_private(arr: np.ndarray) -> bool:
    """Whether arr's bytes can only change by this process: alloc's memory or bytes."""
    return isinstance(_owner(arr), (_Private, bytes))


def _owner(arr: np.ndarray) -> object:
    """The object an array's memory belongs to (numpy collapses view chains)."""
    base = arr.base
    if isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base


def _mapping(arr: np.ndarray) -> mmap.mmap | None:
    """The mmap an array's memory belongs to, or None."""
    base = _owner(arr)
    return base if isinstance(base, mmap.mmap) else None


def byte_source(arr: np.ndarray) -> tuple[mmap.mmap | bytes, int] | None:
    """The mmap or bytes a contiguous uint8 array views, and where the array starts in it
    (None: other memory). Both have find() and slicing, with no copy of the whole."""
    base = _owner(arr)
    if not isinstance(base, (mmap.mmap, bytes)) or arr.dtype != np.uint8:
        return None
    if not arr.flags.c_contiguous:
        return None
    origin = np.frombuffer(base, dtype=np.uint8).ctypes.data
    return base, arr.ctypes.data - origin


def release(arr: np.ndarray, start: int, stop: int) -> int:
    """Drop the whole pages of arr[start:stop] from memory; returns the bytes dropped.

    The caller promises never to read those bytes again: an anonymous mapping reads
    back as zeros afterwards.
    """
    mm = _mapping(arr)
    if mm is None or stop <= start or not hasattr(mm, "madvise"):
        return 0
    origin = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    first = arr.ctypes.data - origin + max(start, 0)
    last = arr.ctypes.data - origin + min(stop, len(arr))
    first = -(-first // PAGE) * PAGE  # round inwards: never touch a page still in use
    last = last // PAGE * PAGE
    if last <= first:
        return 0
    mm.madvise(mmap.MADV_DONTNEED, first, last - first)
    return last - first


def maps_file(arr: np.ndarray) -> bool:
    """Whether arr's memory is a mapping of a file (not alloc's, not the heap's)."""
    mm = _mapping(arr)
    return mm is not None and not isinstance(mm, _Private)


def drop_file_pages(arr: np.ndarray, start: int = 0, stop: int | None = None) -> int:
    """Unmap the whole pages of arr[start:stop] when arr maps a file (an uncompressed
    trace.dat): they stay in the page cache and are mapped again from it when next read,
    so the process holds only the pages it is reading (the walk, the header and the typed
    tables each read the whole ring buffer). Anonymous memory (alloc's, the decompressed
    data) would read back as zeros: it is left as it is. Returns the bytes unmapped."""
    if not maps_file(arr):
        return 0
    return release(arr, start, len(arr) if stop is None else stop)


def trim() -> None:
    """Hand the C heap's free memory back to the OS (glibc only; elsewhere a no-op).

    numpy's temporaries of a few MB come from the heap, and glibc keeps what they leave
    behind; after a big decode that is tens of MB of peak memory nobody uses.
    """
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
