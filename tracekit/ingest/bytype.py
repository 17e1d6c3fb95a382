"""The per-event-type tables of a binary trace, built a block of rows at a time.

Rows are in time order; each CPU's pages are in time order too, so decoding rows block
by block walks every CPU's ring-buffer data from its start to its end. After each block
the pages behind it are released (membuf): the ring buffer shrinks while the tables
grow, instead of both being whole at once (peak memory on big traces). Within a block
the rows are grouped by event id, so each field is still read for thousands of events at
once with numpy; the blocks of a table are joined without copying (one polars chunk each).
The event types with fewest rows in the whole trace are decoded once, before the first
block (a piece costs about the same whatever its rows: see _rare_ids).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.ingest import membuf
from tracekit.ingest.columns import (
    Gatherer,
    common_columns,
    field_column,
    fixed_span,
    has_standard_common,
)
from tracekit.ingest.formats import EventFormat, FormatSet
from tracekit.ingest.symcols import Symbols, add_symbol_columns
from tracekit.ingest.threads import map_threads

# The columns every typed table shows after `row`. The binary readers (and a bundle's or
# campaign's stack) store their typed tables without them: they are the events table's,
# and kept twice they were a third of a small-event trace's output (16 bytes an event).
# tables.Tables.event puts them back.
COMMON_COLUMNS = ("ts", "cpu", "common_pid")


@dataclass
class Common:
    """Per-event arrays shared by the events table and every typed table (row order)."""

    ts: np.ndarray  # int64 ns
    cpu: np.ndarray
    pid: np.ndarray
    flags: np.ndarray
    preempt: np.ndarray


@dataclass
class Decoder:
    """What decoding fields needs besides the rows: formats, strings, symbols."""

    formats: FormatSet
    printk: dict[int, str]
    long_size: int
    symbols: Symbols


@dataclass
class CpuSpan:
    """Where one CPU's records and bytes are in the merged (buffer-order) arrays."""

    first_event: int
    end_event: int
    first_byte: int
    end_byte: int


def block_ends(
    length: np.ndarray, rows_per_block: int, bytes_per_block: int, order: np.ndarray | None = None
) -> np.ndarray:
    """Where each block of rows ends: at most rows_per_block rows, and past a block's
    first row at most bytes_per_block bytes of payload (2 KB prints fill a block's
    ring buffer with a few rows: blocks by rows alone would release nothing).

    Row i's length is length[order[i]] when `order` is given. Summed a block's rows at a
    time: a running sum of every row (8 bytes a row) and the rows' lengths gathered in
    time order (4) were fresh memory, whose page faults cost more than the sum here
    (0.06-0.13 s of system time on 4 M rows).
    """
    n = len(length) if order is None else len(order)
    ends: list[int] = []
    at = 0
    while at < n:  # one step per block: a few hundred at most
        rows = slice(at, at + rows_per_block)
        part = length[rows] if order is None else length[order[rows]]
        upto = np.cumsum(part, dtype=np.int64)
        at += max(int(np.searchsorted(upto, bytes_per_block, side="right")), 1)
        ends.append(at)
    return np.array(ends, dtype=np.int64)


def release_cuts(
    order: np.ndarray, payload: np.ndarray, spans: list[CpuSpan], ends: np.ndarray
) -> np.ndarray:
    """(blocks x CPUs) byte offsets: once block k (rows up to ends[k]) is decoded, CPU
    c's bytes before cuts[k, c] are never read again.

    `order` sorts the buffer-order records by time. A CPU's byte is done once every
    record of that CPU up to it has a row in a finished block: a running maximum of
    the records' rows, searched for each block's end.
    """
    n = len(order)
    rank = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
    rank[order] = np.arange(n, dtype=rank.dtype)
    cuts = np.zeros((len(ends), len(spans)), dtype=np.int64)
    for c, s in enumerate(spans):
        if s.end_event == s.first_event:
            cuts[:, c] = s.end_byte
            continue
        done_upto = np.maximum.accumulate(rank[s.first_event : s.end_event])
        first_open = np.searchsorted(done_upto, ends, side="left")  # records before it are done
        open_at = payload[s.first_event + np.minimum(first_open, len(done_upto) - 1)]
        cuts[:, c] = np.where(first_open < len(done_upto), open_at, s.end_byte)
    return cuts


def table_names(formats: FormatSet) -> dict[str, int]:
    """How many formats share each event name (names used twice get their system)."""
    names: dict[str, int] = {}
    for f_name in formats.names.values():
        names[f_name] = names.get(f_name, 0) + 1
    return names


def table_name(fmt: EventFormat, names: dict[str, int]) -> str:
    """The per-event table name: the event name, qualified by system when ambiguous."""
    return fmt.name if names.get(fmt.name, 0) <= 1 else f"{fmt.system}:{fmt.name}"


def typed_tables(
    dec: Decoder,
    g: Gatherer,
    ids: np.ndarray,
    c: Common,
    have_header: bool,
    after_block: Callable[[int], None],
    ends: np.ndarray,
) -> tuple[dict[str, pl.DataFrame], dict[int, tuple[str, str]]]:
    """One typed table per event id present, and each id's (table name, system).

    Also fills the common arrays for formats whose common fields are not the standard
    8-byte header (have_header=False or an unusual layout). after_block(k) is called
    when block k's rows are decoded (to release the bytes behind them).
    """
    names = table_names(dec.formats)
    # polars imports numpy lazily, through a proxy that two threads must not resolve at
    # once (its _import copies numpy's namespace, numpy._globals included, over its own
    # _globals, and the second thread's assignment then raises TypeError): resolve it
    # here, before the pieces are decoded on several threads.
    pl.Series(np.zeros(0, np.int64))
    pieces: dict[int, list[pl.DataFrame]] = {}
    id_name: dict[int, tuple[str, str]] = {}

    def decode(rows: np.ndarray, skip: np.ndarray) -> None:
        """The pieces of the rows `rows` (in row order), one per event type not in `skip`."""
        # Ids are 16-bit: as uint16, numpy's stable sort is a radix sort.
        block = ids[rows]
        by_id = np.argsort(block.astype(np.uint16, copy=False), kind="stable")
        uniq, starts = _runs(block[by_id])
        by_id = rows[by_id]
        known: list[tuple[int, EventFormat, np.ndarray]] = []
        for ev_id, a, b in zip(uniq.tolist(), starts, [*starts[1:], len(block)], strict=True):
            fmt = dec.formats.get(ev_id)
            if fmt is None:  # kept, never dropped: the summary shows unknown ids
                id_name[ev_id] = (f"unknown_id_{ev_id}", "")
                continue
            id_name[ev_id] = (table_name(fmt, names), fmt.system)
            if not skip[ev_id]:
                known.append((ev_id, fmt, by_id[a:b]))
        # The event types of a block are decoded in parallel (numpy releases the GIL);
        # they write disjoint rows of the common arrays.
        done = map_threads(lambda job: _piece(dec, g, job[1], job[2], c, have_header), known)
        for (ev_id, _, _), piece in zip(known, done, strict=True):
            pieces.setdefault(ev_id, []).append(piece)

    bounds = ends.tolist()
    rare = _rare_ids(ids, bounds, RARE_ROWS)
    if rare.any():  # before the first block's release: their pages are all still there
        decode(np.flatnonzero(rare[ids]), np.zeros(len(rare), bool))
    for k, (lo, hi) in enumerate(zip([0, *bounds][: len(bounds)], bounds, strict=True)):
        decode(np.arange(lo, hi), rare)
        after_block(k)
    by_event = {
        id_name[i][0]: pl.concat(pieces[i], rechunk=False) if len(pieces[i]) > 1 else pieces[i][0]
        for i in sorted(pieces)
    }
    return by_event, id_name


# Rows of the whole trace decoded up front, in one piece per event type, for the types
# with fewest rows (see _rare_ids): at most a block's worth, so at most a block's
# temporaries (tables.ROWS_PER_BLOCK rows).
RARE_ROWS = 1 << 18


def _rare_ids(ids: np.ndarray, bounds: list[int], limit: int) -> np.ndarray:
    """Per 16-bit id, whether its rows are decoded in one piece before the blocks: the
    ids with fewest rows, together at most `limit` rows, that occur in more than one
    block. A piece costs about 1 ms whatever its rows (its DataFrame and Series, the
    symbol columns): on a sched/irq/timer trace 20 of 30 types have a few hundred rows
    each, spread over every block, and their pieces were a third of the typed tables."""
    count = np.zeros(1 << 16, np.int64)
    blocks = np.zeros(1 << 16, np.int64)
    for lo, hi in zip([0, *bounds][: len(bounds)], bounds, strict=True):
        here = np.bincount(ids[lo:hi].astype(np.uint16, copy=False), minlength=1 << 16)
        count += here
        blocks += here > 0
    rare = np.zeros(1 << 16, bool)
    candidates = np.flatnonzero(blocks > 1)
    candidates = candidates[np.argsort(count[candidates], kind="stable")]
    taken = np.cumsum(count[candidates])
    rare[candidates[taken <= limit]] = True
    return rare


def _piece(
    dec: Decoder, g: Gatherer, fmt: EventFormat, idx: np.ndarray, c: Common, have_header: bool
) -> pl.DataFrame:
    """The rows `idx` (all of one event type) of that type's table."""
    sub = Gatherer(g.buf, g.payload[idx], g.length[idx], g.endian)
    sub.pinned = g.pinned  # one list: the releaser reads it
    if not have_header or not has_standard_common(fmt):
        common = common_columns(sub, fmt)
        c.flags[idx] = common.get("common_flags", 0)
        c.preempt[idx] = common.get("common_preempt_count", 0)
        c.pid[idx] = common.get("common_pid", 0)
    span = fixed_span(fmt)
    if span is not None:
        sub.prefetch(*span)
    # Lean (tables.Tables.event): ts, cpu and common_pid are the events table's. A field
    # named like one of them is still renamed, as the whole table shows all four.
    # row as UInt32 while stored (4 bytes an event less; Tables.event shows it Int64)
    row = pl.Series("row", idx.astype(np.uint32 if len(c.ts) < 2**32 else np.int64))
    cols = [field_column(sub, s, dec.printk, dec.long_size) for s in fmt.own]
    # The prefetched words are copied into the columns: dropped before the symbol columns'
    # temporaries, not beside them (peak memory of a block: two pieces at once).
    sub.fixed = None
    cols = add_symbol_columns(cols, fmt.own, dec.symbols, dec.long_size)
    # Built from Series directly: with_columns would go through a lazy query per piece.
    return pl.DataFrame([row, *_unique_names(cols, {"row", *COMMON_COLUMNS})])


def _runs(grouped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of an array of equal runs, and where each run starts."""
    if not len(grouped):
        return grouped, np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], grouped[1:] != grouped[:-1])))
    return grouped[starts], starts


def _unique_names(cols: list[pl.Series], taken: set[str]) -> list[pl.Series]:
    """Rename fields that clash with the key columns (or, if corrupt, with each other)."""
    out = []
    for col in cols:
        name = col.name if col.name not in taken else f"field_{col.name}"
        while name in taken:
            name += "_"
        taken.add(name)
        out.append(col.alias(name))
    return out


def releaser(
    buf: np.ndarray,
    spans: list[CpuSpan],
    cuts: np.ndarray,
    pinned: list[tuple[int, int]],
    ends: np.ndarray | None = None,
    rows: tuple[np.ndarray, ...] = (),
) -> Callable[[int], None]:
    """after_block for typed_tables: release each CPU's bytes up to its cut, except the
    `pinned` ranges (columns point into them: columns.Gatherer.pinned), and the `rows`
    arrays (one element per row, time order: payload offsets, lengths) up to the block's
    end (`ends`): on a trace of many small events they are a fifth of the ring buffer."""

    def after_block(k: int) -> None:
        """Drop the bytes block k finished with (from the CPU's start: membuf rounds
        inwards to whole pages, so a page cut at the last block's end goes now)."""
        for c, s in enumerate(spans):
            for lo, hi in unpinned(s.first_byte, int(cuts[k, c]), pinned):
                membuf.release(buf, lo, hi)
        if ends is not None:
            for arr in rows:  # bytes as membuf counts them: the array's uint8 view
                membuf.release(arr.view(np.uint8), 0, int(ends[k]) * arr.itemsize)

    return after_block


def unpinned(start: int, stop: int, pinned: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, stop) without the pinned ranges, as ranges (membuf keeps partial pages)."""
    out, at = [], start
    for lo, hi in sorted(p for p in pinned if p[1] > start and p[0] < stop):
        if lo > at:
            out.append((at, lo))
        at = max(at, hi)
    if at < stop:
        out.append((at, stop))
    return out
