"""One event type's rows -> their FtraceEvent payloads, encoded column by column.

The EventPlan (events.py) decides the message; here each column becomes one protobuf
field for all rows at once (tracekit/perfetto/wire.py). A row whose value does not fit
its dedicated field (a negative number in a uint32), or a print that is not atrace text,
is written generic, like the per-row path did, so nothing recorded is altered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
from google.protobuf.descriptor import FieldDescriptor

from tracekit.perfetto import wire
from tracekit.perfetto.events import EventPlan, is_atrace
from tracekit.perfetto.protos import FtraceEvent, GenericFtraceEvent

Intern = Callable[[int], int]
Mask = npt.NDArray[np.bool_]

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


def encode_rows(table: pl.DataFrame, plan: EventPlan, intern: Intern | None) -> wire.Rows:
    """Each row's FtraceEvent event field (dedicated message or generic), in row order."""
    n = table.height
    if plan.dedicated is None:
        return _generic(table, plan)
    body, fits = _dedicated(table, plan, intern)
    if plan.text_column is not None:
        fits &= np.array([is_atrace(t) for t in table[plan.columns[plan.text_column]]], bool)
    number = FtraceEvent.DESCRIPTOR.fields_by_name[plan.dedicated].number
    dedicated = wire.message(number, body, fits)
    if fits.all():
        return dedicated
    rest = np.flatnonzero(~fits)
    generic = _generic(table[rest], plan)
    spread = np.full(n, -1)
    spread[rest] = np.arange(rest.size)
    placed = wire.take(generic, np.maximum(spread, 0), spread >= 0) if rest.size else generic
    return wire.join([dedicated, placed])


def _dedicated(
    table: pl.DataFrame, plan: EventPlan, intern: Intern | None
) -> tuple[list[wire.Rows], Mask]:
    """The dedicated message's fields of every row, and which rows' values fit it."""
    message = getattr(FtraceEvent(), plan.dedicated or "").DESCRIPTOR
    fits = np.ones(table.height, dtype=bool)
    parts = []
    for index, proto_name, convert in plan.setters:
        column = table[plan.columns[index]]
        proto = message.fields_by_name[proto_name]
        present = column.is_not_null().to_numpy()
        if proto.type == _T.TYPE_STRING:
            parts.append(wire.field(proto.number, wire.text_column(column), 2, present))
            continue
        values, ok = _integers(
            column, convert, proto, intern if proto_name == plan.symbol_field else None
        )
        fits &= ok | ~present
        parts.append(wire.int_field(proto.number, values, present & ok))
    return parts or [wire.constant(b"", table.height)], fits


def _integers(
    column: pl.Series, convert: Callable[[Any], Any], proto: Any, intern: Intern | None
) -> tuple[npt.NDArray[np.int64], Mask]:
    """A column as int64 bit patterns for a varint field, and which values fit it."""
    dtype = column.dtype
    if intern is not None and dtype.is_integer():
        return _interned(column, intern), np.ones(column.len(), bool)
    if dtype == pl.Boolean or (proto.type == _T.TYPE_BOOL and dtype.is_integer()):
        return (column.fill_null(0).cast(pl.Int64) != 0).cast(pl.Int64).to_numpy(), np.ones(
            column.len(), bool
        )
    if not dtype.is_integer():  # text states, mask words: converted value by value
        return _converted(column, convert, proto)
    low, high = _RANGES.get(proto.type, (-(2**63), 2**64 - 1))
    filled = column.fill_null(0)
    if dtype == pl.UInt64:
        unsigned = filled.to_numpy()
        return unsigned.view(np.int64), unsigned <= np.uint64(high)
    signed = filled.cast(pl.Int64).to_numpy()
    return signed, (signed >= low) & (signed <= min(high, 2**63 - 1))


def _converted(
    column: pl.Series, convert: Callable[[Any], Any], proto: Any
) -> tuple[npt.NDArray[np.int64], Mask]:
    """Values converted one by one (text states, mask words); a failure does not fit."""
    low, high = _RANGES.get(proto.type, (0, 1))
    out = np.zeros(column.len(), dtype=np.int64)
    ok = np.ones(column.len(), dtype=bool)
    for i, value in enumerate(column.to_list()):
        if value is None:
            continue
        try:
            number = int(convert(value))
        except (ValueError, TypeError, OverflowError):
            ok[i] = False
            continue
        ok[i] = low <= number <= high
        out[i] = np.uint64(number % 2**64).view(np.int64) if ok[i] else 0
    return out, ok


def _interned(column: pl.Series, intern: Intern) -> npt.NDArray[np.int64]:
    """Addresses replaced by their symbol iids (each distinct address interned once)."""
    values = column.fill_null(0).cast(pl.UInt64).to_numpy()
    unique, inverse = np.unique(values, return_inverse=True)
    iids = np.array([intern(int(address)) for address in unique], dtype=np.int64)
    return iids[inverse]


def _generic(table: pl.DataFrame, plan: EventPlan) -> wire.Rows:
    """GenericFtraceEvent of every row: its name and each non-null field."""
    n = table.height
    name = wire.tag(1, wire.WIRE_LEN) + wire.varint_bytes(len(plan.name.encode()))
    parts = [wire.constant(name + plan.name.encode(), n)]
    for index, column_name, kind, convert in plan.generic:
        column = table[plan.columns[index]]
        present = column.is_not_null().to_numpy()
        key = column_name.encode()
        head = wire.constant(wire.tag(1, wire.WIRE_LEN) + wire.varint_bytes(len(key)) + key, n)
        number = _FIELD[kind].number
        if kind == "str_value" and column.dtype in (pl.String, pl.Categorical):
            value = wire.field(number, wire.text_column(column), wire.WIRE_LEN)
        elif kind == "str_value":
            texts = [None if v is None else convert(v) for v in column.to_list()]
            value = wire.field(number, wire.texts(texts), wire.WIRE_LEN)
        else:
            value = wire.int_field(number, _plain_ints(column))
        parts.append(wire.message(2, [head, value], present))
    return wire.message(_GENERIC, parts)


def _plain_ints(column: pl.Series) -> npt.NDArray[np.int64]:
    """An integer or boolean column as int64 bit patterns (nulls as 0: not written)."""
    filled = column.fill_null(0)
    if filled.dtype == pl.UInt64:
        return filled.to_numpy().view(np.int64)
    return filled.cast(pl.Int64).to_numpy()
