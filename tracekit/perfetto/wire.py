"""Protobuf wire encoding of whole columns at once (numpy), each byte written once, in place.

A `Piece` is one field (or several, or a whole message) for every row: each row's byte
count now (`lengths`), its bytes later, written straight to the row's offset in the
output by `write(data, at)`. A chunk's offsets come from the lengths (one cumulative
sum), so no protobuf object is made per event and no byte is copied, joined or
reordered after it is written: the cost is a few array operations per output byte.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl

WIRE_VARINT = 0
WIRE_LEN = 2

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]
Writer = Callable[[Bytes, Ints], None]

# Texts up to this many bytes are written column by column from a padded table; longer
# ones byte by byte from one index (a padded table of long texts would be mostly padding).
_SHORT_TEXT = 32
# Up to this many rows a text column is coded in Python (faster than polars' casts).
_FEW_ROWS = 4096
# v >= _SIZE_STEPS[k] needs more than k + 1 varint bytes.
_SIZE_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


@dataclass
class Piece:
    """Per-row byte counts, and the writer of every row's bytes at given offsets."""

    lengths: Ints
    write: Writer


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


def len_field(number: int, body: bytes) -> bytes:
    """One length-delimited field: key, length, BODY."""
    return tag(number, WIRE_LEN) + varint_bytes(len(body)) + body


def varint_sizes(values: npt.NDArray[np.uint64]) -> Ints:
    """Bytes each value's varint takes (1..10)."""
    if not values.size:
        return np.zeros(0, dtype=np.int64)
    low, high = np.searchsorted(_SIZE_STEPS, [values.min(), values.max()], side="right")
    if low == high:  # most columns: one size (timestamps, small numbers)
        return np.full(values.size, int(low) + 1, dtype=np.int64)
    return np.searchsorted(_SIZE_STEPS, values, side="right").astype(np.int64) + 1


def _bits(values: npt.NDArray[np.generic]) -> npt.NDArray[np.uint64]:
    """Integers as the 64-bit patterns protobuf writes (a negative int64 takes 10 bytes)."""
    return np.asarray(values).astype(np.int64, copy=False).view(np.uint64)


def _put_columns(
    data: Bytes, at: Ints, byte_of: Callable[[int], npt.NDArray[np.uint8]], sizes: Ints
) -> None:
    """Write byte j of each row (byte_of(j)) at at + j, for the rows longer than j."""
    if not sizes.size:
        return
    shortest, longest = int(sizes.min()), int(sizes.max())
    for j in range(longest):
        column = byte_of(j)
        if j < shortest:
            data[at + j] = column
        else:
            longer = np.flatnonzero(sizes > j)
            data[at[longer] + j] = column[longer]


def put_varints(data: Bytes, at: Ints, values: npt.NDArray[np.uint64], sizes: Ints) -> None:
    """Write each value's varint (SIZES bytes) at its offset."""
    longest = int(sizes.max(initial=0))
    if values.size <= _FEW_ROWS // 8:
        _put_few_varints(data, at, values, sizes, longest)
        return

    def byte_of(j: int) -> npt.NDArray[np.uint8]:
        """The j-th varint byte of every value, with its continuation bit."""
        low = ((values >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        if j + 1 < longest:
            low |= (sizes > j + 1).astype(np.uint8) << 7
        return low

    _put_columns(data, at, byte_of, sizes)


def _put_few_varints(
    data: Bytes, at: Ints, values: npt.NDArray[np.uint64], sizes: Ints, longest: int
) -> None:
    """put_varints of a few values: every byte of every value at once, as a matrix (a
    dozen numpy calls, where byte by byte takes a dozen per byte)."""
    j = np.arange(longest, dtype=np.int64)
    low = (values[:, None] >> (np.uint64(7) * j.astype(np.uint64))) & np.uint64(0x7F)
    more = (j[None, :] + 1 < sizes[:, None]).astype(np.uint64) << np.uint64(7)
    used = j[None, :] < sizes[:, None]
    data[(at[:, None] + j)[used]] = (low | more).astype(np.uint8)[used]


def _put_constant(data: Bytes, at: Ints, payload: bytes) -> None:
    """Write the same bytes at every offset (a key of one or two bytes, mostly)."""
    if len(payload) == 1:
        data[at] = payload[0]
    elif payload:
        # One scatter of every row's bytes, not one per byte of the payload.
        ramp = np.arange(len(payload), dtype=np.int64)
        data[at[:, None] + ramp] = np.frombuffer(payload, dtype=np.uint8)


def constant(payload: bytes, n: int) -> Piece:
    """The same bytes on each of N rows."""
    lengths = np.full(n, len(payload), dtype=np.int64)
    return Piece(lengths, lambda data, at: _put_constant(data, at, payload))


def varints(values: npt.NDArray[np.generic], prefix: bytes = b"") -> Piece:
    """Each value as a varint after PREFIX (e.g. its field's key)."""
    bits = _bits(values)
    sizes = varint_sizes(bits)

    def write(data: Bytes, at: Ints) -> None:
        """PREFIX, then the varint."""
        _put_constant(data, at, prefix)
        put_varints(data, at + len(prefix), bits, sizes)

    return Piece(sizes + len(prefix), write)


def ints(column: pl.Series) -> Ints:
    """An integer or boolean column as int64 bit patterns (nulls as 0: the caller says
    which rows have a value); numpy straight from the column when it has no null."""
    filled = column.fill_null(0) if column.null_count() else column
    values = filled.to_numpy()
    if values.dtype == np.uint64:
        return values.view(np.int64)
    return values.astype(np.int64, copy=False)


@dataclass
class Texts:
    """A text column as codes into its distinct values' UTF-8 bytes."""

    codes: Ints
    distinct: list[bytes]

    def pick(self, rows: Ints) -> Texts:
        """The texts at ROWS."""
        return Texts(self.codes[rows], self.distinct)


def text_codes(column: pl.Series) -> Texts:
    """A text column (String or Categorical; null as empty) as codes and distinct texts,
    by hashing (a sort of the texts would cost more than the whole encoding)."""
    if column.len() <= _FEW_ROWS:
        return _few_text_codes(column)
    cats = column if column.dtype == pl.Categorical else column.cast(pl.String)
    if cats.null_count():
        cats = cats.cast(pl.String).fill_null("")
    physical = cats.cast(pl.Categorical).to_physical().to_numpy().astype(np.int64)
    if not physical.size:
        return Texts(physical, [])
    present = np.flatnonzero(np.bincount(physical))
    lookup = np.zeros(int(present[-1]) + 1, dtype=np.int64)
    lookup[present] = np.arange(present.size)
    some = np.empty(lookup.size, dtype=np.int64)  # a row of each distinct text (any one)
    some[physical] = np.arange(physical.size)
    distinct = cats[some[present]].cast(pl.String).to_list()
    return Texts(lookup[physical], [t.encode() for t in distinct])


def _few_text_codes(column: pl.Series) -> Texts:
    """text_codes of a short column, by a dict in Python: a few polars casts and gathers
    cost more than the rows themselves (a small trace has dozens of such columns)."""
    index: dict[str, int] = {}
    codes = [index.setdefault(t or "", len(index)) for t in column.cast(pl.String).to_list()]
    return Texts(np.array(codes, dtype=np.int64), [t.encode() for t in index])


class TableTexts:
    """A table's text columns coded on first use, each once (a chunk's encoders and its
    compact sched decisions read the same comms)."""

    def __init__(self, table: pl.DataFrame, codes: dict[str, Texts] | None = None) -> None:
        self.table = table
        self._codes = codes if codes is not None else {}

    def __call__(self, column: str) -> Texts:
        """One column's codes."""
        found = self._codes.get(column)
        if found is None:
            found = self._codes[column] = text_codes(self.table[column])
        return found

    def pick(self, rows: Ints, table: pl.DataFrame) -> TableTexts:
        """The same for TABLE, the rows ROWS of this one."""
        return TableTexts(table, {c: t.pick(rows) for c, t in self._codes.items()})


def shared(parts: Sequence[Texts]) -> list[Texts]:
    """Several coded text columns recoded into one list of distinct texts."""
    index: dict[bytes, int] = {}
    out = []
    for part in parts:
        remap = np.array([index.setdefault(t, len(index)) for t in part.distinct], np.int64)
        out.append(Texts(remap[part.codes] if remap.size else part.codes, []))
    distinct = list(index)
    return [Texts(t.codes, distinct) for t in out]


def texts(values: Texts) -> Piece:
    """Each row's text bytes (no key, no length)."""
    widths = np.fromiter(map(len, values.distinct), dtype=np.int64, count=len(values.distinct))
    lengths = widths[values.codes] if values.distinct else np.zeros(0, np.int64)
    longest = int(widths.max(initial=0))

    def write(data: Bytes, at: Ints) -> None:
        """Short texts column by column from a padded table, long ones byte by byte."""
        blob = np.frombuffer(b"".join(values.distinct), dtype=np.uint8)
        starts = np.cumsum(widths) - widths
        if longest <= _SHORT_TEXT:
            table = np.zeros((len(values.distinct), max(longest, 1)), dtype=np.uint8)
            table[np.repeat(np.arange(widths.size), widths), _ramp(widths, starts)] = blob
            rows = table[values.codes]
            _put_columns(data, at, lambda j: rows[:, j], lengths)
            return
        total = int(lengths.sum())
        ramp = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        data[np.repeat(at, lengths) + ramp] = blob[np.repeat(starts[values.codes], lengths) + ramp]

    return Piece(lengths, write)


def _ramp(widths: Ints, starts: Ints) -> Ints:
    """0..w-1 for each width, end to end (STARTS: where each begins)."""
    return np.arange(int(widths.sum()), dtype=np.int64) - np.repeat(starts, widths)


def seq(parts: Sequence[Piece]) -> Piece:
    """Row i is row i of each part, in order."""
    lengths = parts[0].lengths
    for part in parts[1:]:
        lengths = lengths + part.lengths

    def write(data: Bytes, at: Ints) -> None:
        """Each part after the one before it."""
        for part in parts:
            part.write(data, at)
            at = at + part.lengths

    return Piece(lengths, write)


def field(number: int, value: Piece) -> Piece:
    """Each row's VALUE as length-delimited field NUMBER."""
    return seq([varints(value.lengths, tag(number, WIRE_LEN)), value])


def message(number: int, parts: Sequence[Piece]) -> Piece:
    """Each row's PARTS as the body of length-delimited field NUMBER."""
    return field(number, seq(parts))


def spread(piece: Piece, rows: Ints, n: int) -> Piece:
    """A piece of some rows (ROWS of N, in order) as one of all N: nothing elsewhere."""
    if rows.size == n:
        return piece
    lengths = np.zeros(n, dtype=np.int64)
    lengths[rows] = piece.lengths
    return Piece(lengths, lambda data, at: piece.write(data, at[rows]))


def interleave(n: int, parts: Sequence[tuple[Ints, Piece]]) -> Piece:
    """N rows made of several pieces, each holding the rows at its indices."""
    lengths = np.zeros(n, dtype=np.int64)
    for rows, piece in parts:
        lengths[rows] = piece.lengths

    def write(data: Bytes, at: Ints) -> None:
        """Each piece at its rows' offsets."""
        for rows, piece in parts:
            piece.write(data, at[rows])

    return Piece(lengths, write)


def assemble(piece: Piece) -> tuple[Bytes, Ints]:
    """Every row's bytes end to end, and where each row starts (one past the end last)."""
    ends = np.cumsum(piece.lengths)
    starts = np.concatenate([[0], ends]).astype(np.int64)
    data = np.empty(int(starts[-1]), dtype=np.uint8)
    piece.write(data, starts[:-1])
    return data, starts


def packed_body(values: npt.NDArray[np.generic]) -> tuple[Bytes, Ints]:
    """Values as one run of varints (a packed field's body), and where each starts."""
    return assemble(varints(values))
