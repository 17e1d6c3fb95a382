"""The ingest's fast paths give exactly what the paths they short-cut give.

Every held trace (trace.dat files and raw captures under tests/fixtures, the public
corpus when it is there) is decoded twice, with and without the fast path, and every
table must be equal. Generated rows cover what real traces rarely hold: bytes after a
string's NUL, strings of every length up to their field, widths that are no multiple of
a word, and rows whose keys collide.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit
from tracekit.ingest import arrowbuf, chars, columns, membuf, tables
from tracekit.ingest.columns import Gatherer

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
HELD = sorted(FIXTURES.rglob("*.dat")) + sorted(p.parent for p in FIXTURES.rglob("capture.json"))
CORPUS_DATS = sorted(CORPUS.glob("*.trace.dat")) if CORPUS.is_dir() else []


def _tables(path: Path) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
    """The events table and every per-event table of one trace."""
    trace = tracekit.open(path, use_cache=False)
    return trace.events, {name: trace.event(name) for name in trace.event_names}


@pytest.mark.parametrize("path", HELD + CORPUS_DATS, ids=lambda p: p.name)
@pytest.mark.parametrize("wide", [False, True])  # as it is, or every string cut one by one
def test_string_words_equal_the_byte_path(
    path: Path, wide: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if wide:
        monkeypatch.setattr(columns, "WORDS_MAX", 0)
        monkeypatch.setattr(columns, "WIDE_MIN", 0)
    fast_events, fast = _tables(path)
    monkeypatch.setattr(columns, "WORDS_MAX", 0)  # every string through the byte path
    monkeypatch.setattr(columns, "WIDE_MIN", 1 << 30)
    slow_events, slow = _tables(path)
    assert fast_events.equals(slow_events)
    assert fast.keys() == slow.keys()
    for name, table in slow.items():
        assert fast[name].equals(table), name


def _generated(
    rng: np.random.Generator, rows: int, width: int, names: int, aligned: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """A buffer of `rows` fields of `width` bytes (names from a pool, garbage after the
    NUL), their start offsets (4-aligned or not), byte counts, and the strings they must
    decode to."""
    pool = [
        rng.integers(33, 127, rng.integers(0, width + 1)).astype(np.uint8).tobytes()
        for _ in range(names)
    ]
    pick = rng.integers(0, names, rows)
    stride = -(-width // 4) * 4 + 4
    buf = rng.integers(0, 256, rows * stride + 64).astype(np.uint8)
    start = np.arange(rows, dtype=np.int64) * stride
    if not aligned:
        start += rng.integers(0, 3, rows)
    count = rng.integers(0, width + 1, rows)
    want = []
    for i, p in enumerate(pick):
        text = pool[p]
        buf[start[i] : start[i] + len(text)] = np.frombuffer(text, np.uint8)
        if len(text) < width:
            buf[start[i] + len(text)] = 0  # the NUL; what follows stays garbage
        want.append(text[: count[i]].decode())
    return buf, start, count, want


@pytest.mark.parametrize("width", [1, 7, 8, 13, 16, 20, 64, 65, 300])  # past 64: bytes
@pytest.mark.parametrize("names", [3, 5000])  # deduplicated, and too varied for it
@pytest.mark.parametrize("aligned", [True, False])  # read as words, or as bytes
def test_string_words_cut_at_nul_and_count(width: int, names: int, aligned: bool) -> None:
    rng = np.random.default_rng(width * 7 + names)
    buf, start, count, want = _generated(rng, 6000, width, names, aligned)
    got = Gatherer(buf, start, count).strings(start, count)
    assert got.dtype == pl.String and got.to_list() == want


@pytest.mark.parametrize("width", [8, 16, 20, 64])
@pytest.mark.parametrize("names", [3, 5000])
@pytest.mark.parametrize("varied", [True, False])  # bytes after the NUL: random, or one per name
def test_fixed_width_strings_cut_at_nul(width: int, names: int, varied: bool) -> None:
    """char[N] fields: every row's count is the field's width (its words unmasked), the
    rows deduplicated as they are and the distinct ones cut at their NUL, or every row
    cut first when the bytes after their NUL vary."""
    rng = np.random.default_rng(width * 11 + names)
    buf, start, count, want = _generated(rng, 6000, width, names, aligned=True)
    if not varied:  # equal names, equal rows: the bytes after the NUL must still go
        for i in range(len(start)):
            field = buf[start[i] : start[i] + width]
            nul = np.flatnonzero(field == 0)
            if len(nul):
                field[nul[0] + 1 :] = ord("A")
    count = np.full(len(start), width)
    want = [bytes(buf[a : a + width]).split(b"\0")[0].decode() for a in start.tolist()]
    got = Gatherer(buf, start, count).strings(start, count)
    assert got.dtype == pl.String and got.to_list() == want


@pytest.mark.parametrize("width", [257, 300, 2000])
@pytest.mark.parametrize("owner", ["bytes", "mmap"])  # the memories cut one by one
# one span; a span per string (gap 0: any byte between cuts); spans cut by their size
@pytest.mark.parametrize("gap, most", [(columns.SPAN_GAP, columns.SPAN_MAX), (0, 1 << 30),
                                       (columns.SPAN_GAP, 5000)])  # fmt: skip
@pytest.mark.parametrize("shuffled", [False, True])  # rows in buffer order, or not (CPUs)
def test_wide_strings_cut_at_nul_and_count(
    width: int, owner: str, gap: int, most: int, shuffled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(columns, "SPAN_GAP", gap)
    monkeypatch.setattr(columns, "SPAN_MAX", most)
    rng = np.random.default_rng(width)
    buf, start, count, want = _generated(rng, 2000, width, 50)
    if shuffled:
        order = rng.permutation(len(start))
        start, count, want = start[order], count[order], [want[i] for i in order]
    if owner == "bytes":
        held = np.frombuffer(buf.tobytes(), np.uint8)
    else:
        held = membuf.alloc(len(buf))
        held[:] = buf
    assert membuf.byte_source(held[8:]) is not None  # the wide path, not the byte path
    got = Gatherer(held, start, count).strings(start, count)
    assert got.dtype == pl.String and got.to_list() == want


def test_spans_of_int32_offsets_past_one_gib_are_shared() -> None:
    """Offsets come as int32 (a buffer under 2 GiB): neighbours at 1.5 GiB share a span
    (lo + SPAN_MAX once wrapped there, and every string got a span of its own)."""
    start = (np.arange(100, dtype=np.int64) * 2100 + (3 << 29)).astype(np.int32)
    length = np.full(100, 2000, np.int32)
    spans, data_of, data_at = columns._spans(start, length)
    assert spans == [(3 << 29, (3 << 29) + 99 * 2100 + 2000)]
    assert (data_of == 0).all() and (data_at == np.arange(100) * 2100).all()


def test_wide_strings_decode_bad_utf8_with_replacement() -> None:
    text = b"ok \xff\xfe " * 40 + b"\0tail"
    held = np.frombuffer(text * 3, np.uint8)
    start, count = np.arange(3) * len(text), np.full(3, len(text))
    got = Gatherer(held, start, count).strings(start, count).to_list()
    assert got == [text.split(b"\0")[0].decode("utf-8", "replace")] * 3


@pytest.mark.parametrize("dtype", sorted(arrowbuf.INT_FORMATS, key=str))
@pytest.mark.parametrize("n", [0, 1, 300_000])
def test_empty_lists_equal_a_gathered_empty_list(dtype: np.dtype, n: int) -> None:
    """An all-empty flexible array (function_graph's args[]) as offsets nobody writes:
    the same column as one empty list gathered, and let go when polars drops it."""
    got = arrowbuf.empty_lists(n, dtype)
    want = pl.Series(np.zeros(0, dtype)).implode().gather(np.zeros(n, np.uint32))
    assert got.dtype == want.dtype and got.equals(want)
    assert pl.concat([got, got]).list.len().sum() == 0
    assert got.filter(pl.Series(np.ones(n, bool))).equals(want)
    del got
    assert not arrowbuf._alive


@pytest.mark.parametrize("path", [p for p in HELD if p.suffix == ".dat"], ids=lambda p: p.name)
def test_file_pages_unmapped_between_reads_give_the_same_tables(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace.dat mapped from disk has its pages unmapped after each read of them (the
    page headers, each walk batch, each HEADER_ROWS of the header): the same tables as
    with the pages kept."""
    monkeypatch.setattr(tables, "HEADER_ROWS", 7)  # the header in many parts
    dropped_events, dropped = _tables(path)
    monkeypatch.setattr(membuf, "drop_file_pages", lambda *_args, **_kw: 0)
    kept_events, kept = _tables(path)
    assert dropped_events.equals(kept_events) and dropped.keys() == kept.keys()
    for name, table in kept.items():
        assert dropped[name].equals(table), name


def test_file_pages_read_back_and_anonymous_memory_is_kept(tmp_path: Path) -> None:
    data = np.random.default_rng(5).integers(0, 256, 5 * membuf.PAGE, dtype=np.uint8)
    path = tmp_path / "pages"
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f:
        mapped = np.frombuffer(memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)),
                               np.uint8)  # fmt: skip
    assert membuf.maps_file(mapped) and membuf.drop_file_pages(mapped) == len(data)
    assert (mapped == data).all()  # mapped again from the file
    anon = membuf.alloc(len(data))
    anon[:] = data
    assert not membuf.maps_file(anon) and membuf.drop_file_pages(anon) == 0
    assert (anon == data).all()


def test_colliding_keys_fall_back_to_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chars, "MIX", np.uint64(0))  # every row of 2+ words has key 0
    rng = np.random.default_rng(3)
    buf, start, count, want = _generated(rng, 3000, 16, 4)
    assert Gatherer(buf, start, count).strings(start, count).to_list() == want


def test_keys_sharing_a_slot_are_told_apart_by_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chars, "SLOT_BITS", 1)  # two slots for forty names
    rng = np.random.default_rng(4)
    buf, start, count, want = _generated(rng, 3000, 16, 40, aligned=True)
    assert Gatherer(buf, start, count).strings(start, count).to_list() == want


@pytest.mark.parametrize("nbytes", [4, 8, 12, 16, 56, 128])
def test_word_gather_reads_each_events_words(nbytes: int) -> None:
    rng = np.random.default_rng(nbytes)
    buf = rng.integers(0, 256, 4096).astype(np.uint8)
    addr = np.sort(rng.integers(0, (4096 - nbytes) // 4 + 1, 500)) * 4
    got = Gatherer(buf, addr, np.full(500, nbytes))._word_matrix(addr, nbytes)
    words = buf.view(np.uint32)
    want = np.stack([words[a // 4 : a // 4 + nbytes // 4] for a in addr])
    assert got is not None and np.array_equal(got, want)


@pytest.mark.parametrize("width", [1, 3, 16, 100])
def test_byte_gather_reads_each_events_bytes(width: int) -> None:
    rng = np.random.default_rng(width)
    buf = rng.integers(0, 256, 4099).astype(np.uint8)
    offset = rng.integers(0, 4099 - width + 1, 500)
    got = Gatherer(buf, offset, np.full(500, width))._bytes(offset, width)
    assert np.array_equal(got, np.stack([buf[o : o + width] for o in offset]))


def test_wide_strings_keep_their_span_copies_until_polars_drops_them() -> None:
    import gc

    from tracekit.ingest import arrowbuf

    text = b"x" * 300 + b"\0"
    held = np.frombuffer(text * 4, np.uint8)
    start, count = np.arange(4) * len(text), np.full(4, len(text))
    before = len(arrowbuf._alive)
    got = Gatherer(held, start, count).strings(start, count)
    kept = got.filter(pl.Series([True, False, True, False]))  # shares the buffers
    del got
    gc.collect()
    assert kept.to_list() == ["x" * 300] * 2 and len(arrowbuf._alive) > before
    del kept
    gc.collect()
    assert len(arrowbuf._alive) == before  # released: the copies are gone


def test_wide_strings_point_into_private_memory_only(tmp_path: Path) -> None:
    import mmap

    text = (b"y" * 300 + b"\0") * 4
    start, count = np.arange(4) * 301, np.full(4, 301)
    held = membuf.alloc(len(text))
    held[:] = np.frombuffer(text, np.uint8)
    private = Gatherer(held, start, count)
    assert private.strings(start, count).to_list() == ["y" * 300] * 4
    assert private.pinned  # used in place: this process's own memory
    path = tmp_path / "strings.bin"
    path.write_bytes(text)
    with open(path, "rb") as f:
        mapped = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
    from_file = Gatherer(mapped, start, count)
    got = from_file.strings(start, count)
    path.write_bytes(b"z" * len(text))  # the file rewritten: the column must not change
    assert got.to_list() == ["y" * 300] * 4 and not from_file.pinned


@pytest.mark.parametrize(
    "values",
    [
        np.array([7, 3, 7, 0, 3, 3, 65535], np.uint16),  # event ids: the lookup table
        np.array([4000, 0, 17, 4000, 4194303], np.int32),  # pids up to pid_max: the table
        np.array([-1, 5, -1, 2, 5], np.int32),  # a negative pid: np.unique
        np.array([1 << 30, 5, 1 << 30], np.int64),  # past LUT_LIMIT: np.unique
        np.zeros(0, np.int32),
    ],
)
def test_lookup_gives_each_rows_entry(values: np.ndarray) -> None:
    """The events table's per-value columns: the distinct values in ascending order, and
    a per-value column turned into each row's entry, by table or by np.unique alike."""
    keys, per_row = tables._lookup(values)
    assert keys == sorted(set(values.tolist()))
    names = pl.Series([f"n{k}" for k in keys], dtype=pl.Categorical)
    got = per_row(names)
    assert got.dtype == pl.Categorical
    assert got.cast(pl.String).to_list() == [f"n{v}" for v in values.tolist()]
    tgid = pl.Series([k + 1 if k % 2 else None for k in keys], dtype=pl.Int32)
    assert per_row(tgid).to_list() == [v + 1 if v % 2 else None for v in values.tolist()]


@pytest.mark.parametrize("path", HELD, ids=lambda p: p.name)
def test_events_table_by_lookup_table_equals_by_unique(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events table's event, system, comm and tgid by lookup tables (ids, pids) equal
    those np.unique's codes give, on every held trace."""
    fast, _ = _tables(path)
    monkeypatch.setattr(tables, "LUT_LIMIT", 0)
    slow, _ = _tables(path)
    assert fast.schema == slow.schema
    assert_frame_equal(fast, slow, categorical_as_str=True)
