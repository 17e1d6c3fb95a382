"""Ring-buffer page decoding on pages built here, record kind by record kind.

The pages are written by a small encoder that follows the kernel's layout (header word:
type_len in the low 5 bits, time delta in the high 27; type_len 0 puts the length in the
next word; 29 padding, 30 time extend, 31 absolute stamp), so every record kind and the
missed-events flags can be tested, including the rare ones real fixtures may not hold.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from ringbuf_pages import HE, HP, PAGE, PageWriter, payload

from tracekit.ingest import ringbuf


def decode(*pages: bytes, **kw: object) -> ringbuf.Records:
    """Decode pages with the default headers."""
    buf = np.frombuffer(b"".join(pages), dtype=np.uint8)
    return ringbuf.decode_pages(buf, HP, HE, page_size=PAGE, **kw)  # type: ignore[arg-type]


def tags(rec: ringbuf.Records, buf: bytes) -> list[int]:
    """common_type of each decoded event."""
    return [struct.unpack_from("<H", buf, int(p))[0] for p in rec.payload]


def test_every_record_kind() -> None:
    """Deltas add up; extends, stamps and padding move the clock but are not events."""
    w = PageWriter(ts=1_000_000)
    w.event(10, payload(1))
    w.extend(1 << 30)
    w.event(5, payload(2, 200), big=True)
    w.padding(7, 16)
    w.event(3, payload(3, 12))
    w.stamp(5_000_000_000)
    w.event(2, payload(4))
    page = w.page()
    rec = decode(page)
    assert tags(rec, page) == [1, 2, 3, 4]
    t1 = 1_000_000 + 10
    t2 = t1 + (1 << 30) + 5
    t3 = t2 + 7 + 3  # trace-cmd adds the padding's delta too
    t4 = 5_000_000_000 + 2
    assert rec.ts.tolist() == [t1, t2, t3, t4]
    assert rec.length.tolist() == [8, 200, 12, 8]


def test_flat_and_sorted_assembly_agree() -> None:
    """The sort-free flat assembly equals the reference one on a random mix of pages."""
    rng = np.random.default_rng(7)
    pages = []
    for p in range(40):
        w = PageWriter(ts=10**9 * p)
        for _ in range(int(rng.integers(0, 60))):
            choice = rng.integers(0, 10)
            if choice == 0:
                w.extend(int(rng.integers(1 << 27, 1 << 40)))
            elif choice == 1:
                w.stamp(int(rng.integers(0, 1 << 58)))
            elif choice == 2:
                w.padding(int(rng.integers(1, 100)), 8)
            else:
                w.event(int(rng.integers(0, 1 << 27)), payload(int(choice), 4 * int(choice)))
        pages.append(w.page())
    buf = np.frombuffer(b"".join(pages), dtype=np.uint8)
    rec = ringbuf.decode_pages(buf, HP, HE, page_size=PAGE)
    steps: list[tuple[np.ndarray, np.ndarray]] = []
    original = ringbuf._assemble

    def spy(words: np.ndarray, s: list[tuple[np.ndarray, ...]], *args: object) -> ringbuf._Walk:
        steps.extend(s)
        return original(words, s, *args)  # type: ignore[arg-type]

    ringbuf._assemble = spy  # type: ignore[assignment]
    try:
        ringbuf.decode_pages(buf, HP, HE, page_size=PAGE)
    finally:
        ringbuf._assemble = original  # type: ignore[assignment]
    ref = _assemble_sorted(buf.view(np.uint32), steps, rec.page_ts)
    assert np.array_equal(ref.ts, rec.ts) and np.array_equal(ref.payload, rec.payload)
    assert np.array_equal(ref.length, rec.length) and np.array_equal(ref.page, rec.page)
    assert len(rec.ts) > 500


def test_missed_events_flags() -> None:
    """A page after lost events: count when stored, -1 when not, 0 otherwise."""
    pages = []
    for missed, stored in ((None, False), (17, True), (5, False)):
        w = PageWriter(ts=100)
        w.event(1, payload(9))
        pages.append(w.page(missed, stored))
    rec = decode(*pages)
    assert rec.page_missed.tolist() == [False, True, True]
    assert rec.page_lost.tolist() == [0, 17, -1]
    assert len(rec.ts) == 3


def test_record_past_commit_is_an_error_with_offset() -> None:
    """A record longer than the page data: ValueError naming the byte offset; salvage
    keeps the pages before it."""
    good = PageWriter(ts=1)
    good.event(1, payload(1))
    bad = PageWriter(ts=2)
    bad.body = struct.pack("<II", 0, 4000)  # type_len 0 claiming 4000 bytes, commit 8
    with pytest.raises(ValueError, match=f"offset {PAGE + 16}: record"):
        decode(good.page(), bad.page())
    rec = decode(good.page(), bad.page(), salvage=True)
    assert len(rec.ts) == 1 and rec.damage and rec.damage.offset == PAGE + 16


def test_partial_page_is_an_error() -> None:
    """Data that is not a whole number of pages is refused (truncated file)."""
    w = PageWriter(ts=1)
    w.event(1, payload(1))
    with pytest.raises(ValueError, match="not a whole number"):
        decode(w.page()[:1000])


def _assemble_sorted(
    words: np.ndarray, steps: list[tuple[np.ndarray, np.ndarray]], page_ts: np.ndarray
) -> ringbuf._Walk:
    """Test oracle for ringbuf._assemble (concatenate, sort by page, segmented sum)."""
    page, pos = (np.concatenate(c) for c in zip(*steps, strict=True))
    order = np.argsort(page, kind="stable")  # steps are already in order within a page
    page, pos = page[order], pos[order]
    end = (page + 1) * PAGE  # only padding reads it, and the oracle keeps no padding
    _, payload, length, delta, kind, _ = ringbuf._records_at(words, pos, end, HE)
    kind = np.zeros(len(pos), np.int64) if kind is None else kind
    # Each page restarts the clock at its header timestamp; an absolute stamp restarts
    # it at its own value (its top bits come from the page's timestamp).
    first = np.ones(len(page), dtype=bool)
    first[1:] = page[1:] != page[:-1]
    is_abs = kind == 2
    value = delta.copy()
    value[is_abs] = delta[is_abs] | (page_ts[page[is_abs]] & ringbuf.TS_MSB_MASK)
    plain_first = first & ~is_abs
    value[plain_first] += page_ts[page[plain_first]]
    reset = first | is_abs
    csum = np.cumsum(value, dtype=np.uint64)
    reset_idx = np.flatnonzero(reset)
    base = csum[reset_idx] - value[reset_idx]
    ts = csum - base[np.cumsum(reset) - 1]
    is_event = (kind == 0) & (length > 0)
    return ringbuf._Walk(ts[is_event], payload[is_event], length[is_event], page[is_event])
