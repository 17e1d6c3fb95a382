"""A binary trace (from trace.dat or a raw capture) -> the events, per-event and lost tables.

Both binary containers are read into a `BinaryTrace`: formats, per-CPU ring-buffer data,
pid->comm, printk strings, per-CPU stats. `build_tables` decodes it the same way for
both. The table schemas are the contract documented in docs/tables.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest import membuf
from tracekit.ingest.bytype import (
    COMMON_COLUMNS,
    Common,
    CpuSpan,
    Decoder,
    block_ends,
    release_cuts,
    releaser,
    typed_tables,
)
from tracekit.ingest.columns import Gatherer, standard_header
from tracekit.ingest.formats import FormatSet
from tracekit.ingest.ringbuf import Records, decode_pages, page_headers
from tracekit.ingest.symcols import load_symbols
from tracekit.ingest.threads import map_threads

# Rows decoded together; after each block the ring-buffer pages behind it are released
# (bytype, membuf). A block of syscall events holds about 25 MB of ring buffer. A block's
# temporaries (two event types' pieces at once) come on top of the whole ring buffer in
# the first block: 2^19 rows put funcgraph's peak there (about 80 MB of them).
ROWS_PER_BLOCK = 1 << 18
BYTES_PER_BLOCK = 32 << 20  # and at most this much payload (large events: a few rows)

LOST_SCHEMA = {
    "cpu": pl.Int32,
    "ts": pl.Int64,
    "page": pl.Int64,
    "count": pl.Int64,
    "source": pl.String,
    "detail": pl.String,
}


@dataclass
class CpuData:
    """One CPU's raw ring-buffer pages and where they came from (for error messages)."""

    cpu: int
    data: np.ndarray  # uint8, a whole number of pages
    file_offset: int  # where data[0] is in the file it came from
    where: str  # the file (and section) holding it


@dataclass
class BinaryTrace:
    """Everything a binary container holds, independent of the container's layout."""

    path: str
    reader: str  # "trace.dat v7 (zstd)", "raw capture", ... named in errors
    formats: FormatSet
    cpus: list[CpuData]
    page_size: int
    endian: str = "<"
    long_size: int = 8
    cmdlines: dict[int, str] = field(default_factory=dict)
    tgids: dict[int, int] = field(default_factory=dict)
    printk: dict[int, str] = field(default_factory=dict)
    kallsyms: str = ""
    stats: dict[int, dict[str, str]] = field(default_factory=dict)
    stats_origin: str = "per_cpu/cpu<N>/stats"
    clock: str = ""
    instance: str = ""
    ts_offset: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # what --salvage left out


EVENTS_SCHEMA = {
    "row": pl.Int64, "ts": pl.Int64, "cpu": pl.Int32, "common_pid": pl.Int32, "tgid": pl.Int32,
    "comm": pl.Categorical, "event": pl.Categorical, "system": pl.Categorical,
    "flags": pl.UInt8, "preempt_count": pl.UInt8,
}  # fmt: skip


@dataclass
class Tables:
    """The decoded tables of one trace (or of one tool's output: then `tools` only).

    A typed table in `by_event` is either whole (row, ts, cpu, common_pid, fields) or
    lean (row, fields: no `ts`); `event(name)` gives it whole either way.
    """

    events: pl.DataFrame
    by_event: dict[str, pl.DataFrame]
    lost: pl.DataFrame
    meta: dict[str, Any]
    tools: dict[str, pl.DataFrame] = field(default_factory=dict)
    _row_is_position: bool | None = field(default=None, repr=False, compare=False)

    def event(self, name: str) -> pl.DataFrame:
        """The typed table NAME whole: a lean one gets ts, cpu, common_pid from the events
        table, gathered at its rows (a few ms per million rows; its own columns shared)."""
        table = self.by_event[name]
        if "ts" in table.columns:
            return table
        common = self.events.select(COMMON_COLUMNS)
        if self._positional():
            common = common.gather(table["row"])
        else:  # rows not numbered by position (a hand-made events table): by key
            keyed = self.events.select("row", *COMMON_COLUMNS)
            rows = table.select(pl.col("row").cast(pl.Int64))
            common = rows.join(keyed, on="row", how="left", maintain_order="left")
            common = common.drop("row")
        row = table.select(pl.col("row").cast(pl.Int64))  # UInt32 as the binary readers store it
        return pl.concat([row, common, table.drop("row")], how="horizontal")

    def _positional(self) -> bool:
        """Whether the events table's `row` is each row's position (every reader's is)."""
        if self._row_is_position is None:
            rows = self.events["row"].to_numpy()
            self._row_is_position = bool((rows == np.arange(len(rows))).all())
        return self._row_is_position


def lean(table: pl.DataFrame) -> pl.DataFrame:
    """A typed table without the columns `Tables.event` takes from the events table."""
    return table.drop(COMMON_COLUMNS, strict=False) if "ts" in table.columns else table


def parse_stats(text: str) -> dict[str, str]:
    """A per_cpu/cpuN/stats file -> {key: value} (values kept as text)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_cmdlines(text: str) -> dict[int, str]:
    """saved_cmdlines ("pid comm" lines) -> {pid: comm}."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        pid, _, comm = line.strip().partition(" ")
        if pid.isdigit():
            out[int(pid)] = comm
    return out


def parse_tgids(text: str) -> dict[int, int]:
    """saved_tgids ("pid tgid" lines) -> {pid: tgid}."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            out[int(parts[0])] = int(parts[1])
    return out


def parse_printk(text: str) -> dict[int, str]:
    """printk_formats (`0xaddr : "string"` lines) -> {address: string}."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        addr, sep, rest = line.partition(" : ")
        if not sep:
            continue
        try:
            value = int(addr.strip(), 16)
        except ValueError:
            continue
        rest = rest.strip()
        if len(rest) >= 2 and rest[0] == '"' and rest[-1] == '"':
            rest = rest[1:-1]
        out[value] = rest.replace("\\n", "\n")
    return out


def _decode_cpu(trace: BinaryTrace, cpu: CpuData, salvage: bool) -> Records:
    """Decode one CPU's pages, naming the reader, file and offset when they are bad."""
    fs = trace.formats
    try:
        rec = decode_pages(
            cpu.data, fs.header_page, fs.header_event, page_size=trace.page_size,
            endian=trace.endian, base_offset=cpu.file_offset, salvage=salvage,
        )  # fmt: skip
    except ValueError as err:
        raise TracekitError(
            f"{trace.reader} reader: {cpu.where}: CPU {cpu.cpu}: byte {err}; the file is "
            "truncated or corrupt (use --salvage to read up to the damage)"
        ) from None
    membuf.trim()  # this walk's temporaries, before the other CPUs' walks end (peak memory)
    return rec


def build_tables(trace: BinaryTrace, salvage: bool = False, symbols: Path | None = None) -> Tables:
    """Decode all CPUs and build the events, per-event and lost tables.

    Address fields get `_sym` columns from `symbols` (a kallsyms copy or vmlinux), or
    from the trace's own kallsyms copy when none is given. `trace` is consumed: its
    ring-buffer data and kallsyms text are dropped once decoded (peak memory).
    """
    syms = load_symbols(trace.kallsyms, symbols, trace.path)
    trace.kallsyms = ""  # parsed into syms: megabytes of text nothing reads again
    decoded = map_threads(lambda c: _decode_cpu(trace, c, salvage), trace.cpus)  # GIL released
    membuf.trim()  # the page walks' temporaries, freed in their threads' heaps
    parts = list(zip(trace.cpus, decoded, strict=True))
    for c, rec in parts:
        if rec.damage:
            trace.skipped.append(
                f"CPU {c.cpu}: pages from byte offset {rec.damage.offset} of {c.where} on "
                f"({rec.damage.reason})"
            )
    lost = _lost_table(trace, parts)
    for c in trace.cpus:  # its page headers' read mapped every page of a mapped trace.dat
        membuf.drop_file_pages(c.data)
    meta = dict(trace.meta)
    meta.update(
        reader=trace.reader, clock=trace.clock, instance=trace.instance, symbols=syms.source,
        page_size=trace.page_size, cpus=[c.cpu for c in trace.cpus], skipped=trace.skipped,
        cpu_bytes=sum(len(c.data) for c in trace.cpus),
    )  # fmt: skip
    merged = _merge(parts)
    del parts  # the per-CPU record arrays: peak memory matters on big traces
    membuf.trim()  # the per-CPU record arrays, back to the OS before the tables
    order = np.argsort(merged.ts, kind="stable")  # ties: lower CPU first, then record order
    ends = block_ends(merged.length, ROWS_PER_BLOCK, BYTES_PER_BLOCK, order)
    pinned: list[tuple[int, int]] = []  # bytes the wide strings' columns point into
    cuts = release_cuts(order, merged.payload, merged.spans, ends)
    merged.sort(order)
    del order
    after_block = releaser(merged.buf, merged.spans, cuts, pinned, ends, merged.row_arrays())
    membuf.trim()  # the sort's old copies
    g = Gatherer(merged.buf, merged.payload, merged.length, trace.endian)
    g.pinned = pinned
    header = _standard_header(g) if len(g.payload) else None
    if header is not None:
        ids = header["common_type"]
    else:
        ids = g.ints(0, 2, False).astype(np.uint16) if len(g.payload) else np.zeros(0, np.uint16)
        membuf.drop_file_pages(merged.buf)
    membuf.trim()  # the header's temporaries: glibc keeps up to 64 MB free at a heap's top
    dec = Decoder(trace.formats, trace.printk, trace.long_size, syms)
    del syms  # dec holds it only until the typed tables are built
    ts, cpu = merged.ts, merged.cpu
    del merged
    events, by_event = _event_tables(trace, dec, g, ids, ts, cpu, header, after_block, ends)
    return Tables(events, by_event, lost, meta)


HEADER_ROWS = 1 << 20  # rows of the standard header read at once from a mapped file


def _standard_header(g: Gatherer) -> dict[str, np.ndarray] | None:
    """columns.standard_header of every row; from a trace.dat mapped from disk, HEADER_ROWS
    rows at a time, the file's pages unmapped after each (membuf.drop_file_pages): the
    read maps every page of the ring buffer, and the typed tables map them again block
    by block, so between the walk and them the process holds a part of it, not all."""
    if not membuf.maps_file(g.buf) or len(g.payload) <= HEADER_ROWS:
        header = standard_header(g)
        membuf.drop_file_pages(g.buf)
        return header
    parts = []
    for at in range(0, len(g.payload), HEADER_ROWS):
        sub = Gatherer(g.buf, g.payload[at : at + HEADER_ROWS], g.length[at : at + HEADER_ROWS])
        part = standard_header(sub)
        membuf.drop_file_pages(g.buf)
        if part is None:
            return None
        parts.append(part)
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


@dataclass
class _Merged:
    """All CPUs' records in buffer order (CPU by CPU), offsets into one buffer."""

    buf: np.ndarray
    ts: np.ndarray  # uint64 raw clock
    payload: np.ndarray  # int32 (int64 when the buffer is 2 GiB or more)
    length: np.ndarray  # int32: an event is shorter than a page
    cpu: np.ndarray  # int32
    spans: list[CpuSpan]

    def sort(self, order: np.ndarray) -> None:
        """Put the records in time order; one array at a time, so only one old copy is
        alive at once (peak memory)."""
        self.ts = self.ts[order]
        self.payload = _taken(self.payload, order)
        self.length = _taken(self.length, order)
        self.cpu = self.cpu[order]

    def row_arrays(self) -> tuple[np.ndarray, ...]:
        """The per-record arrays only the typed tables read, row by row in time order:
        their pages behind each block can go (bytype.releaser)."""
        return self.payload, self.length


def _taken(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """values[order] in a mapping of its own (membuf.alloc), so that its pages can be
    released behind the typed tables' blocks; every page is written, so mapped at once."""
    out = membuf.alloc(len(order) * values.itemsize, populate=True).view(values.dtype)
    if len(order):
        np.take(values, order, out=out)
    return out


def _merge(parts: list[tuple[CpuData, Records]]) -> _Merged:
    """One buffer and one set of record arrays for all CPUs (offsets rebased).

    The merged arrays are filled CPU by CPU and each CPU's own arrays are dropped once
    copied, so the records are never all there twice.
    """
    total = sum(len(c.data) for c, _ in parts)
    n = sum(len(rec.ts) for _, rec in parts)
    m = _Merged(
        np.zeros(0, np.uint8), np.empty(n, np.uint64),
        np.empty(n, np.int32 if total < 2**31 else np.int64), np.empty(n, np.int32),
        np.empty(n, np.int32), [],
    )  # fmt: skip
    base = at = 0
    for c, rec in parts:
        end = at + len(rec.ts)
        m.ts[at:end], m.payload[at:end] = rec.ts, rec.payload
        m.payload[at:end] += base  # in the merged dtype: the CPU's own may be narrower
        m.length[at:end], m.cpu[at:end] = rec.length, c.cpu
        rec.ts = rec.payload = rec.length = rec.page = np.zeros(0, np.int64)
        m.spans.append(CpuSpan(at, end, base, base + len(c.data)))
        base, at = base + len(c.data), end
    bufs = [c.data for c, _ in parts]
    if bufs:
        joined = _contiguous(bufs)
        m.buf = np.concatenate(bufs) if joined is None else joined
    return m


def _contiguous(bufs: list[np.ndarray]) -> np.ndarray | None:
    """The CPU buffers as one array without copying, when they lie back to back in memory
    (one CPU, a trace.dat mapped from disk, or data decompressed into one array)."""
    if len(bufs) == 1:
        return bufs[0]
    base = bufs[0].base
    if base is None or any(b.base is not base for b in bufs):
        return None
    ptrs = [b.__array_interface__["data"][0] for b in bufs]
    if any(p + len(b) != q for p, b, q in zip(ptrs, bufs, ptrs[1:], strict=False)):
        return None
    whole = np.frombuffer(base, dtype=np.uint8)
    start = ptrs[0] - whole.__array_interface__["data"][0]
    return whole[start : start + sum(len(b) for b in bufs)]


def _event_tables(
    trace: BinaryTrace,
    dec: Decoder,
    g: Gatherer,
    ids: np.ndarray,
    raw_ts: np.ndarray,
    cpu: np.ndarray,
    header: dict[str, np.ndarray] | None,
    after_block: Callable[[int], None],
    ends: np.ndarray,
) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
    """The events table and one typed table per event type present."""
    n = len(ids)
    raw_ts += np.uint64(trace.ts_offset & 0xFFFFFFFFFFFFFFFF)  # in place: no second copy
    ts = raw_ts.view(np.int64)
    if header is not None:
        c = Common(ts, cpu, header["common_pid"], header["common_flags"],
                   header["common_preempt_count"])  # fmt: skip
    else:
        c = Common(ts, cpu, np.zeros(n, np.int32), np.zeros(n, np.uint8), np.zeros(n, np.uint8))
    by_event, id_name = typed_tables(dec, g, ids, c, header is not None, after_block, ends)
    # Every field is decoded: free the ring-buffer bytes, offsets and symbol index before
    # the events table (the last big allocation: peak memory is reached there).
    g.buf = g.payload = g.length = np.zeros(0, np.uint8)
    dec.symbols = replace(dec.symbols, table=None)
    for cpu_data in trace.cpus:
        cpu_data.data = cpu_data.data[:0]
    membuf.trim()
    events = _events_frame(trace, ids, c, id_name)
    membuf.trim()
    return events, by_event


# Small non-negative keys (pids up to pid_max, 16-bit event ids) use a lookup table.
LUT_LIMIT = 1 << 23


def _lookup(values: np.ndarray) -> tuple[list[int], Callable[[pl.Series], pl.Series]]:
    """The distinct values, and a function turning a column of one entry per distinct
    value (in that order) into its entry per row.

    For small non-negative integers a lookup table by value, which polars gathers at the
    rows as they are: in two linear passes, far cheaper than np.unique's full sort of
    millions of rows, and with no per-row array of codes of our own (4 bytes an event
    each, held in the C heap beside the columns: the events table's peak).
    """
    if len(values) and values.min() >= 0 and values.max() < LUT_LIMIT:
        seen = np.zeros(int(values.max()) + 1, dtype=bool)  # not bincount: 1 byte a value
        seen[values] = True
        present = np.flatnonzero(seen)
        lut = np.zeros(len(seen), dtype=np.uint32)
        lut[present] = np.arange(len(present), dtype=np.uint32)
        by_value, rows = pl.Series(lut), pl.Series(values)
        return present.tolist(), lambda per: per.gather(by_value).gather(rows)
    distinct, at = np.unique(values, return_inverse=True)
    codes = pl.Series(at.ravel().astype(np.uint32))
    return distinct.tolist(), lambda per: per.gather(codes)


def _events_frame(
    trace: BinaryTrace, ids: np.ndarray, c: Common, id_name: dict[int, tuple[str, str]]
) -> pl.DataFrame:
    """The events table; comm/tgid/event/system are gathered from small per-pid and
    per-id columns, so no string is built per event.

    Peak memory is reached here: the row numbers, which need no lookup, come last.
    """
    uniq, by_id = _lookup(ids)
    event = pl.Series([id_name[i][0] for i in uniq], dtype=pl.Categorical)
    system = pl.Series([id_name[i][1] for i in uniq], dtype=pl.Categorical)
    cols = {"event": by_id(event), "system": by_id(system)}
    pids, by_pid = _lookup(c.pid)
    comms = {**trace.cmdlines, 0: "<idle>"}
    comm = pl.Series([comms.get(p) for p in pids], dtype=pl.Categorical)
    tgid = pl.Series([trace.tgids.get(p) for p in pids], dtype=pl.Int32)
    if tgid.null_count() == len(tgid):  # no saved_tgids (trace-cmd's usual trace.dat)
        # A column of nulls made whole: its zeroed values are never written, so they take
        # no memory (a gather writes 4 bytes an event).
        cols["tgid"] = pl.repeat(None, len(ids), dtype=pl.Int32, eager=True)
    else:
        cols["tgid"] = by_pid(tgid)
    cols["comm"] = by_pid(comm)
    return pl.DataFrame(
        {
            "row": np.arange(len(ids), dtype=np.int64), "ts": c.ts, "cpu": c.cpu,
            "common_pid": c.pid, "tgid": cols["tgid"], "comm": cols["comm"],
            "event": cols["event"], "system": cols["system"],
            "flags": pl.Series(c.flags, dtype=pl.UInt8),
            "preempt_count": pl.Series(c.preempt, dtype=pl.UInt8),
        }
    )  # fmt: skip


def _lost_table(trace: BinaryTrace, parts: list[tuple[CpuData, Records]]) -> pl.DataFrame:
    """Every lost-events source: page flags and the per-CPU stats counters."""
    rows: list[dict[str, Any]] = []
    for c, rec in parts:
        for p in np.flatnonzero(rec.page_missed):
            count = int(rec.page_lost[p])
            rows.append(
                dict(
                    cpu=c.cpu, ts=int(rec.page_ts[p]) + trace.ts_offset, page=int(p),
                    count=None if count < 0 else count, source="page_flag",
                    detail=f"{c.where} page {int(p)}",
                )
            )  # fmt: skip
    rows += _unread_by_stats(trace, parts) + _empty_pages(trace, parts)
    for cpu, stats in sorted(trace.stats.items()):
        for key, source in (
            ("overrun", "stats_overrun"),
            ("dropped events", "stats_dropped"),
            ("commit overrun", "stats_commit_overrun"),
            ("entries", "stats_unread"),
        ):
            value = stats.get(key, "0")
            count = _count(value)
            if count != 0:  # a damaged counter is a report too, its count unknown
                rows.append(
                    dict(
                        cpu=cpu, ts=None, page=None, count=count, source=source,
                        detail=f"{trace.stats_origin}: {key}"
                        + ("" if count is not None else f" {value[:30]!r} is not a count"),
                    )
                )  # fmt: skip
    return pl.DataFrame(rows, schema=LOST_SCHEMA)


def _empty_pages(trace: BinaryTrace, parts: list[tuple[CpuData, Records]]) -> list[dict[str, Any]]:
    """Pages whose commit word says 0 bytes: the kernel hands out no empty page (a read of
    trace_pipe_raw waits for data), so the page was zeroed or damaged and its events are
    lost, how many unknown."""
    rows: list[dict[str, Any]] = []
    for c, rec in parts:
        _, size, _, _ = page_headers(c.data, trace.formats.header_page, trace.page_size,
                                     trace.endian)  # fmt: skip
        for p in np.flatnonzero(size[: len(rec.page_ts)] == 0):
            rows.append(
                dict(
                    cpu=c.cpu, ts=int(rec.page_ts[p]) + trace.ts_offset, page=int(p), count=None,
                    source="empty_page", detail=f"{c.where} page {int(p)}: commit 0",
                )
            )  # fmt: skip
    return rows


def _count(text: str) -> int | None:
    """A stats counter's value as a count; None when it is not one (damaged stats)."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def _unread_by_stats(
    trace: BinaryTrace, parts: list[tuple[CpuData, Records]]
) -> list[dict[str, Any]]:
    """Events a CPU's stats say were read out of the ring buffer that the capture does
    not hold (its pages missing, empty, cut or not listed): lost, source stats_read."""
    decoded = {c.cpu: len(rec.ts) for c, rec in parts}
    rows: list[dict[str, Any]] = []
    for cpu, stats in sorted(trace.stats.items()):
        read = _count(stats.get("read events", "0"))
        if read is None or read <= decoded.get(cpu, 0):
            continue  # a damaged `read events` is not a count to compare
        got = decoded.get(cpu)
        held = f"{got} in its pages" if got is not None else "no pages for this CPU"
        rows.append(
            dict(
                cpu=cpu, ts=None, page=None, count=read - (got or 0), source="stats_read",
                detail=f"{trace.stats_origin}: read events {read}, the capture holds {held}",
            )
        )  # fmt: skip
    return rows
