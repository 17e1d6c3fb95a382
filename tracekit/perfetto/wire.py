"""Protobuf wire encoding of whole columns at once (numpy), one byte string per row.

A `Rows` is every row's encoding laid end to end (`data`) with each row's byte count
(`lengths`); a row of length 0 has nothing (an absent optional field). Fields are built
per column, joined per row, wrapped as sub-messages, reordered and cut, all as array
operations: no protobuf message object is made per event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl

WIRE_VARINT = 0
WIRE_LEN = 2

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]


@dataclass
class Rows:
    """Per-row encodings, end to end, with each row's length."""

    data: Bytes
    lengths: Ints

    @property
    def starts(self) -> Ints:
        """Where each row begins in `data`."""
        return np.cumsum(self.lengths) - self.lengths

    def row(self, i: int) -> bytes:
        """One row's bytes."""
        start = int(self.starts[i])
        return self.data[start : start + int(self.lengths[i])].tobytes()


def tag(number: int, wire: int) -> bytes:
    """A field's key bytes."""
    return varint_bytes((number << 3) | wire)


def varint_bytes(value: int) -> bytes:
    """One non-negative integer as a varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def varints(values: npt.NDArray[np.generic], prefix: bytes = b"") -> Rows:
    """Each value as a varint after PREFIX (e.g. its field's tag); negative int64 as its
    10-byte two's complement, as protobuf writes int32/int64."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    size = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        size += v >= np.uint64(1 << (7 * k))
    lengths = size + len(prefix)
    data = np.empty(int(lengths.sum()), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    for j, byte in enumerate(prefix):
        data[starts + j] = byte
    body = starts + len(prefix)
    for k in range(int(size.max(initial=0))):
        has = size > k
        part = (v[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (size[has] > k + 1).astype(np.uint64) << np.uint64(7)
        data[body[has] + k] = (part | more).astype(np.uint8)
    return Rows(data, lengths)


def constant(payload: bytes, n: int) -> Rows:
    """The same bytes on each of N rows."""
    data = np.frombuffer(payload * n, dtype=np.uint8) if n else np.empty(0, np.uint8)
    return Rows(data, np.full(n, len(payload), dtype=np.int64))


def texts(values: Sequence[str | None]) -> Rows:
    """Each text as its UTF-8 bytes (None: nothing)."""
    encoded = [b"" if v is None else v.encode() for v in values]
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return Rows(data, np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))


def text_column(column: pl.Series) -> Rows:
    """A text column's values as UTF-8 bytes (null: nothing), each distinct text encoded
    once: a trace's comms and names repeat."""
    filled = column.cast(pl.String).fill_null("")
    codes = (filled.rank("dense") - 1).cast(pl.Int64).to_numpy()
    distinct = filled.unique().sort()
    return take(texts(distinct.to_list()), codes)


def join(parts: Sequence[Rows]) -> Rows:
    """Row i of the result is row i of each part, in order."""
    lengths = np.sum([p.lengths for p in parts], axis=0, dtype=np.int64)
    data = np.empty(int(lengths.sum()), dtype=np.uint8)
    at = np.cumsum(lengths) - lengths
    for part in parts:
        if part.data.size:
            shift = np.repeat(at - part.starts, part.lengths)
            data[shift + _counting(part.data.size)] = part.data
        at = at + part.lengths
    return Rows(data, lengths)


def message(
    number: int, parts: Sequence[Rows], present: npt.NDArray[np.bool_] | None = None
) -> Rows:
    """Each row's PARTS joined as the body of length-delimited field NUMBER (one pass);
    rows where PRESENT is false get no field."""
    inner = np.sum([p.lengths for p in parts], axis=0, dtype=np.int64)
    out = join([varints(inner, tag(number, WIRE_LEN)), *parts])
    if present is not None and not present.all():
        out = take(out, np.arange(inner.size), present)
    return out


def cut(rows: Rows, start: int, stop: int) -> Rows:
    """Rows start..stop-1, without copying their bytes."""
    starts = rows.starts
    first = int(starts[start]) if start < rows.lengths.size else int(rows.data.size)
    last = int(starts[stop - 1] + rows.lengths[stop - 1]) if stop > start else first
    return Rows(rows.data[first:last], rows.lengths[start:stop])


_COUNT = np.arange(1 << 20, dtype=np.int64)


def _counting(n: int) -> npt.NDArray[np.int64]:
    """0..n-1, from a cached range grown when needed (made once, not per call)."""
    global _COUNT
    if n > _COUNT.size:
        _COUNT = np.arange(max(n, 2 * _COUNT.size), dtype=np.int64)
    return _COUNT[:n]


def take(
    rows: Rows, order: npt.NDArray[np.integer], keep: npt.NDArray[np.bool_] | None = None
) -> Rows:
    """Rows in ORDER (indices), those where KEEP is false emptied."""
    lengths = rows.lengths[order]
    if keep is not None:
        lengths = np.where(keep, lengths, 0)
    src = rows.starts[order]
    dst = np.cumsum(lengths) - lengths
    index = np.repeat(src - dst, lengths) + _counting(int(lengths.sum()))
    return Rows(rows.data[index], lengths)


def field(
    number: int, value: Rows, wire: int, present: npt.NDArray[np.bool_] | None = None
) -> Rows:
    """Each row's value as field NUMBER (length-delimited values get their length);
    rows where PRESENT is false get no field."""
    if wire == WIRE_LEN:
        out = join([varints(value.lengths, tag(number, wire)), value])
    else:
        out = join([constant(tag(number, wire), value.lengths.size), value])
    if present is not None and not present.all():
        out = take(out, np.arange(value.lengths.size), present)
    return out


def int_field(
    number: int, values: npt.NDArray[np.generic], present: npt.NDArray[np.bool_] | None = None
) -> Rows:
    """Each value as varint field NUMBER; rows where PRESENT is false get no field."""
    out = varints(values, tag(number, WIRE_VARINT))
    if present is not None and not present.all():
        out = take(out, np.arange(out.lengths.size), present)
    return out


def concat(parts: Sequence[Rows]) -> Rows:
    """The rows of several Rows one after another."""
    return Rows(
        np.concatenate([p.data for p in parts]) if parts else np.empty(0, np.uint8),
        np.concatenate([p.lengths for p in parts]) if parts else np.empty(0, np.int64),
    )


def packed(number: int, values: npt.NDArray[np.generic]) -> bytes:
    """A packed repeated varint field (one field holding every value)."""
    body = varints(values).data.tobytes()
    return tag(number, WIRE_LEN) + varint_bytes(len(body)) + body
