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

# Text readers keep an event's whole field text in this column beside the parsed ones.
TEXT_FIELDS = "fields"

# Messages never chosen by name: `generic` is the fallback itself, and `kprobe_event`
# keeps only a name and a type, so a probe's fetched arguments would be lost.
_NOT_BY_NAME = frozenset({"generic", "kprobe_event"})

# Fields that trace_processor reads as interned kernel symbols (its list of kernel
# function fields): their value must be an iid on the sequence, never a raw address, or
# the importer names the slice by the number and counts a tokenizer error.
SYMBOL_FIELDS: dict[str, str] = {
    "funcgraph_entry": "func",
    "funcgraph_exit": "func",
    "hrtimer_expire_entry": "function",
    "workqueue_execute_start": "function",
    "workqueue_execute_end": "function",
    "workqueue_queue_work": "function",
    "workqueue_activate_work": "function",
    "sched_blocked_reason": "caller",
    "mm_shrink_slab_start": "shrink",
}

# sched_switch's prev_state as text (ftrace text traces) -> the kernel's bits, which
# trace_processor decodes by kernel release: 4.14+ reports TASK_REPORT values, older
# kernels (and a trace without a release, which it takes for 4.4) the full state.
_STATE_BITS = {"R": 0, "S": 1, "D": 2, "T": 4, "t": 8, "X": 16, "Z": 32}
_STATE_BITS_4_14 = {**_STATE_BITS, "P": 0x40, "I": 0x80, "+": 0x100}
_STATE_BITS_4_4 = {**_STATE_BITS, "x": 0x40, "K": 0x80, "W": 0x100, "P": 0x200, "N": 0x400,
                   "I": 0x402, "+": 0x800}  # fmt: skip

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
    text_column: int | None = None  # print's buf: dedicated only when it is atrace text

    def build(self, values: Sequence[Any], intern: Intern | None) -> dict[str, Any]:
        """The FtraceEvent's payload for one row: {message field: message} (own fields in
        `columns` order)."""
        if self.text_column is not None and not is_atrace(values[self.text_column]):
            # trace_processor parses every dedicated print as atrace text and counts
            # an import error for any other marker; generic keeps the text as an arg.
            return {"generic": self._generic(values)}
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


def plan_event(
    name: str, schema: Mapping[str, pl.DataType], release: str | None = None
) -> EventPlan:
    """Decide, once per event type, the message and the per-field conversions.

    RELEASE (the kernel's, as system info states it) decides how a text prev_state is
    written as bits."""
    columns = [c for c in schema if c not in COMMON_COLUMNS and not is_derived(c, schema)]
    plan = EventPlan(name=name, columns=columns)
    plan.generic = [(i, c, *_generic_kind(schema[c])) for i, c in enumerate(columns)]
    dedicated = _dedicated_setters(name, columns, schema, release)
    if dedicated is not None:
        plan.dedicated = name
        plan.setters = dedicated
        plan.message_class = getattr(FtraceEvent(), name).__class__
        plan.symbol_field = SYMBOL_FIELDS.get(name)
        if name == "print" and "buf" in columns:
            plan.text_column = columns.index("buf")
    return plan


def is_atrace(text: Any) -> bool:
    """Whether a print's text is atrace (B|pid|name, E, C|pid|name|value, ...) as
    trace_processor's systrace parser accepts it, or the clock-sync line it ignores."""
    if not isinstance(text, str):
        return False
    text = text.rstrip("\n\0")
    if text.startswith("trace_event_clock_sync:"):
        return True
    parts = text.split("|")
    if not parts[0]:
        return False
    phase, rest = parts[0][0], [*parts[1:], "", "", "", ""]
    if phase == "E":
        return True
    if not rest[0].isdigit():  # the tgid every other phase needs
        return False
    if phase == "H":  # the cookie is the fourth field, or the third when there is none
        return bool(rest[1]) and _is_int(rest[3] or rest[2])
    need = _ATRACE_FIELDS.get(phase)
    if need is None:
        return False
    return all(check(rest[i]) for i, check in need)


def _is_int(text: str) -> bool:
    """A decimal integer, optionally negative."""
    return text.removeprefix("-").isdigit()


def _non_empty(text: str) -> bool:
    """Any text but the empty string."""
    return bool(text)


# Per atrace phase: (field index after the tgid, check) that the importer requires.
_ATRACE_FIELDS: dict[str, tuple[tuple[int, Callable[[str], bool]], ...]] = {
    "B": (),
    "S": ((1, _non_empty), (2, _is_int)),
    "F": ((1, _non_empty), (2, _is_int)),
    "I": ((1, _non_empty),),
    "N": ((1, _non_empty), (2, _non_empty)),
    "C": ((1, _non_empty), (2, _is_int)),
    "G": ((1, _non_empty), (2, _non_empty), (3, _is_int)),
}


def is_derived(column: str, schema: Mapping[str, pl.DataType]) -> bool:
    """True for ingest's symbol-name column of an address field that the table has."""
    return column.endswith(DERIVED_SUFFIX) and column.removesuffix(DERIVED_SUFFIX) in schema


def _dedicated_setters(
    name: str, columns: list[str], schema: Mapping[str, pl.DataType], release: str | None
) -> list[tuple[int, str, Convert]] | None:
    """Setters for the dedicated message, or None if some field would not fit."""
    if name in _NOT_BY_NAME or name not in FtraceEvent.DESCRIPTOR.fields_by_name:
        return None
    message = FtraceEvent.DESCRIPTOR.fields_by_name[name].message_type
    if message is None:
        return None
    setters = []
    for index, column in enumerate(columns):
        if column == TEXT_FIELDS and schema[column] == pl.String and len(columns) > 1:
            continue  # a text reader's copy of the line the other columns were cut from
        proto_name = column.removeprefix("field_")  # ingest's rename of clashing names
        proto_field = message.fields_by_name.get(proto_name)
        if proto_field is None:
            return None
        convert = _dedicated_convert(schema[column], proto_field)
        if (name, column, schema[column]) == ("sched_switch", "prev_state", pl.String):
            convert = _state_bits(_STATE_BITS_4_14 if _at_least_4_14(release) else _STATE_BITS_4_4)
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


def _at_least_4_14(release: str | None) -> bool:
    """Whether a kernel release string (6.1.0-50-arm64) is 4.14 or later."""
    numbers = (release or "").split("-")[0].split(".")
    try:
        return (int(numbers[0]), int(numbers[1])) >= (4, 14)
    except (IndexError, ValueError):
        return False


def _state_bits(bits: Mapping[str, int]) -> Convert:
    """A converter of prev_state text (S, R+, D|K) into the kernel's bits; an unknown
    letter raises ValueError, so the row goes generic with its text."""

    def convert(text: str) -> int:
        """prev_state letters -> bitmask."""
        value = 0
        for letter in text.replace("|", ""):
            if letter not in bits:
                raise ValueError(f"prev_state letter {letter!r}")
            value |= bits[letter]
        return value

    return convert


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
    if isinstance(dtype, (pl.List, pl.Array)):  # trace.dat's fixed arrays (syscall args)
        return "str_value", _list_text
    return "str_value", str


def _list_text(values: Sequence[Any]) -> str:
    """A list field (array, cpumask words) as comma-separated values, order kept."""
    return ",".join(str(v) for v in values)
