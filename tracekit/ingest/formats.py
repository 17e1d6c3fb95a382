"""Event format files (tracefs events/*/*/format, header_page, header_event) -> field specs.

The kernel describes every event's binary layout in its format file: one line per field
with the C type, byte offset, size and signedness. This module turns that text into
`FieldSpec`s that say how to decode each field and which polars dtype it becomes; it does
not decode anything itself (see columns.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from tracekit.errors import TracekitError

_FIELD_RE = re.compile(
    r"^\s*field:\s*(?P<decl>[^;]+);\s*offset:\s*(?P<offset>\d+);\s*size:\s*(?P<size>\d+);"
    r"(?:\s*signed:\s*(?P<signed>\d+);)?"
)
_ARRAY_RE = re.compile(r"^(?P<type>.*?)\s*(?P<name>\w+)\s*\[(?P<len>[^\]]*)\]$")
_NAME_RE = re.compile(r"^(?P<type>.*?)(?P<name>\w+)$")


class Kind(Enum):
    """How a field's bytes become a column value."""

    INT = "int"  # signed/unsigned integer of size 1, 2, 4 or 8
    BOOL = "bool"  # C bool
    POINTER = "pointer"  # any pointer or address: unsigned
    CONST_STR = "const_str"  # `const char *`: an address resolved through printk_formats
    CHARS = "chars"  # char name[N]: NUL-terminated string in a fixed slot
    INT_ARRAY = "int_array"  # type name[N] with N > 0 and a non-char element
    TAIL_STR = "tail_str"  # char name[]: string running to the end of the payload
    TAIL_ARRAY = "tail_array"  # type name[]: elements running to the end of the payload
    DYN_STR = "dyn_str"  # __data_loc / __rel_loc char[]
    DYN_ARRAY = "dyn_array"  # __data_loc / __rel_loc <type>[] (including cpumask_t)


@dataclass(frozen=True)
class FieldSpec:
    """One field of an event: where it is, how big, and how to decode it."""

    name: str
    ctype: str
    offset: int
    size: int
    signed: bool
    kind: Kind
    elem_size: int = 0  # element size for arrays, else the field size
    rel_loc: bool = False  # __rel_loc: the offset counts from the end of this field

    @property
    def is_common(self) -> bool:
        """True for the common_* header fields every event carries."""
        return self.name.startswith("common_")


@dataclass(frozen=True)
class EventFormat:
    """One event's format file, parsed."""

    id: int
    system: str
    name: str
    fields: tuple[FieldSpec, ...]
    print_fmt: str = ""

    @property
    def common(self) -> tuple[FieldSpec, ...]:
        """The common_* fields (type, flags, preempt count, pid)."""
        return tuple(f for f in self.fields if f.is_common)

    @property
    def own(self) -> tuple[FieldSpec, ...]:
        """The event's own fields, without the common ones."""
        return tuple(f for f in self.fields if not f.is_common)


@dataclass(frozen=True)
class HeaderPage:
    """Layout of a ring-buffer page header (events/header_page)."""

    timestamp_offset: int = 0
    timestamp_size: int = 8
    commit_offset: int = 8
    commit_size: int = 8  # the kernel's long size
    data_offset: int = 16
    data_size: int = 4080

    @property
    def page_size(self) -> int:
        """The sub-buffer size these pages have."""
        return self.data_offset + self.data_size


@dataclass(frozen=True)
class HeaderEvent:
    """Ring-buffer event header constants (events/header_event)."""

    type_len_bits: int = 5
    time_delta_bits: int = 27
    padding: int = 29
    time_extend: int = 30
    time_stamp: int = 31
    data_max_type_len: int = 28


_ID_RE = re.compile(r"^ID:\s*(\d+)", re.M)
_NAME_LINE_RE = re.compile(r"^name:\s*(\S+)", re.M)


@dataclass
class FormatSet:
    """All event formats of one trace, by id, plus the ring-buffer headers.

    A trace.dat may hold thousands of format files of which a few are used, so the
    text is kept and parsed when an event of that id is first needed.
    """

    header_page: HeaderPage = field(default_factory=HeaderPage)
    header_event: HeaderEvent = field(default_factory=HeaderEvent)
    _parsed: dict[int, EventFormat] = field(default_factory=dict)
    _pending: dict[int, tuple[str, str, str, int]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)  # id -> event name, all formats

    def add(self, fmt: EventFormat) -> None:
        """Register one parsed event format (a later one with the same id wins)."""
        self._parsed[fmt.id] = fmt
        self.names[fmt.id] = fmt.name

    def add_text(self, text: str, system: str, where: str, long_size: int = 8) -> None:
        """Register a format file's text, to be parsed when its id is first used."""
        m, n = _ID_RE.search(text), _NAME_LINE_RE.search(text)
        if not m or not n:
            checked_format(text, system, where, long_size)  # raises the clear error
            return
        self._pending[int(m.group(1))] = (text, system, where, long_size)
        self._parsed.pop(int(m.group(1)), None)
        self.names[int(m.group(1))] = n.group(1)

    def get(self, event_id: int) -> EventFormat | None:
        """The format of one event id, parsing it now if needed."""
        if event_id in self._pending:
            text, system, where, long_size = self._pending.pop(event_id)
            self._parsed[event_id] = checked_format(text, system, where, long_size)
        return self._parsed.get(event_id)

    @property
    def events(self) -> dict[int, EventFormat]:
        """Every format, parsed (parses the pending ones)."""
        for event_id in list(self._pending):
            self.get(event_id)
        return self._parsed


def _classify(decl: str, size: int, long_size: int) -> tuple[str, str, Kind, int, bool]:
    """Split a field declaration into (C type, name, kind, element size, rel_loc)."""
    decl = decl.strip()
    dyn = decl.startswith("__data_loc") or decl.startswith("__rel_loc")
    rel = decl.startswith("__rel_loc")
    if dyn:
        decl = decl.split(None, 1)[1].replace("[]", " ").strip()  # "char[] name" -> "char name"
    arr = _ARRAY_RE.match(decl)
    if arr:
        ctype, name, count = arr["type"].strip(), arr["name"], arr["len"].strip()
    else:
        m = _NAME_RE.match(decl)
        if not m:
            raise ValueError(f"cannot read field declaration {decl!r}")
        ctype, name, count = m["type"].strip(), m["name"], None
    base = ctype.replace("const ", "").replace("volatile ", "").strip()
    if dyn:
        if base == "char":
            return ctype, name, Kind.DYN_STR, 1, rel
        return ctype, name, Kind.DYN_ARRAY, _elem_size(base, long_size), rel
    if count is not None or size == 0:
        # Kernels before 4.20 or so declared flexible arrays without brackets (`char buf;
        # size:0`); libtraceevent reads a field of size 0 as the rest of the record.
        if count in ("", "0", None) or size == 0:
            kind = Kind.TAIL_STR if base == "char" else Kind.TAIL_ARRAY
            return ctype, name, kind, _elem_size(base, long_size), False
        if base == "char":
            return ctype, name, Kind.CHARS, 1, False
        n = int(count) if count.isdigit() else 0
        elem = size // n if n else _elem_size(base, long_size)
        return ctype, name, Kind.INT_ARRAY, elem, False
    if size not in (1, 2, 4, 8):  # a struct or __int128 by value: kept as its bytes
        return ctype, name, Kind.INT_ARRAY, 1, False
    if "*" in ctype:
        if base.replace(" ", "") == "char*":
            return ctype, name, Kind.CONST_STR, size, False
        return ctype, name, Kind.POINTER, size, False
    if base in ("bool", "_Bool") and size == 1:
        return ctype, name, Kind.BOOL, 1, False
    return ctype, name, Kind.INT, size, False


def _elem_size(base: str, long_size: int) -> int:
    """Byte size of an array element type named in a format file."""
    sizes = {
        "char": 1, "u8": 1, "s8": 1, "__u8": 1, "unsigned char": 1, "signed char": 1,
        "bool": 1, "u16": 2, "s16": 2, "short": 2, "unsigned short": 2, "__u16": 2,
        "u32": 4, "s32": 4, "int": 4, "unsigned int": 4, "unsigned": 4, "__u32": 4,
        "pid_t": 4, "u64": 8, "s64": 8, "__u64": 8, "long long": 8,
        "unsigned long long": 8,
    }  # fmt: skip
    if base in sizes:
        return sizes[base]
    # unsigned long, long, cpumask_t (an array of longs), pointers: the kernel's long.
    return long_size


def parse_format(text: str, system: str = "", long_size: int = 8) -> EventFormat:
    """Parse one events/<system>/<event>/format file."""
    name = ""
    event_id = -1
    fields: list[FieldSpec] = []
    print_fmt = ""
    for line in text.splitlines():
        if line.startswith("name:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("ID:"):
            event_id = int(line.split(":", 1)[1])
        elif line.startswith("print fmt:"):
            print_fmt = line.split(":", 1)[1].strip()
        else:
            m = _FIELD_RE.match(line)
            if m:
                fields.append(_field(m, long_size))
    if not name or event_id < 0:
        raise ValueError("no 'name:' or 'ID:' line")
    return EventFormat(event_id, system, name, tuple(fields), print_fmt)


def _field(m: re.Match[str], long_size: int) -> FieldSpec:
    """Build a FieldSpec from one matched `field:` line."""
    size, offset = int(m["size"]), int(m["offset"])
    if size > 0xFFFF or offset > 0xFFFF:  # a record is smaller than a ring-buffer page
        raise ValueError(f"field at offset {offset} of size {size} lies beyond any record")
    ctype, name, kind, elem, rel = _classify(m["decl"], size, long_size)
    signed = m["signed"] == "1"
    return FieldSpec(name, ctype, int(m["offset"]), size, signed, kind, elem, rel)


def parse_header_page(text: str) -> HeaderPage:
    """Parse events/header_page (page timestamp, commit word, data area)."""
    found: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        m = _FIELD_RE.match(line)
        if m:
            decl = m["decl"].split()
            found[decl[-1]] = (int(m["offset"]), int(m["size"]))
    try:
        ts, commit, data = found["timestamp"], found["commit"], found["data"]
    except KeyError as err:
        raise ValueError(f"header_page lacks field {err}") from None
    hp = HeaderPage(ts[0], ts[1], commit[0], commit[1], data[0], data[1])
    _check_header_page(hp)
    return hp


def _check_header_page(hp: HeaderPage) -> None:
    """The page header is a timestamp and a commit word of 4 or 8 bytes before the data;
    anything else is a damaged file, not a kernel's layout."""
    if hp.timestamp_size not in (4, 8) or hp.commit_size not in (4, 8):
        raise ValueError(f"timestamp/commit of {hp.timestamp_size}/{hp.commit_size} bytes")
    ends = (hp.timestamp_offset + hp.timestamp_size, hp.commit_offset + hp.commit_size)
    if max(ends) > hp.data_offset or hp.data_offset > 64 or hp.data_size <= 0:
        raise ValueError(f"header fields end at {max(ends)}, data at {hp.data_offset}")


def parse_header_event(text: str) -> HeaderEvent:
    """Parse events/header_event (bit widths and the special type_len values)."""

    def grab(pattern: str, default: int) -> int:
        m = re.search(pattern, text)
        return int(m.group(1)) if m else default

    return HeaderEvent(
        type_len_bits=grab(r"type_len\s*:\s*(\d+)\s*bits", 5),
        time_delta_bits=grab(r"time_delta\s*:\s*(\d+)\s*bits", 27),
        padding=grab(r"padding\s*:\s*type\s*==\s*(\d+)", 29),
        time_extend=grab(r"time_extend\s*:\s*type\s*==\s*(\d+)", 30),
        time_stamp=grab(r"time_stamp\s*:\s*type\s*==\s*(\d+)", 31),
        data_max_type_len=grab(r"data max type_len\s*==\s*(\d+)", 28),
    )


def checked_format(text: str, system: str, where: str, long_size: int = 8) -> EventFormat:
    """parse_format, turning a malformed file into a TracekitError naming where it was."""
    try:
        return parse_format(text, system, long_size)
    except (ValueError, IndexError) as err:
        raise TracekitError(
            f"bad event format file in {where}: {err}; the capture is damaged or not a "
            "tracefs format file (re-record it)"
        ) from None
