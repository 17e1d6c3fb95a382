"""How one kernel event becomes an FtraceEvent: a dedicated Perfetto message or generic.

A dedicated message (sched_switch, irq_handler_entry, kvm_exit, ...) is used when the
event's name has one in Perfetto's FtraceEvent and every recorded field fits into it;
otherwise the event is carried as a GenericFtraceEvent with all its fields, so nothing
recorded is dropped. The plan is made once per event type, then applied to each row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from google.protobuf.descriptor import FieldDescriptor

from tracekit.perfetto.protos import FtraceEvent, GenericFtraceEvent

# Per-event columns that every typed table has before the event's own fields.
COMMON_COLUMNS = ("row", "ts", "cpu", "common_pid")
# Ingest adds `<field>_sym` (the symbol name of an address field, tracekit/ingest/
# symcols.py): derived, not recorded, and named through interned symbols here instead.
DERIVED_SUFFIX = "_sym"

# Messages never chosen by name: `generic` is the fallback itself, and `kprobe_event`
# keeps only a name and a type, so a probe's fetched arguments would be lost.
_NOT_BY_NAME = frozenset({"generic", "kprobe_event"})

# Fields whose addresses Perfetto resolves through interned kernel symbols.
SYMBOL_FIELDS: dict[str, str] = {"funcgraph_entry": "func", "funcgraph_exit": "func"}

_INT_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_ENUM,
        FieldDescriptor.TYPE_BOOL,
    }
)

_BITS: dict[Any, int] = {
    pl.Int8: 8,
    pl.UInt8: 8,
    pl.Int16: 16,
    pl.UInt16: 16,
    pl.Int32: 32,
    pl.UInt32: 32,
}

Convert = Callable[[Any], Any]
Intern = Callable[[int], int]


@dataclass
class EventPlan:
    """How rows of one event type are written: dedicated setters or generic fields."""

    name: str
    columns: list[str]
    dedicated: str | None = None
    setters: list[tuple[int, str, Convert]] = field(default_factory=list)
    generic: list[tuple[int, str, str, Convert]] = field(default_factory=list)
    message_class: Any = None
    symbol_field: str | None = None

    def build(self, values: Sequence[Any], intern: Intern | None) -> dict[str, Any]:
        """The FtraceEvent's payload for one row: {message field: message} (own fields in
        `columns` order)."""
        if self.dedicated is not None:
            try:
                return {self.dedicated: self._dedicated(values, intern)}
            except (ValueError, TypeError, OverflowError):
                # A value that does not fit the dedicated field (e.g. a negative number
                # in a uint32): this row goes generic rather than being altered.
                pass
        return {"generic": self._generic(values)}

    def _dedicated(self, values: Sequence[Any], intern: Intern | None) -> Any:
        """The dedicated message for one row."""
        kwargs = {}
        for index, proto_name, convert in self.setters:
            value = values[index]
            if value is None:
                continue
            if intern is not None and proto_name == self.symbol_field:
                value = intern(value)
            kwargs[proto_name] = convert(value)
        return self.message_class(**kwargs)

    def _generic(self, values: Sequence[Any]) -> Any:
        """A GenericFtraceEvent carrying every non-null field of one row."""
        fields = [
            GenericFtraceEvent.Field(name=column, **{kind: convert(values[index])})
            for index, column, kind, convert in self.generic
            # null: the reader had no value for this field (docs/tables.md)
            if values[index] is not None
        ]
        return GenericFtraceEvent(event_name=self.name, field=fields)


def plan_event(name: str, schema: Mapping[str, pl.DataType]) -> EventPlan:
    """Decide, once per event type, the message and the per-field conversions."""
    columns = [c for c in schema if c not in COMMON_COLUMNS and not is_derived(c, schema)]
    plan = EventPlan(name=name, columns=columns)
    plan.generic = [(i, c, *_generic_kind(schema[c])) for i, c in enumerate(columns)]
    dedicated = _dedicated_setters(name, columns, schema)
    if dedicated is not None:
        plan.dedicated = name
        plan.setters = dedicated
        plan.message_class = getattr(FtraceEvent(), name).__class__
        plan.symbol_field = SYMBOL_FIELDS.get(name)
    return plan


def is_derived(column: str, schema: Mapping[str, pl.DataType]) -> bool:
    """True for ingest's symbol-name column of an address field that the table has."""
    return column.endswith(DERIVED_SUFFIX) and column.removesuffix(DERIVED_SUFFIX) in schema


def _dedicated_setters(
    name: str, columns: list[str], schema: Mapping[str, pl.DataType]
) -> list[tuple[int, str, Convert]] | None:
    """Setters for the dedicated message, or None if some field would not fit."""
    if name in _NOT_BY_NAME or name not in FtraceEvent.DESCRIPTOR.fields_by_name:
        return None
    message = FtraceEvent.DESCRIPTOR.fields_by_name[name].message_type
    if message is None:
        return None
    setters = []
    for index, column in enumerate(columns):
        proto_name = column.removeprefix("field_")  # ingest's rename of clashing names
        proto_field = message.fields_by_name.get(proto_name)
        if proto_field is None:
            return None
        convert = _dedicated_convert(schema[column], proto_field)
        if convert is None:
            return None
        setters.append((index, proto_name, convert))
    return setters


def _dedicated_convert(dtype: pl.DataType, proto_field: FieldDescriptor) -> Convert | None:
    """The conversion from a column's values to a proto field, or None if incompatible."""
    if proto_field.is_repeated:
        return None
    if proto_field.type == FieldDescriptor.TYPE_STRING:
        return str if dtype == pl.String else None
    if proto_field.type not in _INT_TYPES:
        return None
    if proto_field.type == FieldDescriptor.TYPE_BOOL:
        return bool if dtype == pl.Boolean or dtype.is_integer() else None
    if dtype == pl.Boolean or dtype.is_integer():
        return int
    if isinstance(dtype, pl.List) and dtype.inner is not None and dtype.inner.is_integer():
        return _words_to_int(_bits_of(dtype.inner))
    return None


def _bits_of(dtype: pl.DataType) -> int:
    """Width in bits of an integer dtype (a cpumask word is the kernel's long)."""
    return _BITS.get(dtype.base_type(), 64)


def _words_to_int(bits: int) -> Convert:
    """A converter joining a list of mask words (lowest first) into one integer."""

    def convert(words: Sequence[int]) -> int:
        """Little-endian word list -> integer bitmask."""
        value = 0
        for i, word in enumerate(words):
            value |= (int(word) & ((1 << bits) - 1)) << (i * bits)
        return value

    return convert


def _generic_kind(dtype: pl.DataType) -> tuple[str, Convert]:
    """Which GenericFtraceEvent.Field value carries a column, and how to convert it."""
    if dtype == pl.Boolean:
        return "uint_value", int
    if dtype.is_integer():
        return ("int_value", int) if dtype.is_signed_integer() else ("uint_value", int)
    if isinstance(dtype, pl.List):
        return "str_value", _list_text
    return "str_value", str


def _list_text(values: Sequence[Any]) -> str:
    """A list field (array, cpumask words) as comma-separated values, order kept."""
    return ",".join(str(v) for v in values)
