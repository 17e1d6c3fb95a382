"""Ftrace ring-buffer pages -> record arrays, vectorised over pages with numpy.

A CPU's trace data is a run of fixed-size pages (sub-buffers). Each page starts with a
header (64-bit timestamp, a `commit` word holding the data length and the missed-events
flags) followed by records. A record starts with a 32-bit word: type_len (5 low bits)
and time_delta (27 high bits). type_len 1..28 is an event of type_len*4 bytes; 0 is an
event whose length is in the next word; 29 is padding, 30 a time extend, 31 an absolute
time stamp. The records of one page form a chain (each one's position depends on the
previous length), so this walks many pages at once (PAGES_PER_WALK, to bound the
memory of the walk): step k finds where the k-th record of every page still active
starts, with numpy. The records are then decoded in page order in one vectorised pass.
The Python loop runs (records per page) times per batch, never once per event.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.ingest import membuf
from tracekit.ingest.formats import HeaderEvent, HeaderPage

MISSED_EVENTS = 1 << 31  # the page was preceded by lost events
MISSED_STORED = 1 << 30  # and their count is stored after the page's data
COMMIT_MASK = (1 << 27) - 1  # the data length bits of `commit`
TS_SHIFT = 27
TS_MSB_MASK = ~np.uint64((1 << 59) - 1)  # bits an absolute time stamp does not carry


@dataclass
class Damage:
    """Where a page could not be decoded: the first bad byte and what was wrong."""

    offset: int
    reason: str


@dataclass
class Records:
    """The event records of one CPU's pages, in order, as parallel arrays."""

    ts: np.ndarray  # uint64 raw clock value of each event
    payload: np.ndarray  # byte offset of each event's payload in the buffer: int32 (int64
    # for a buffer of 2 GiB or more)
    length: np.ndarray  # int32 payload length in bytes (an event fits in a page)
    page: np.ndarray  # int32 page index of each event
    page_ts: np.ndarray  # uint64 timestamp of every page
    page_missed: np.ndarray  # bool: lost events before this page
    page_lost: np.ndarray  # int64: how many, -1 when the kernel did not store it
    damage: Damage | None = None  # set when salvaging: pages from here on were skipped


def _words(buf: np.ndarray, endian: str) -> np.ndarray:
    """The buffer as 32-bit words in host order (a view when it can be)."""
    words = buf.view(np.dtype(f"{endian}u4"))
    return words if words.dtype.isnative else words.astype(np.uint32)


def _read_uint(buf: np.ndarray, offsets: np.ndarray, size: int, endian: str) -> np.ndarray:
    """Read one unsigned integer of `size` bytes at each offset (unaligned-safe)."""
    raw = buf[offsets[:, None] + np.arange(size)]
    return np.ascontiguousarray(raw).view(np.dtype(f"{endian}u{size}")).ravel().astype(np.uint64)


def page_headers(
    buf: np.ndarray, hp: HeaderPage, page_size: int, endian: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Timestamp, data length, missed flag and stored lost count of every page."""
    n_pages = len(buf) // page_size
    starts = np.arange(n_pages, dtype=np.int64) * page_size
    ts = _read_uint(buf, starts + hp.timestamp_offset, hp.timestamp_size, endian)
    commit = _read_uint(buf, starts + hp.commit_offset, hp.commit_size, endian)
    size = (commit & np.uint64(COMMIT_MASK)).astype(np.int64)
    missed = (commit & np.uint64(MISSED_EVENTS)) != 0
    stored = missed & ((commit & np.uint64(MISSED_STORED)) != 0)
    lost = np.where(missed, -1, 0).astype(np.int64)
    room = hp.data_offset + size + hp.commit_size <= page_size
    idx = np.flatnonzero(stored & room)
    if len(idx):
        where = starts[idx] + hp.data_offset + size[idx]
        lost[idx] = _read_uint(buf, where, hp.commit_size, endian).astype(np.int64)
    return ts, size, missed, lost


def decode_pages(
    buf: np.ndarray,
    hp: HeaderPage,
    he: HeaderEvent,
    *,
    page_size: int,
    endian: str = "<",
    base_offset: int = 0,
    salvage: bool = False,
) -> Records:
    """Decode every page of one CPU's buffer into event records (see module doc).

    A page whose header or records do not fit raises ValueError naming the byte offset
    (base_offset + position in buf); with salvage=True the pages before it are kept
    and `damage` says where decoding stopped.
    """
    buf = buf[: len(buf) - len(buf) % page_size] if salvage else buf
    if len(buf) % page_size:
        raise ValueError(
            f"offset {base_offset + len(buf) - len(buf) % page_size}: CPU data is "
            f"{len(buf)} bytes, not a whole number of {page_size}-byte pages (truncated)"
        )
    ts, size, missed, lost = page_headers(buf, hp, page_size, endian)
    # A trace.dat mapped from disk: the headers' read mapped every page; the walk maps
    # them again batch by batch, unmapping each batch behind it (membuf.drop_file_pages).
    membuf.drop_file_pages(buf)
    bad = np.flatnonzero(size > page_size - hp.data_offset)
    damage = None
    if len(bad):
        first = int(bad[0])
        reason = f"page header commit length {int(size[first])} exceeds the page"
        if not salvage:
            raise ValueError(f"offset {base_offset + first * page_size}: {reason}")
        damage = Damage(base_offset + first * page_size, reason)
        ts, size, missed, lost = ts[:first], size[:first], missed[:first], lost[:first]
    rec = _walk_batches(_words(buf, endian), ts, size, hp, he, page_size)
    if rec.bad_page >= 0:
        if not salvage:
            raise ValueError(f"offset {base_offset + rec.bad_pos}: {rec.bad_reason}")
        damage = Damage(base_offset + rec.bad_pos, rec.bad_reason)
        keep = rec.page < rec.bad_page
        rec.apply(keep)
        ts, missed, lost = ts[: rec.bad_page], missed[: rec.bad_page], lost[: rec.bad_page]
    return Records(rec.ts, rec.payload, rec.length, rec.page, ts, missed, lost, damage)


@dataclass
class _Walk:
    """Intermediate result of the vectorised page walk."""

    ts: np.ndarray
    payload: np.ndarray
    length: np.ndarray
    page: np.ndarray
    bad_page: int = -1
    bad_pos: int = 0
    bad_reason: str = ""

    ARRAYS = ("ts", "payload", "length", "page")

    def apply(self, keep: np.ndarray) -> None:
        """Keep only the records selected by a boolean mask."""
        self.ts, self.payload = self.ts[keep], self.payload[keep]
        self.length, self.page = self.length[keep], self.page[keep]


# Pages walked together: bounds the walk's steps (16 bytes per record) and the arrays
# of its assembly to tens of MB however big the CPU's buffer is (each CPU's walk at
# once: 8192 pages of 4 KB made the walks funcgraph's peak).
PAGES_PER_WALK = 4096


def _walk_batches(
    words: np.ndarray,
    page_ts: np.ndarray,
    size: np.ndarray,
    hp: HeaderPage,
    he: HeaderEvent,
    page_size: int,
) -> _Walk:
    """_walk over batches of pages, joined; stops after the first batch with a bad page."""
    walks: list[_Walk] = []
    # Offsets as int32 when they fit: the walks of every CPU hold their records at once
    # (funcgraph's peak), 4 bytes a record less.
    offset = np.int32 if len(words) * 4 < 2**31 else np.int64
    for first in range(0, len(size), PAGES_PER_WALK):
        last = first + PAGES_PER_WALK
        w = _walk(words, page_ts[first:last], size[first:last], hp, he, page_size, first)
        membuf.drop_file_pages(words.view(np.uint8), first * page_size, last * page_size)
        w.length = w.length.astype(np.int32)  # a record is shorter than a page
        w.payload = w.payload.astype(offset, copy=False)
        walks.append(w)
        if w.bad_page >= 0:
            break
    if len(walks) == 1:
        return walks[0]
    if not walks:
        return _walk(words, page_ts, size, hp, he, page_size)  # no pages: empty arrays
    # Joined one array at a time, each batch's copy dropped once joined: the records are
    # never all there twice (peak memory: the walks run for every CPU at once).
    empty = np.zeros(0, np.int64)
    joined = _Walk(empty, empty, empty, empty)
    for k in _Walk.ARRAYS:
        setattr(joined, k, np.concatenate([getattr(w, k) for w in walks]))
        for w in walks:
            setattr(w, k, empty)
    last_walk = walks[-1]
    joined.bad_page, joined.bad_pos = last_walk.bad_page, last_walk.bad_pos
    joined.bad_reason = last_walk.bad_reason
    return joined


def _walk(
    words: np.ndarray,
    page_ts: np.ndarray,
    size: np.ndarray,
    hp: HeaderPage,
    he: HeaderEvent,
    page_size: int,
    first: int = 0,
) -> _Walk:
    """Follow the record chains of pages first.. at once; returns data records in order.

    The walk only finds where each record starts; the records are decoded afterwards,
    in page order, in one vectorised pass (_assemble).
    """
    n_pages = len(size)
    page = np.arange(n_pages, dtype=np.int64)
    pos = (page + first) * page_size + hp.data_offset  # byte position of each page's next record
    page_end = pos + size
    active = pos < page_end
    page, pos, end = page[active], pos[active], page_end[active]
    steps: list[tuple[np.ndarray, np.ndarray]] = []
    bad_page, bad_pos, bad_reason = -1, 0, ""
    while len(page):
        nxt, *_, type_len = _records_at(words, pos, end, he)
        overrun = nxt > end
        if overrun.any():
            i = int(np.flatnonzero(overrun)[0])
            if bad_page < 0 or page[i] < bad_page:
                bad_page, bad_pos = int(page[i]), int(pos[i])
                bad_reason = f"record (type_len {int(type_len[i])}) runs past the page data"
        steps.append((page, pos))
        pos = nxt
        live = pos < end
        page, pos, end = page[live], pos[live], end[live]
    walk = _assemble(words, steps, page_ts, page_end, he)
    walk.page += first
    walk.bad_page, walk.bad_pos, walk.bad_reason = bad_page, bad_pos, bad_reason
    walk.bad_page += first if walk.bad_page >= 0 else 0
    return walk


def _records_at(
    words: np.ndarray, pos: np.ndarray, end: np.ndarray, he: HeaderEvent
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """Next position, payload, length, time delta, kind (None: all events) and type_len
    of the record at each position.

    Most records are small events (type_len 1..28, length in the header word), so
    those are computed for everyone and only the others (big events, padding, time
    extends and stamps) go through _step, which also reads their second word.
    """
    head = words[pos >> 2]
    type_len = (head & np.uint32((1 << he.type_len_bits) - 1)).astype(np.int64)
    delta = (head >> np.uint32(he.type_len_bits)) & np.uint32((1 << he.time_delta_bits) - 1)
    delta = delta.astype(np.uint64)
    payload = pos + 4
    length = type_len * 4
    nxt = payload + length
    odd = np.flatnonzero((type_len < 1) | (type_len > he.data_max_type_len))
    if not len(odd):
        return nxt, payload, length, delta, None, type_len
    p_odd = pos[odd]
    arg = words[np.minimum((p_odd >> 2) + 1, len(words) - 1)].astype(np.uint64)
    o_nxt, o_payload, o_length, o_kind = _step(p_odd, type_len[odd], delta[odd], arg, end[odd], he)
    nxt[odd], payload[odd], length[odd] = o_nxt, o_payload, o_length
    delta[odd] = np.where(o_kind > 0, (arg << np.uint64(TS_SHIFT)) | delta[odd], delta[odd])
    kind = np.zeros(len(pos), dtype=np.int64)
    kind[odd] = o_kind
    return nxt, payload, length, delta, kind, type_len


def _step(
    pos: np.ndarray,
    type_len: np.ndarray,
    delta: np.ndarray,
    arg: np.ndarray,
    end: np.ndarray,
    he: HeaderEvent,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Next position, payload offset, payload length and record kind for one step.

    kind: 0 = delta record (event or padding), 1 = time extend, 2 = absolute stamp,
    -1 = padding (no event); events have kind 0 and length > 0.
    """
    arg_i = arg.astype(np.int64)
    is_small = (type_len >= 1) & (type_len <= he.data_max_type_len)
    is_big = type_len == 0
    is_pad = type_len == he.padding
    is_ext = type_len == he.time_extend
    is_abs = type_len == he.time_stamp
    big_len = ((arg_i - 4) + 3) & ~3
    payload = np.where(is_big, pos + 8, pos + 4)
    length = np.where(is_small, type_len * 4, np.where(is_big, big_len, 0))
    nxt = payload + length
    # Padding with a zero delta fills the rest of the page; otherwise its length is arg.
    nxt = np.where(is_pad, np.where(delta == 0, end, pos + 4 + np.maximum(arg_i, 0)), nxt)
    nxt = np.where(is_ext | is_abs, pos + 8, nxt)
    nxt = np.maximum(nxt, pos + 4)  # always move forward, even over garbage
    kind = np.where(is_ext, 1, np.where(is_abs, 2, np.where(is_pad, -1, 0)))
    return nxt, payload, np.where(is_pad | is_ext | is_abs, 0, length), kind


def _in_page_order(
    steps: list[tuple[np.ndarray, np.ndarray]], n_pages: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The walk's record positions in page order, and each page's record count and
    first record.

    Step k holds every active page's k-th record, so a page's record k goes to
    (records before that page) + k: a scatter, no sort.
    """
    count = np.zeros(n_pages, dtype=np.int64)
    for k, (page, _) in enumerate(steps):
        count[page] = k + 1  # pages leave the walk for good: the last step a page is in
    start = np.cumsum(count) - count
    pos = np.empty(int(count.sum()), dtype=np.int64)
    for k, (page, at) in enumerate(steps):
        pos[start[page] + k] = at
    return pos, count, start


def _assemble(
    words: np.ndarray,
    steps: list[tuple[np.ndarray, np.ndarray]],
    page_ts: np.ndarray,
    page_end: np.ndarray,
    he: HeaderEvent,
) -> _Walk:
    """Decode the walked records in page order and turn deltas into absolute timestamps.

    The clock is one running sum over all records, cut into segments that restart at
    each page's header timestamp and at each absolute stamp (rare); a segment's offset
    turns the running sum into its clock.
    """
    pos, count, start = _in_page_order(steps, len(page_ts))
    page_of = np.repeat(np.arange(len(page_ts), dtype=np.int32), count)
    _, payload, length, delta, kind, _ = _records_at(words, pos, page_end[page_of], he)
    del pos
    restart = np.zeros(len(delta), dtype=bool)  # a segment starts here: page start or stamp
    restart[start[count > 0]] = True
    stamp = np.flatnonzero(kind == 2) if kind is not None else np.zeros(0, np.int64)
    restart[stamp] = True
    del kind
    segment = np.flatnonzero(restart)
    base = page_ts[page_of[segment]].astype(np.uint64)  # the clock where a segment starts
    if len(stamp):  # an absolute stamp sets it (its top bits from the page), also at a start
        value = delta[stamp] | (page_ts[page_of[stamp]] & TS_MSB_MASK)
        base[np.searchsorted(segment, stamp)] = value
        delta[stamp] = 0
    ts = np.cumsum(delta, dtype=np.uint64)
    base -= ts[segment] - delta[segment]  # minus the running sum before the segment
    del delta
    ts += base[np.cumsum(restart, dtype=np.int64) - 1]
    is_event = length > 0  # padding, extends and stamps have length 0
    return _Walk(ts[is_event], payload[is_event], length[is_event].astype(np.int32),
                 page_of[is_event])  # fmt: skip
