"""Block-wise binary decoding (ringbuf page batches, bytype row blocks, membuf release).

The decoder walks pages in batches and builds the typed tables a block of rows at a
time, releasing the ring-buffer pages behind each block. Shrinking both to a few pages
and a few rows must not change a single value: released bytes read back as zeros, so
releasing a page still needed would show up here as a changed field.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit
from tracekit.ingest import bytype, membuf, ringbuf, tables
from tracekit.ingest.formats import HeaderEvent, HeaderPage

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"
BINARY = ["small.v7zstd.dat", "small.v6.dat", "overrun.v7zstd.dat", "rawcap",
          "vhost/graph.rawcap", "vhost/kprobe.rawcap"]  # fmt: skip


def _frames(path: Path) -> dict[str, pl.DataFrame]:
    """Every table of a trace, by name."""
    t = tracekit.open(path, use_cache=False)
    out = {"events": t.events, "lost": t.lost}
    out.update({f"event:{n}": t.event(n) for n in t.event_names})
    return out


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("limit", ["rows", "bytes"])
def test_tiny_blocks_and_batches_change_nothing(
    name: str, limit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One page per walk and blocks of 7 rows (or of 300 bytes of payload) give the same
    tables as the defaults."""
    whole = _frames(FIXTURES / name)
    monkeypatch.setattr(ringbuf, "PAGES_PER_WALK", 1)
    monkeypatch.setattr(bytype, "RARE_ROWS", 0)  # every type block by block
    if limit == "rows":
        monkeypatch.setattr(tables, "ROWS_PER_BLOCK", 7)
    else:
        monkeypatch.setattr(tables, "BYTES_PER_BLOCK", 300)
    blocks = _frames(FIXTURES / name)
    assert whole.keys() == blocks.keys()
    assert whole["events"].height > 7  # several blocks really ran
    for key, frame in whole.items():
        assert blocks[key].schema == frame.schema, key
        assert_frame_equal(blocks[key], frame, categorical_as_str=True)


@pytest.mark.parametrize("rows, nbytes", [(7, 1 << 30), (1 << 20, 500), (5, 500), (3, 1)])
def test_block_ends_keep_both_limits(rows: int, nbytes: int) -> None:
    """Blocks cover every row in order, none over `rows` rows, none over `nbytes` bytes
    unless it is one row (a row bigger than the budget is a block of its own)."""
    length = np.random.default_rng(rows + nbytes).integers(8, 2100, 1000)
    ends = bytype.block_ends(length, rows, nbytes)
    starts = np.r_[0, ends[:-1]]
    assert ends[-1] == len(length) and (ends > starts).all()
    assert (ends - starts <= rows).all()
    sizes = np.add.reduceat(length, starts)
    assert ((sizes <= nbytes) | (ends - starts == 1)).all()
    assert len(bytype.block_ends(length[:0], rows, nbytes)) == 0


@pytest.mark.parametrize("name", BINARY)
def test_rare_types_decoded_up_front_change_nothing(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of 7 rows, the event types with fewest rows decoded in one piece before
    the first block (up to half the rows) give the tables every type decoded
    block by block gives; and both kinds of type really occur."""
    monkeypatch.setattr(tables, "ROWS_PER_BLOCK", 7)
    monkeypatch.setattr(bytype, "RARE_ROWS", 0)
    by_block = _frames(FIXTURES / name)
    chosen: list[np.ndarray] = []
    pick = bytype._rare_ids

    def recorded(ids: np.ndarray, bounds: list[int], limit: int) -> np.ndarray:
        chosen.append(pick(ids, bounds, limit))
        return chosen[-1]

    monkeypatch.setattr(bytype, "_rare_ids", recorded)
    monkeypatch.setattr(bytype, "RARE_ROWS", by_block["events"].height // 2)
    up_front = _frames(FIXTURES / name)
    ids = set(by_block["events"]["event"].cast(pl.String))
    assert 0 < int(chosen[0].sum()) < len(ids)  # some types up front, others not
    assert up_front.keys() == by_block.keys()
    for key, frame in by_block.items():
        assert up_front[key].schema == frame.schema, key
        assert_frame_equal(up_front[key], frame, categorical_as_str=True)


def test_rare_ids_take_the_fewest_rows_within_the_limit() -> None:
    """Types by ascending row count while their rows add up to at most the limit; a type
    seen in one block only is left to it (nothing to save)."""
    ids = np.array([5] * 10 + [1, 2, 2, 3, 3, 3] + [9] * 4 + [1, 2, 3, 7], np.uint16)
    bounds = [10, 20, len(ids)]  # 7 in the last block only; 9 in the second only
    rare = bytype._rare_ids(ids, bounds, 6)
    assert np.flatnonzero(rare).tolist() == [1, 2]  # 1: 2 rows, 2: 3 rows; 3 (4) is over
    assert np.flatnonzero(bytype._rare_ids(ids, bounds, 100)).tolist() == [1, 2, 3]
    assert not bytype._rare_ids(ids, bounds, 1).any()


def _block_ends_whole(length: np.ndarray, rows: int, nbytes: int) -> np.ndarray:
    """block_ends as it was, by one running sum of every row: the reference."""
    upto = np.cumsum(length, dtype=np.int64)
    ends: list[int] = []
    at = 0
    while at < len(length):
        limit = (upto[at - 1] if at else 0) + nbytes
        end = max(int(np.searchsorted(upto, limit, side="right")), at + 1)
        at = min(end, at + rows, len(length))
        ends.append(at)
    return np.array(ends, np.int64)


@pytest.mark.parametrize("rows, nbytes", [(7, 1 << 30), (1 << 20, 500), (5, 500), (3, 1), (64, 0)])
def test_block_ends_block_by_block_equal_one_running_sum(rows: int, nbytes: int) -> None:
    """Summed a block at a time, in time order through `order` or not, the blocks are
    those one running sum of every row gives."""
    rng = np.random.default_rng(rows * 3 + nbytes)
    length = rng.integers(0, 2100, 5000).astype(np.int32)
    order = rng.permutation(len(length))
    want = _block_ends_whole(length[order], rows, nbytes)
    assert bytype.block_ends(length, rows, nbytes, order).tolist() == want.tolist()
    assert bytype.block_ends(length[order], rows, nbytes).tolist() == want.tolist()


def test_release_drops_whole_pages_inside_the_range_only() -> None:
    """Pages wholly inside [start, stop) read back as zeros; partial pages are kept."""
    page = membuf.PAGE
    buf = membuf.alloc(4 * page)
    buf[:] = 7
    dropped = membuf.release(buf, page // 2, 3 * page + 1)
    assert dropped == 2 * page
    assert (buf[:page] == 7).all() and (buf[3 * page :] == 7).all()
    assert (buf[page : 3 * page] == 0).all()


def test_release_leaves_ordinary_arrays_alone() -> None:
    """An array membuf did not map is never touched (nothing to hand back)."""
    plain = np.full(4 * membuf.PAGE, 7, dtype=np.uint8)
    assert membuf.release(plain, 0, len(plain)) == 0
    assert (plain == 7).all()


def test_release_works_through_views() -> None:
    """A slice of a mapped buffer releases the right pages of the whole mapping."""
    page = membuf.PAGE
    whole = membuf.alloc(4 * page)
    whole[:] = 1
    view = whole[page:]
    assert membuf.release(view, 0, page) == page
    assert (whole[page : 2 * page] == 0).all() and (whole[2 * page :] == 1).all()
    assert (whole[:page] == 1).all()


def test_row_arrays_are_released_behind_each_block_only() -> None:
    """The per-row arrays the releaser is given (payload offsets, lengths: sorted into
    mappings of their own) lose the whole pages before each block's end, no more."""
    rows = 3 * membuf.PAGE // 4  # int32: three pages
    order = np.arange(rows)[::-1].copy()
    payload = tables._taken(np.arange(rows, dtype=np.int32), order)
    length = tables._taken(np.full(rows, 5, np.int32), order)
    assert (payload == order).all()
    ends = np.array([membuf.PAGE // 4 + 10, rows], np.int64)  # block 0 ends past page 0
    spans = [bytype.CpuSpan(0, rows, 0, 0)]
    after = bytype.releaser(np.zeros(0, np.uint8), spans, np.zeros((2, 1), np.int64), [],
                            ends, (payload, length))  # fmt: skip
    after(0)
    page_rows = membuf.PAGE // 4
    assert (payload[:page_rows] == 0).all() and (length[:page_rows] == 0).all()
    assert (payload[page_rows:] == order[page_rows:]).all()  # block 1's rows are still there
    assert (length[page_rows:] == 5).all()
    after(1)
    assert not payload.any() and not length.any()


def test_bad_page_in_a_later_batch_stops_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """One page per walk: damage on page 2 keeps pages 0-1, names page 2's offset."""
    monkeypatch.setattr(ringbuf, "PAGES_PER_WALK", 1)
    hp, he = HeaderPage(), HeaderEvent()
    good = struct.pack("<I", (5 << 5) | 2) + struct.pack("<HHI", 7, 0, 1)  # 8-byte event
    pages = [struct.pack("<QQ", 10 * (p + 1), len(good)) + good for p in range(2)]
    pages.append(struct.pack("<QQ", 30, 8) + struct.pack("<II", 0, 4000))  # runs past commit
    buf = np.frombuffer(b"".join(p.ljust(hp.page_size, b"\0") for p in pages), np.uint8)
    with pytest.raises(ValueError, match=f"offset {2 * hp.page_size + 16}: record"):
        ringbuf.decode_pages(buf, hp, he, page_size=hp.page_size)
    rec = ringbuf.decode_pages(buf, hp, he, page_size=hp.page_size, salvage=True)
    assert rec.page.tolist() == [0, 1] and rec.ts.tolist() == [15, 25]
    assert rec.damage is not None and rec.damage.offset == 2 * hp.page_size + 16


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("waste", [1e9, 0.0])  # strings used in place (pinned), or copied
def test_strings_in_the_ring_buffer_survive_the_release_behind_blocks(
    name: str, waste: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every string column made by the wide path (its views point into the ring buffer
    itself when pinned) reads the same after tiny blocks released the pages around it:
    a released page reads back as zeros, so a pinned page released would show."""
    from tracekit.ingest import columns

    whole = _frames(FIXTURES / name)
    monkeypatch.setattr(columns, "WORDS_MAX", 0)  # every string through the wide path
    monkeypatch.setattr(columns, "WIDE_MIN", 0)
    monkeypatch.setattr(columns, "PIN_WASTE", waste)
    monkeypatch.setattr(tables, "ROWS_PER_BLOCK", 7)
    monkeypatch.setattr(bytype, "RARE_ROWS", 0)  # every type block by block
    blocks = _frames(FIXTURES / name)
    for key, frame in whole.items():
        assert_frame_equal(blocks[key], frame, categorical_as_str=True)
