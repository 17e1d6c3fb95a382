"""A polars Binary column over byte buffers the caller filled, without copying them again.

polars 2 has no public constructor from buffers, but it imports any object that offers
the Arrow C data interface (`__arrow_c_array__`, the PyCapsule protocol) and keeps the
producer's buffers as they are. polars' own string layout is BinaryView: 16 bytes a
value, a short value inline, a longer one as its length, first 4 bytes, buffer and
offset. Those views are built here with numpy, over copies of the ring buffer's spans
that hold the strings, so the long strings of a trace (2 KB trace_marker prints) are
copied once, span by span in a few large copies, with no Python object per string (a
bytes object each, then a Binary column from them, was two copies and half of a 1 GB
print trace's ingest). The structures are the Arrow C data interface's
(arrow.apache.org, "The Arrow C data interface"), declared with ctypes: no dependency
beyond the standard library.

The same interface gives a List column of all-empty lists (function_graph's `args[]`
without funcgraph-args) whose offsets, all 0, are a fresh anonymous mapping nobody
writes: no memory until something does (empty_lists).

The buffers live until polars drops the last column sharing them (a gather or filter of
the column shares them too) and calls the array's release callback, which lets them go. That
callback runs in the thread that drops it and takes the GIL there, as polars' own Python
callbacks do from its worker threads (polars releases the GIL while it computes).
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Any

import numpy as np
import polars as pl

from tracekit.ingest import membuf


class _Schema(ctypes.Structure):
    """struct ArrowSchema."""


class _Array(ctypes.Structure):
    """struct ArrowArray."""


_SchemaRelease = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Schema))
_ArrayRelease = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Array))
_Schema._fields_ = [
    ("format", ctypes.c_char_p), ("name", ctypes.c_char_p), ("metadata", ctypes.c_char_p),
    ("flags", ctypes.c_int64), ("n_children", ctypes.c_int64), ("children", ctypes.c_void_p),
    ("dictionary", ctypes.c_void_p), ("release", _SchemaRelease), ("private_data", ctypes.c_void_p),
]  # fmt: skip
_Array._fields_ = [
    ("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64), ("buffers", ctypes.c_void_p),
    ("children", ctypes.c_void_p), ("dictionary", ctypes.c_void_p), ("release", _ArrayRelease),
    ("private_data", ctypes.c_void_p),
]  # fmt: skip

BINARY_VIEW = b"vz"  # the format string of a BinaryView array
NULLABLE = 2  # ARROW_FLAG_NULLABLE
INLINE = 12  # a view holds a value of up to 12 bytes itself, else its prefix and place

# What each exported array keeps alive (its bytes, offsets, buffer table and structs),
# by the key in its private_data, until polars releases it.
_alive: dict[int, tuple[Any, ...]] = {}
_keys = itertools.count(1)


@_SchemaRelease
def _release_schema(schema: Any) -> None:
    """polars has read the schema: mark it released (nothing of ours to free)."""
    schema.contents.release = _SchemaRelease()


@_ArrayRelease
def _release_array(array: Any, alive: dict[int, tuple[Any, ...]] = _alive) -> None:
    """polars is done with the buffers: let them go, mark the array released (`alive`
    bound here: at interpreter exit the module's globals may be gone first)."""
    alive.pop(array.contents.private_data or 0, None)
    array.contents.release = _ArrayRelease()


# The callbacks' C thunks must outlive every column, those freed at interpreter exit
# included: one reference more, never given back.
for _callback in (_release_schema, _release_array):
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_callback))


_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class _Export:
    """One BinaryView array, offered to polars once through `__arrow_c_array__`."""

    def __init__(self, views: np.ndarray, data: list[np.ndarray]) -> None:
        self.views, self.data = views, data
        self.sizes = np.array([len(d) for d in data], np.int64)
        self.key = next(_keys)

    def __arrow_c_array__(self, requested_schema: object = None) -> tuple[object, object]:
        """The (schema, array) capsules; polars moves the structs out and later releases."""
        # validity (none), the views, each data buffer, then the data buffers' sizes
        ptrs = [None, self.views.ctypes.data, *(d.ctypes.data for d in self.data)]
        ptrs.append(self.sizes.ctypes.data)
        buffers = (ctypes.c_void_p * len(ptrs))(*ptrs)
        schema = _Schema(BINARY_VIEW, b"", None, NULLABLE, 0, None, None, _release_schema, None)
        array = _Array(
            len(self.views), 0, 0, len(ptrs), 0, ctypes.cast(buffers, ctypes.c_void_p), None,
            None, _release_array, self.key,
        )  # fmt: skip
        _alive[self.key] = (self.views, self.data, self.sizes, buffers, schema, array)
        return (
            _capsule(ctypes.addressof(schema), b"arrow_schema", None),
            _capsule(ctypes.addressof(array), b"arrow_array", None),
        )


def view_column(buf: np.ndarray, start: np.ndarray, length: np.ndarray, data: list[np.ndarray],
                data_of: np.ndarray, data_at: np.ndarray) -> pl.Series:  # fmt: skip
    """A Binary column whose value i is buf[start[i]:start[i] + length[i]], held as bytes
    data[data_of[i]][data_at[i]:...] (copies the caller made of buf's spans): its views
    (16 bytes a value) are built here with numpy, the bytes are not copied again."""
    n = len(start)
    views = np.zeros((n, 4), np.uint32)
    views[:, 0] = length
    raw = views.view(np.uint8)
    short = length <= INLINE
    inline = np.flatnonzero(short)
    if len(inline):  # the value itself, zero-padded, in the view's last 12 bytes
        at = start[inline, None] + np.arange(INLINE)
        keep = np.arange(INLINE) < length[inline, None]
        raw[inline, 4:] = np.where(keep, buf[np.minimum(at, len(buf) - 1)], 0)
    longer = np.flatnonzero(~short)
    if len(longer):
        prefix = buf[start[longer, None] + np.arange(4)]
        raw[longer, 4:8] = prefix
        views[longer, 2] = data_of[longer]
        views[longer, 3] = data_at[longer]
    export = _Export(views, data)
    try:
        return pl.Series(export)
    except BaseException:
        _alive.pop(export.key, None)  # not imported: nothing will release it
        raise


# Arrow format strings of the integer types a list of a trace's field holds.
INT_FORMATS = {
    np.dtype(np.int8): b"c", np.dtype(np.uint8): b"C", np.dtype(np.int16): b"s",
    np.dtype(np.uint16): b"S", np.dtype(np.int32): b"i", np.dtype(np.uint32): b"I",
    np.dtype(np.int64): b"l", np.dtype(np.uint64): b"L",
}  # fmt: skip
LARGE_LIST = b"+L"  # polars' List is Arrow's large list: 64-bit offsets


class _EmptyLists:
    """n empty lists of one integer type, offered to polars once: their n + 1 offsets
    (all 0) are fresh anonymous memory whose pages nobody writes, so they take none
    (a gather of one empty list writes 8 bytes a row: 16 MB on 2 M funcgraph entries)."""

    def __init__(self, n: int, dtype: np.dtype) -> None:
        # A mapping of its own, not np.zeros: glibc's calloc memsets what it takes from
        # the heap (a block's 1 MB of offsets, below its raised mmap threshold).
        self.offsets = membuf.alloc(8 * (n + 1)).view(np.int64)
        self.values = np.zeros(1, dtype)  # a valid pointer for the child's (empty) data
        self.fmt = INT_FORMATS[np.dtype(dtype)]
        self.key = next(_keys)

    def __arrow_c_array__(self, requested_schema: object = None) -> tuple[object, object]:
        """The (schema, array) capsules of a large list with an empty child."""
        child_schema = _Schema(self.fmt, b"item", None, NULLABLE, 0, None, None, _release_schema,
                               None)  # fmt: skip
        child_buffers = (ctypes.c_void_p * 2)(None, self.values.ctypes.data)
        child = _Array(0, 0, 0, 2, 0, ctypes.cast(child_buffers, ctypes.c_void_p), None, None,
                       _release_array, None)  # fmt: skip
        schema_children = (ctypes.POINTER(_Schema) * 1)(ctypes.pointer(child_schema))
        array_children = (ctypes.POINTER(_Array) * 1)(ctypes.pointer(child))
        buffers = (ctypes.c_void_p * 2)(None, self.offsets.ctypes.data)
        schema = _Schema(LARGE_LIST, b"", None, NULLABLE, 1,
                         ctypes.cast(schema_children, ctypes.c_void_p), None, _release_schema,
                         None)  # fmt: skip
        array = _Array(len(self.offsets) - 1, 0, 0, 2, 1, ctypes.cast(buffers, ctypes.c_void_p),
                       ctypes.cast(array_children, ctypes.c_void_p), None, _release_array,
                       self.key)  # fmt: skip
        _alive[self.key] = (self.offsets, self.values, child_schema, child_buffers, child,
                            schema_children, array_children, buffers, schema, array)  # fmt: skip
        return (
            _capsule(ctypes.addressof(schema), b"arrow_schema", None),
            _capsule(ctypes.addressof(array), b"arrow_array", None),
        )


def empty_lists(n: int, dtype: np.dtype) -> pl.Series:
    """A List column of n empty lists of an integer dtype, whose offsets take no memory
    until something writes them (see _EmptyLists)."""
    export = _EmptyLists(n, dtype)
    try:
        return pl.Series(export)
    except BaseException:
        _alive.pop(export.key, None)
        raise
