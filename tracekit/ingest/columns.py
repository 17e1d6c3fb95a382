"""Event payloads -> typed polars columns, gathered with numpy fancy indexing.

Given the payload offsets of all events of one type, each field is read for all of them
at once: a (events x size) byte matrix is gathered and viewed as the field's integer
type, or cut at its first NUL and viewed as fixed-width bytes for strings. There is no
per-event Python code except for the rare string that is not valid UTF-8.
"""

from __future__ import annotations

import mmap
import sys

import numpy as np
import polars as pl

from tracekit.ingest import membuf
from tracekit.ingest.arrowbuf import INT_FORMATS, empty_lists, view_column
from tracekit.ingest.chars import BYTE_MASKS, string_column
from tracekit.ingest.formats import EventFormat, FieldSpec, Kind

_INT_DTYPES: dict[tuple[int, bool], pl.DataType] = {
    (1, True): pl.Int8(), (2, True): pl.Int16(), (4, True): pl.Int32(), (8, True): pl.Int64(),
    (1, False): pl.UInt8(), (2, False): pl.UInt16(), (4, False): pl.UInt32(),
    (8, False): pl.UInt64(),
}  # fmt: skip


def polars_dtype(spec: FieldSpec) -> pl.DataType:
    """The column type a field becomes (documented in docs/tables.md)."""
    if spec.kind in (Kind.CHARS, Kind.TAIL_STR, Kind.DYN_STR, Kind.CONST_STR):
        return pl.String()
    if spec.kind == Kind.BOOL:
        return pl.Boolean()
    if spec.kind == Kind.POINTER:
        return pl.UInt64()
    inner = _INT_DTYPES.get((spec.elem_size, spec.signed), pl.UInt8())
    if spec.kind == Kind.INT_ARRAY and spec.elem_size and spec.size // spec.elem_size:
        return pl.Array(inner, spec.size // spec.elem_size)  # fixed length: no offsets
    if spec.kind in (Kind.INT_ARRAY, Kind.TAIL_ARRAY, Kind.DYN_ARRAY):
        return pl.List(inner)
    return _INT_DTYPES.get((spec.size, spec.signed), pl.UInt64())


WORDS_MAX = 64  # bytes: strings up to this wide are read as words and deduplicated
WIDE_MIN = 256  # bytes: strings wider than this are cut one by one (see _wide_strings)
# Wide strings are taken span by span (_spans): strings closer than this share one.
SPAN_GAP = 4096
SPAN_MAX = 1 << 30  # bytes in one span (its views' offsets are 32-bit)
PIN_WASTE = 1.25  # spans used in place when they hold at most this much over the strings


class Gatherer:
    """Reads fields out of one buffer for a set of events (payload offsets and lengths)."""

    def __init__(
        self, buf: np.ndarray, payload: np.ndarray, length: np.ndarray, endian: str = "<"
    ) -> None:
        self.buf = buf
        self.payload = payload
        self.length = length
        self.endian = endian
        self.fixed: tuple[int, np.ndarray] | None = None  # see prefetch()
        # Byte ranges of buf that columns made by this gatherer (and the gatherers made
        # from it, which share the list) still use: never to be released (bytype).
        self.pinned: list[tuple[int, int]] = []

    def prefetch(self, lo: int, hi: int) -> None:
        """Read payload bytes [lo, hi) of every event in one gather of 4-byte words.

        The integer fields inside are then sliced out of that (events x words) matrix:
        one pass over the ring buffer per event type instead of one per field.
        """
        lo, hi = lo // 4 * 4, -(-hi // 4) * 4
        m = self._word_matrix(self.payload + lo, hi - lo) if hi > lo else None
        self.fixed = None if m is None else (lo, m)

    def fixed_words(self, rel: int, nbytes: int) -> np.ndarray | None:
        """(events x nbytes/4) words at payload offset rel from the prefetched matrix."""
        view = self._fixed_view(rel, nbytes)
        return None if view is None else np.ascontiguousarray(view)

    def _fixed_view(self, rel: int, nbytes: int) -> np.ndarray | None:
        """The prefetched matrix's columns of payload bytes [rel, rel+nbytes) (a view)."""
        if self.fixed is None or rel % 4 or nbytes % 4:
            return None
        lo, m = self.fixed
        if rel < lo or rel + nbytes > lo + 4 * m.shape[1]:
            return None
        k = (rel - lo) // 4
        return m[:, k : k + nbytes // 4]

    def _from_fixed(self, rel: int, size: int) -> np.ndarray | None:
        """An unsigned field of `size` bytes from the prefetched matrix (None: not in it)."""
        if size >= 4:
            words = self.fixed_words(rel, size)
            return None if words is None else words.view(np.dtype(f"u{size}")).ravel()
        lane = rel % 4
        word = self.fixed_words(rel - lane, 4) if lane + size <= 4 else None
        if word is None:
            return None
        shifted = word.ravel() >> np.uint32(8 * lane)
        return (shifted & np.uint32((1 << (8 * size)) - 1)).astype(np.dtype(f"u{size}"))

    def _bytes(self, offset: np.ndarray, width: int) -> np.ndarray:
        """An (events x width) matrix of the bytes at each absolute offset."""
        if len(offset) and int(offset.min()) >= 0 and int(offset.max()) + width <= len(self.buf):
            # One index per event into an array of overlapping width-byte items: no (events x
            # width) index matrix, and each event's bytes copied in one piece.
            rows = np.ndarray(
                (len(self.buf) - width + 1,), np.dtype((np.void, width)), self.buf, 0, (1,)
            )
            return rows[offset].view(np.uint8).reshape(len(offset), width)
        idx = np.minimum(offset[:, None] + np.arange(width), len(self.buf) - 1)
        return self.buf[idx]

    def ints(self, rel: int, size: int, signed: bool) -> np.ndarray:
        """An integer field at payload offset `rel` for every event."""
        if size not in (1, 2, 4, 8):
            raise ValueError(f"integer field of {size} bytes")
        fixed = self._from_fixed(rel, size)
        if fixed is not None:
            return fixed.view(np.dtype(f"{'i' if signed else 'u'}{size}"))
        return self.read(self.payload + rel, size, signed)

    def read(self, addr: np.ndarray, size: int, signed: bool) -> np.ndarray:
        """An integer of `size` bytes at each absolute address."""
        kind = "i" if signed else "u"
        fast = self._from_words(addr, size)
        if fast is not None:
            return fast.view(np.dtype(f"{kind}{size}"))
        raw = np.ascontiguousarray(self._bytes(addr, size))
        return raw.view(np.dtype(f"{self.endian}{kind}{size}")).ravel()

    def _word_matrix(self, addr: np.ndarray, nbytes: int) -> np.ndarray | None:
        """(events x nbytes/4) 32-bit words at 4-aligned addresses, or None if not possible.

        Payloads are 4-byte aligned, so fields of 4 and 8 bytes (and arrays of them) are
        read a word at a time; little-endian words viewed in pairs are the u64 values.
        """
        if self.endian != "<" or len(self.buf) % 4 or nbytes % 4 or not len(addr):
            return None
        if (addr & 3).any() or int(addr.max()) + nbytes > len(self.buf):
            return None
        words = self.buf.view(np.uint32)
        base = addr >> 2
        if nbytes == 4:
            return words[base][:, None]
        # Row r of this array is the nbytes at word r, as one opaque item: the gather then
        # copies each event's bytes in one piece (a sliding window of u32 rows, as before,
        # copies them a word at a time, half as fast on sched-sized events).
        rows = np.ndarray(
            (len(words) - nbytes // 4 + 1,), np.dtype((np.void, nbytes)), self.buf, 0, (4,)
        )
        return rows[base].view(np.uint32).reshape(len(base), nbytes // 4)

    def _from_words(self, addr: np.ndarray, size: int) -> np.ndarray | None:
        """Read little-endian fields through 32-bit words (no per-byte index matrix)."""
        if size >= 4:
            m = self._word_matrix(addr, size)
            return None if m is None else m.view(np.dtype(f"u{size}")).ravel()
        if self.endian != "<" or len(self.buf) % 4 or not len(addr):
            return None
        lane = addr & 3
        if (lane + size > 4).any():
            return None
        shifted = self.buf.view(np.uint32)[addr >> 2] >> (lane * 8).astype(np.uint32)
        return (shifted & np.uint32((1 << (8 * size)) - 1)).astype(np.dtype(f"u{size}"))

    def strings(self, start: np.ndarray, count: np.ndarray, rel: int = -1) -> pl.Series:
        """NUL-terminated strings of at most `count` bytes at each absolute offset (at payload
        offset `rel` of every event, when it is one: the prefetched words may hold them)."""
        width = int(count.max()) if len(count) else 0
        if width == 0:
            return pl.Series([""] * len(start), dtype=pl.String)
        words = self._string_words(start, count, width, rel) if width <= WORDS_MAX else None
        if words is not None:  # short strings (task and irq names): tracekit/ingest/chars.py
            return string_column(words, _decode)
        wide = self._wide_strings(start, count) if width > WIDE_MIN else None
        if wide is not None:
            return wide
        raw = self._bytes(start, width)  # a fresh array (fancy indexing copies)
        nul = raw == 0
        first = nul.argmax(axis=1)  # the first NUL of each row; 0 also when there is none
        first[~nul[np.arange(len(raw)), first]] = width
        del nul
        raw *= np.arange(width)[None, :] < np.minimum(first, count)[:, None]  # from it on: 0
        fixed = np.ascontiguousarray(raw).view(f"S{width}").ravel()
        return _decode(pl.Series(fixed))

    def _wide_strings(self, start: np.ndarray, count: np.ndarray) -> pl.Series | None:
        """Long strings (trace_marker prints) cut at their NUL one by one, in the buffer's
        own bytes: an (events x width) matrix costs its width per event, a slice does not.
        None where the buffer is not an mmap or bytes, or a string runs past its end."""
        src = membuf.byte_source(self.buf)
        if src is None or int(start.min()) < 0 or int((start + count).max()) > len(self.buf):
            return None
        data, base = src
        length = _nul_cut(data, (start + base).tolist(), count.tolist())
        spans, data_of, data_at = _spans(start, length)
        held = sum(hi - lo for lo, hi in spans)
        if held <= PIN_WASTE * max(int(length.sum()), 1) and membuf.is_private(self.buf):
            # The strings fill their spans: the column's views point into buf itself,
            # and those bytes are kept from the release behind the blocks. Not into a
            # file mapped from disk (an uncompressed trace.dat): rewriting the file would
            # change the column, truncating it would fault.
            data = [self.buf[lo:hi] for lo, hi in spans]
            self.pinned.extend(spans)
        else:  # sparse strings: pinning their pages would keep more than them; copied
            data = [_populated(self.buf[lo:hi]) for lo, hi in spans]
        return _decode(view_column(self.buf, start, length, data, data_of, data_at))

    def _string_words(
        self, start: np.ndarray, count: np.ndarray, width: int, rel: int
    ) -> np.ndarray | None:
        """(events x ceil(width/8)) u64 words of each string's bytes, those at or past its
        count set to 0; None where they cannot be read so (the caller's byte path then)."""
        if sys.byteorder != "little" or self.endian != "<":
            return None
        m = self._fixed_view(rel, -(-width // 4) * 4) if rel >= 0 else None
        if m is None:  # not prefetched; aligned starts: a word per read
            m = self._word_matrix(start, -(-width // 4) * 4)
        if m is None:
            if int(start.min()) < 0 or int(start.max()) + width > len(self.buf):
                return None
            m = np.ascontiguousarray(self._bytes(start, width))
            m = np.pad(m, ((0, 0), (0, -width % 4))).view(np.uint32)
        words = np.zeros((len(m), -(-width // 8)), dtype=np.uint64)
        words.view(np.uint32)[:, : m.shape[1]] = m
        low = int(count.min())
        for k in range(words.shape[1]):  # bytes past the count (and past the field): 0
            if low < 8 * (k + 1):  # not when every row's count covers the word (char[N])
                words[:, k] &= BYTE_MASKS[np.clip(count - 8 * k, 0, 8)]
        return words

    def arrays(self, start: np.ndarray, nbytes: np.ndarray, elem: int, signed: bool) -> pl.Series:
        """Arrays of integers of `elem` bytes: `nbytes` bytes at each absolute offset."""
        counts = np.maximum(nbytes, 0) // elem
        if len(counts) and (counts == counts[0]).all() and counts[0] > 0 and elem in (4, 8):
            m = self._word_matrix(start, int(counts[0]) * elem)
            if m is not None:  # same length everywhere: one (events x count) matrix
                kind = "i" if signed else "u"
                return pl.Series(m.view(np.dtype(f"{kind}{elem}")))  # an Array column
        total = int(counts.sum())
        first = np.repeat(start, counts)
        within = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        values = self.read(first + within * elem, elem, signed)
        if len(counts) and (counts == counts[0]).all() and counts[0] > 0:
            matrix = pl.Series(values.reshape(len(counts), int(counts[0])))
            return matrix.cast(pl.List(matrix.dtype.inner))  # type: ignore[attr-defined]
        return _to_lists(values, counts)


def _nul_cut(data: mmap.mmap | bytes, starts: list[int], counts: list[int]) -> np.ndarray:
    """The length of each string at `starts`: up to its first NUL, else its count."""
    find = data.find
    ends = [find(b"\0", at, at + n) for at, n in zip(starts, counts, strict=True)]
    end = np.array(ends, np.int64)
    return np.where(end >= 0, end - np.array(starts, np.int64), np.array(counts, np.int64))


def _spans(
    start: np.ndarray, length: np.ndarray
) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """The byte spans [lo, hi) of the buffer holding the strings [start, start + length),
    and per string the span and offset it is at.

    Strings less than SPAN_GAP apart share a span (the bytes between, record headers and
    the small events among the prints, come with them: one large piece instead of one
    per string); a span holds at most SPAN_MAX bytes (a view's offset is 32-bit).
    """
    start, length = start.astype(np.int64, copy=False), length.astype(np.int64, copy=False)
    order = np.argsort(start, kind="stable")
    # int64: the offsets come as int32 (a buffer under 2 GiB), and lo + SPAN_MAX past
    # 2^31 wrapped, which gave every string of the buffer's last GiB a span of its own.
    lo, hi = start[order], start[order] + length[order]
    reach = np.maximum.accumulate(hi)
    gap = np.flatnonzero(lo[1:] - reach[:-1] > SPAN_GAP) + 1
    first = [0, *gap.tolist()]
    bounds = []  # [first string, end string) of each span, cut further at SPAN_MAX
    for a, b in zip(first, [*first[1:], len(lo)], strict=True):
        while a < b:
            end = int(np.searchsorted(reach[a:b], lo[a] + SPAN_MAX, side="right")) + a
            end = max(end, a + 1)
            bounds.append((a, end))
            a = end
    data_of, data_at = np.empty(len(start), np.int64), np.empty(len(start), np.int64)
    spans = []
    for k, (a, b) in enumerate(bounds):
        base = int(lo[a])
        spans.append((base, int(reach[b - 1])))
        data_of[order[a:b]] = k
        data_at[order[a:b]] = lo[a:b] - base
    return spans, data_of, data_at


def _populated(part: np.ndarray) -> np.ndarray:
    """A copy of part in a mapping whose pages are mapped at once (one call, not a
    fault per page)."""
    out = membuf.alloc(len(part), populate=True)
    out[:] = part
    return out


def _decode(binary: pl.Series) -> pl.Series:
    """Binary -> String; invalid UTF-8 (rare) is decoded with replacement, not dropped."""
    try:
        return binary.cast(pl.String)
    except pl.exceptions.PolarsError:
        return pl.Series([b.decode("utf-8", "replace") for b in binary.to_list()])


def _to_lists(values: np.ndarray, counts: np.ndarray) -> pl.Series:
    """Split a flat array into one list per event (empty lists kept)."""
    n = len(counts)
    if not len(values):  # every list empty (function_graph's args[] without funcgraph-args)
        if values.dtype in INT_FORMATS:  # offsets no page of which is written: no memory
            return empty_lists(n, values.dtype)
        return pl.Series(values[:0]).implode().gather(np.zeros(n, np.uint32))
    rows = np.repeat(np.arange(n), counts)
    grouped = (
        pl.DataFrame({"row": rows, "v": values})
        .group_by("row", maintain_order=True)
        .agg(pl.col("v"))
    )
    full = pl.DataFrame({"row": np.arange(n)}).join(grouped, on="row", how="left")
    dtype = pl.List(pl.Series(values[:0]).dtype)
    return full["v"].fill_null(pl.Series([[]], dtype=dtype)).cast(dtype)


def field_column(g: Gatherer, spec: FieldSpec, printk: dict[int, str], long_size: int) -> pl.Series:
    """Decode one field of one event type into a named polars Series."""
    col = _field_values(g, spec, printk, long_size).alias(spec.name)
    dtype = polars_dtype(spec)
    return col if col.dtype == dtype else col.cast(dtype)


def _field_values(
    g: Gatherer, spec: FieldSpec, printk: dict[int, str], long_size: int
) -> pl.Series:
    """The values of one field (see polars_dtype for the resulting types)."""
    k = spec.kind
    if k in (Kind.INT, Kind.POINTER, Kind.BOOL):
        values = g.ints(spec.offset, spec.size, spec.signed and k == Kind.INT)
        return pl.Series(values != 0 if k == Kind.BOOL else values)
    if k == Kind.CONST_STR:
        return _resolve(g.ints(spec.offset, spec.size, False), printk)
    if k == Kind.CHARS:
        return g.strings(g.payload + spec.offset, np.full(len(g.payload), spec.size), spec.offset)
    if k in (Kind.TAIL_STR, Kind.TAIL_ARRAY):
        rest = np.maximum(g.length - spec.offset, 0)
        if k == Kind.TAIL_STR:
            return g.strings(g.payload + spec.offset, rest)
        return g.arrays(g.payload + spec.offset, rest, spec.elem_size, spec.signed)
    if k == Kind.INT_ARRAY:
        words = g.fixed_words(spec.offset, spec.size) if spec.elem_size in (4, 8) else None
        if words is not None and spec.size // spec.elem_size:  # as arrays() would, prefetched
            return pl.Series(words.view(np.dtype(f"{'i' if spec.signed else 'u'}{spec.elem_size}")))
        nbytes = np.full(len(g.payload), spec.size)
        return g.arrays(g.payload + spec.offset, nbytes, spec.elem_size, spec.signed)
    loc = g.ints(spec.offset, 4, False).astype(np.int64)
    start = g.payload + (loc & 0xFFFF) + (spec.offset + spec.size if spec.rel_loc else 0)
    nbytes = np.minimum(loc >> 16, np.maximum(g.payload + g.length - start, 0))
    if k == Kind.DYN_STR:
        return g.strings(start, nbytes)
    return g.arrays(start, nbytes, spec.elem_size, spec.signed)


def _resolve(addr: np.ndarray, printk: dict[int, str]) -> pl.Series:
    """`const char *` addresses -> the strings printk_formats maps them to (hex if unknown)."""
    uniq, inverse = np.unique(addr, return_inverse=True)
    names = [printk.get(int(a), f"0x{int(a):x}") for a in uniq]
    return pl.Series(names, dtype=pl.String)[inverse.ravel()]


def common_columns(g: Gatherer, fmt: EventFormat) -> dict[str, np.ndarray]:
    """The common_* fields (flags, preempt count, pid, ...) as numpy arrays by name."""
    out: dict[str, np.ndarray] = {}
    for spec in fmt.common:
        if spec.kind == Kind.INT and spec.size in (1, 2, 4, 8):
            out[spec.name] = g.ints(spec.offset, spec.size, spec.signed)
    return out


# char[N] too: sched_switch's comms sit between its integers, so one gather reads all.
FIXED_KINDS = (Kind.INT, Kind.POINTER, Kind.BOOL, Kind.CONST_STR, Kind.INT_ARRAY, Kind.CHARS)
PREFETCH_MAX = 128  # bytes: a wider span would mostly gather bytes no field uses


def fixed_span(fmt: EventFormat) -> tuple[int, int] | None:
    """The payload bytes holding the format's fixed-size fields (its char arrays left out
    when they would make it too wide), when there are at least two (else a prefetch saves
    nothing)."""
    for kinds in (FIXED_KINDS, FIXED_KINDS[:-1]):
        specs = [s for s in fmt.own if s.kind in kinds and s.size > 0]
        if len(specs) < 2:
            continue
        lo = min(s.offset for s in specs)
        hi = max(s.offset + s.size for s in specs)
        if hi - lo <= PREFETCH_MAX:
            return lo, hi
    return None


STANDARD_COMMON = (
    ("common_type", 0, 2),
    ("common_flags", 2, 1),
    ("common_preempt_count", 3, 1),
    ("common_pid", 4, 4),
)


def has_standard_common(fmt: EventFormat) -> bool:
    """True when the common fields are the usual 8-byte header (type, flags, preempt, pid)."""
    layout = tuple((f.name, f.offset, f.size) for f in fmt.common)
    return layout[:4] == STANDARD_COMMON


def standard_header(g: Gatherer) -> dict[str, np.ndarray] | None:
    """type, flags, preempt count and pid of every event from one 8-byte read each.

    Only valid for little-endian traces whose formats use the standard common layout;
    returns None otherwise (the caller reads the common fields per event type).
    """
    m = g._word_matrix(g.payload, 8)
    if m is None:
        return None
    w0 = m[:, 0]
    return {
        "common_type": (w0 & 0xFFFF).astype(np.uint16),  # ids are 16-bit: a quarter of int64
        "common_flags": ((w0 >> 16) & 0xFF).astype(np.uint8),
        "common_preempt_count": (w0 >> 24).astype(np.uint8),
        # A copy, not a strided view: a view would keep the whole (events x 2) matrix.
        "common_pid": np.ascontiguousarray(m[:, 1]).view(np.int32),
    }
