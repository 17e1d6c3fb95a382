"""One event type's rows -> their FtraceEvent payloads, encoded column by column.

The EventPlan (events.py) decides the message; here each column becomes one protobuf
field for all rows at once (tracekit/perfetto/wire.py). A row whose value does not fit
its dedicated field (a negative number in a uint32), or a print that is not atrace text,
is written generic, like the per-row path did, so nothing recorded is altered.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
from google.protobuf.descriptor import FieldDescriptor

from tracekit.perfetto import wire
from tracekit.perfetto.events import EventPlan, is_atrace
from tracekit.perfetto.protos import FtraceEvent, GenericFtraceEvent
from tracekit.perfetto.wire import Ints, Piece, TableTexts, Texts

Intern = Callable[[int], int]
Mask = npt.NDArray[np.bool_]
# One dedicated field of every row: (proto field number, ints or texts, present).
Column = tuple[int, "npt.NDArray[np.int64] | Texts", Mask]

_GENERIC = FtraceEvent.DESCRIPTOR.fields_by_name["generic"].number
_FIELD = GenericFtraceEvent.Field.DESCRIPTOR.fields_by_name
_T = FieldDescriptor
# Value ranges of the varint field types (what the protobuf library accepts).
_RANGES = {
    _T.TYPE_UINT32: (0, 2**32 - 1),
    _T.TYPE_INT32: (-(2**31), 2**31 - 1),
    _T.TYPE_ENUM: (-(2**31), 2**31 - 1),
    _T.TYPE_UINT64: (0, 2**64 - 1),
    _T.TYPE_INT64: (-(2**63), 2**63 - 1),
}


def encode_rows(
    table: pl.DataFrame, plan: EventPlan, intern: Intern | None, texts: TableTexts | None = None
) -> Piece:
    """Each row's FtraceEvent event field (dedicated message or generic), in row order.
    TEXTS: the table's text columns, coded (coded here when not given)."""
    n = table.height
    texts = texts or TableTexts(table)
    if plan.dedicated is None:
        return _generic(table, plan, texts)
    columns, fits = _dedicated(table, plan, intern, texts)
    if plan.text_column is not None:
        fits &= _atrace(table[plan.columns[plan.text_column]], texts)
    number = FtraceEvent.DESCRIPTOR.fields_by_name[plan.dedicated].number
    if fits.all():
        return wire.message(number, _pieces(columns, None, n))
    good, rest = np.flatnonzero(fits), np.flatnonzero(~fits)
    dedicated = wire.message(number, _pieces(columns, good, good.size))
    generic = _generic(table[rest], plan, texts.pick(rest, table[rest]))
    return wire.interleave(n, [(good, dedicated), (rest, generic)])


def symbol_column(plan: EventPlan) -> str | None:
    """The column whose addresses the plan writes as interned kernel symbols, if any."""
    for index, proto_name, _ in plan.setters:
        if proto_name == plan.symbol_field:
            return plan.columns[index]
    return None


def _dedicated(
    table: pl.DataFrame, plan: EventPlan, intern: Intern | None, texts: TableTexts
) -> tuple[list[Column], Mask]:
    """The dedicated message's fields of every row, and which rows' values fit it."""
    message = getattr(FtraceEvent(), plan.dedicated or "").DESCRIPTOR
    fits = np.ones(table.height, dtype=bool)
    columns: list[Column] = []
    for index, proto_name, convert in plan.setters:
        column = table[plan.columns[index]]
        proto = message.fields_by_name[proto_name]
        present = _present(column)
        if proto.type == _T.TYPE_STRING:
            columns.append((proto.number, texts(plan.columns[index]), present))
            continue
        symbols = intern if proto_name == plan.symbol_field else None
        coded = functools.partial(texts, plan.columns[index])
        values, ok = _integers(column, convert, proto, symbols, coded)
        fits &= ok | ~present
        columns.append((proto.number, values, present & ok))
    return columns, fits


def _present(column: pl.Series) -> Mask:
    """Which rows have a value."""
    if not column.null_count():
        return np.ones(column.len(), dtype=bool)
    return column.is_not_null().to_numpy()


def _pieces(columns: list[Column], rows: Ints | None, n: int) -> list[Piece]:
    """Each column's field of the N rows at ROWS (all rows if None), absent values left out."""
    parts = []
    for number, values, present in columns:
        if rows is not None:
            present = present[rows]
            values = values.pick(rows) if isinstance(values, Texts) else values[rows]
        have = np.flatnonzero(present)
        if isinstance(values, Texts):
            piece = wire.field(number, wire.texts(values.pick(have) if have.size < n else values))
        else:
            kept = values[have] if have.size < n else values
            piece = wire.varints(kept, wire.tag(number, wire.WIRE_VARINT))
        parts.append(wire.spread(piece, have, n))
    return parts or [wire.constant(b"", n)]


def _atrace(column: pl.Series, texts: TableTexts) -> Mask:
    """Which prints are atrace text (each distinct text checked once)."""
    coded = texts(column.name)
    ok = np.array([is_atrace(t.decode()) for t in coded.distinct], dtype=bool)
    return ok[coded.codes] & _present(column) if ok.size else np.zeros(column.len(), bool)


def _integers(
    column: pl.Series,
    convert: Callable[[Any], Any],
    proto: Any,
    intern: Intern | None,
    coded: Callable[[], Texts],
) -> tuple[npt.NDArray[np.int64], Mask]:
    """A column as int64 bit patterns for a varint field, and which values fit it."""
    dtype = column.dtype
    if intern is not None and dtype.is_integer():
        return _interned(column, intern), np.ones(column.len(), bool)
    if dtype == pl.Boolean or (proto.type == _T.TYPE_BOOL and dtype.is_integer()):
        return (wire.ints(column) != 0).astype(np.int64), np.ones(column.len(), bool)
    if not dtype.is_integer():  # text states, mask words: converted value by value
        return _converted(column, convert, proto, coded)
    low, high = _RANGES.get(proto.type, (-(2**63), 2**64 - 1))
    signed = wire.ints(column)
    if dtype == pl.UInt64:
        return signed, signed.view(np.uint64) <= np.uint64(high)
    if dtype.is_signed_integer() and low <= -(2**31) and high >= 2**31 - 1 and dtype != pl.Int64:
        return signed, np.ones(signed.size, bool)  # a 32-bit or narrower column fits
    return signed, (signed >= low) & (signed <= min(high, 2**63 - 1))


def _converted(
    column: pl.Series, convert: Callable[[Any], Any], proto: Any, coded: Callable[[], Texts]
) -> tuple[npt.NDArray[np.int64], Mask]:
    """Values converted one by one (text states, mask words; each distinct text once); a
    failure does not fit."""
    low, high = _RANGES.get(proto.type, (0, 1))

    def one(value: Any) -> tuple[int, bool]:
        """One value's bit pattern and whether it fits."""
        try:
            number = int(convert(value))
        except (ValueError, TypeError, OverflowError):
            return 0, False
        if not low <= number <= high:
            return 0, False
        return int(np.uint64(number % 2**64).view(np.int64)), True

    if column.dtype in (pl.String, pl.Categorical):
        texts = coded()
        done = [one(t.decode()) for t in texts.distinct]
        values = np.array([v for v, _ in done], dtype=np.int64)[texts.codes]
        ok = np.array([f for _, f in done], dtype=bool)[texts.codes]
        present = _present(column)
        return np.where(present, values, 0), ok | ~present
    out = np.zeros(column.len(), dtype=np.int64)
    ok = np.ones(column.len(), dtype=bool)
    for i, value in enumerate(column.to_list()):
        if value is not None:
            out[i], ok[i] = one(value)
    return out, ok


def _interned(column: pl.Series, intern: Intern) -> npt.NDArray[np.int64]:
    """Addresses replaced by their symbol iids (each distinct address interned once)."""
    values = wire.ints(column).view(np.uint64)
    unique, inverse = np.unique(values, return_inverse=True)
    iids = np.array([intern(int(address)) for address in unique], dtype=np.int64)
    return iids[inverse.reshape(-1)]


def _generic(table: pl.DataFrame, plan: EventPlan, texts: TableTexts) -> Piece:
    """GenericFtraceEvent of every row: its name and each non-null field."""
    n = table.height
    parts = [wire.constant(wire.len_field(1, plan.name.encode()), n)]
    for index, column_name, kind, convert in plan.generic:
        column = table[plan.columns[index]]
        have = np.flatnonzero(_present(column))
        if have.size < n:
            column = column.gather(have)
        head = wire.constant(wire.len_field(1, column_name.encode()), have.size)
        number = _FIELD[kind].number
        if kind == "str_value" and column.dtype in (pl.String, pl.Categorical):
            coded = texts(plan.columns[index])
            value = wire.field(number, wire.texts(coded if have.size == n else coded.pick(have)))
        elif kind == "str_value" and _joinable(column):
            # as events._list_text writes each list (decimal values, comma-separated),
            # joined by polars for the whole column (a Python loop costs 8x as much)
            joined = _as_list(column).cast(pl.List(pl.String)).list.join(",")
            value = wire.field(number, wire.texts(wire.text_codes(joined)))
        elif kind == "str_value":
            value = wire.field(number, wire.texts(_texts([convert(v) for v in column.to_list()])))
        else:
            value = wire.varints(wire.ints(column), wire.tag(number, wire.WIRE_VARINT))
        parts.append(wire.spread(wire.message(2, [head, value]), have, n))
    return wire.message(_GENERIC, parts)


def _joinable(column: pl.Series) -> bool:
    """A list (or fixed array) of integers without null items (syscall args): polars
    writes each value as str() does."""
    dtype = column.dtype
    if not isinstance(dtype, (pl.List, pl.Array)):
        return False
    if dtype.inner is None or not dtype.inner.is_integer():
        return False
    lists = _as_list(column)
    return bool((lists.list.drop_nulls().list.len() == lists.list.len()).all())


def _as_list(column: pl.Series) -> pl.Series:
    """A List or Array column as a List one."""
    dtype = column.dtype
    if isinstance(dtype, pl.Array):
        return column.cast(pl.List(dtype.inner))  # type: ignore[arg-type]
    return column


def _texts(values: list[str]) -> Texts:
    """Python texts as codes into their distinct values."""
    index: dict[str, int] = {}
    codes = np.array([index.setdefault(v, len(index)) for v in values], dtype=np.int64)
    return Texts(codes, [t.encode() for t in index])
