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


def varints(values: npt.NDArray[np.generic]) -> Rows:
    """Each value as a varint (negative int64 as its 10-byte two's complement, as
    protobuf writes int32/int64)."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    lengths = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        lengths += v >= np.uint64(1 << (7 * k))
    data = np.empty(int(lengths.sum()), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    for k in range(int(lengths.max(initial=0))):
        has = lengths > k
        part = (v[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (lengths[has] > k + 1).astype(np.uint64) << np.uint64(7)
        data[starts[has] + k] = (part | more).astype(np.uint8)
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


def join(parts: Sequence[Rows]) -> Rows:
    """Row i of the result is row i of each part, in order."""
    lengths = np.sum([p.lengths for p in parts], axis=0, dtype=np.int64)
    data = np.empty(int(lengths.sum()), dtype=np.uint8)
    at = np.cumsum(lengths) - lengths
    for part in parts:
        if part.data.size:
            shift = np.repeat(at - part.starts, part.lengths)
            data[shift + np.arange(part.data.size)] = part.data
        at = at + part.lengths
    return Rows(data, lengths)


def take(
    rows: Rows, order: npt.NDArray[np.integer], keep: npt.NDArray[np.bool_] | None = None
) -> Rows:
    """Rows in ORDER (indices), those where KEEP is false emptied."""
    lengths = rows.lengths[order]
    if keep is not None:
        lengths = np.where(keep, lengths, 0)
    src = rows.starts[order]
    dst = np.cumsum(lengths) - lengths
    index = np.repeat(src - dst, lengths) + np.arange(int(lengths.sum()))
    return Rows(rows.data[index], lengths)


def field(
    number: int, value: Rows, wire: int, present: npt.NDArray[np.bool_] | None = None
) -> Rows:
    """Each row's value as field NUMBER (length-delimited values get their length);
    rows where PRESENT is false get no field."""
    n = value.lengths.size
    parts = [constant(tag(number, wire), n)]
    if wire == WIRE_LEN:
        parts.append(varints(value.lengths))
    parts.append(value)
    out = join(parts)
    if present is not None and not present.all():
        out = take(out, np.arange(n), present)
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
