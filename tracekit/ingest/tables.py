"""A binary trace (from trace.dat or a raw capture) -> the events, per-event and lost tables.

Both binary containers are read into a `BinaryTrace`: formats, per-CPU ring-buffer data,
pid->comm, printk strings, per-CPU stats. `build_tables` decodes it the same way for
both. The table schemas are the contract documented in docs/tables.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest.columns import (
    Gatherer,
    common_columns,
    field_column,
    has_standard_common,
    standard_header,
)
from tracekit.ingest.formats import EventFormat, FormatSet
from tracekit.ingest.ringbuf import Records, decode_pages
from tracekit.ingest.symcols import Symbols, add_symbol_columns, load_symbols

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
    "row": pl.Int64, "ts": pl.Int64, "cpu": pl.Int32, "pid": pl.Int32, "tgid": pl.Int32,
    "comm": pl.Categorical, "event": pl.Categorical, "system": pl.Categorical,
    "flags": pl.UInt8, "preempt_count": pl.UInt8,
}  # fmt: skip


@dataclass
class Tables:
    """The decoded tables of one trace (or of one tool's output: then `tools` only)."""

    events: pl.DataFrame
    by_event: dict[str, pl.DataFrame]
    lost: pl.DataFrame
    meta: dict[str, Any]
    tools: dict[str, pl.DataFrame] = field(default_factory=dict)


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
    if rec.damage:
        trace.skipped.append(
            f"CPU {cpu.cpu}: pages from byte offset {rec.damage.offset} of {cpu.where} on "
            f"({rec.damage.reason})"
        )
    return rec


def build_tables(trace: BinaryTrace, salvage: bool = False, symbols: Path | None = None) -> Tables:
    """Decode all CPUs and build the events, per-event and lost tables.

    Address fields get `_sym` columns from `symbols` (a kallsyms copy or vmlinux), or
    from the trace's own kallsyms copy when none is given.
    """
    syms = load_symbols(trace.kallsyms, symbols, trace.path)
    parts = [(c, _decode_cpu(trace, c, salvage)) for c in trace.cpus]
    lost = _lost_table(trace, parts)
    buf, ts, payload, length, cpu = _merge(parts)
    del parts  # the per-CPU record arrays: peak memory matters on big traces
    order = np.argsort(ts, kind="stable")  # ties: lower CPU first, then record order
    # One array at a time, so only one old copy is alive at once (peak memory).
    ts = ts[order]
    payload = payload[order]
    length = length[order].astype(np.int32)  # an event is shorter than a page
    cpu = cpu[order]
    del order
    g = Gatherer(buf, payload, length, trace.endian)
    header = standard_header(g) if len(payload) else None
    if header is not None:
        ids = header["common_type"]
    else:
        ids = g.ints(0, 2, False).astype(np.uint16) if len(payload) else np.zeros(0, np.uint16)
    meta = dict(trace.meta)
    meta.update(
        reader=trace.reader, clock=trace.clock, instance=trace.instance, symbols=syms.source,
        page_size=trace.page_size, cpus=[c.cpu for c in trace.cpus], skipped=trace.skipped,
        cpu_bytes=sum(len(c.data) for c in trace.cpus),
    )  # fmt: skip
    del buf
    events, by_event = _event_tables(trace, g, ids, ts, cpu, header, syms)
    return Tables(events, by_event, lost, meta)


def _merge(
    parts: list[tuple[CpuData, Records]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One buffer and one set of record arrays for all CPUs (offsets rebased)."""
    bufs, ts, payload, length, cpu = [], [], [], [], []
    base = 0
    for c, rec in parts:
        bufs.append(c.data)
        ts.append(rec.ts)
        payload.append(rec.payload + base)
        length.append(rec.length)
        cpu.append(np.full(len(rec.ts), c.cpu, dtype=np.int32))
        base += len(c.data)
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return np.zeros(0, np.uint8), z.astype(np.uint64), z, z, z.astype(np.int32)
    buf = _contiguous(bufs)
    if buf is None:
        buf = np.concatenate(bufs)
    return (
        buf, np.concatenate(ts), np.concatenate(payload), np.concatenate(length),
        np.concatenate(cpu),
    )  # fmt: skip


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


def _table_name(fmt: EventFormat, names: dict[str, int]) -> str:
    """The per-event table name: the event name, qualified by system when ambiguous."""
    return fmt.name if names.get(fmt.name, 0) <= 1 else f"{fmt.system}:{fmt.name}"


@dataclass
class _Common:
    """Per-event arrays shared by the events table and every typed table (row order)."""

    ts: np.ndarray  # int64 ns
    cpu: np.ndarray
    pid: np.ndarray
    flags: np.ndarray
    preempt: np.ndarray


def _event_tables(
    trace: BinaryTrace,
    g: Gatherer,
    ids: np.ndarray,
    raw_ts: np.ndarray,
    cpu: np.ndarray,
    header: dict[str, np.ndarray] | None,
    syms: Symbols,
) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
    """The events table and one typed table per event type present."""
    n = len(ids)
    raw_ts += np.uint64(trace.ts_offset & 0xFFFFFFFFFFFFFFFF)  # in place: no second copy
    ts = raw_ts.view(np.int64)
    if header is not None:
        c = _Common(ts, cpu, header["common_pid"], header["common_flags"],
                    header["common_preempt_count"])  # fmt: skip
    else:
        c = _Common(ts, cpu, np.zeros(n, np.int32), np.zeros(n, np.uint8), np.zeros(n, np.uint8))
    by_event, id_name = _typed_tables(trace, g, ids, c, header is not None, syms)
    # Every field is decoded: free the ring-buffer bytes before the events table.
    g.buf = np.zeros(0, np.uint8)
    for cpu_data in trace.cpus:
        cpu_data.data = cpu_data.data[:0]
    return _events_frame(trace, ids, c, id_name), by_event


def _typed_tables(
    trace: BinaryTrace,
    g: Gatherer,
    ids: np.ndarray,
    c: _Common,
    have_header: bool,
    syms: Symbols,
) -> tuple[dict[str, pl.DataFrame], dict[int, tuple[str, str]]]:
    """One typed table per event id present, and each id's (table name, system).

    Also fills the common arrays for formats whose common fields are not the standard
    8-byte header (have_header=False or an unusual layout).
    """
    names: dict[str, int] = {}
    for f_name in trace.formats.names.values():
        names[f_name] = names.get(f_name, 0) + 1
    by_event: dict[str, pl.DataFrame] = {}
    id_name: dict[int, tuple[str, str]] = {}
    # Rows grouped by event id, in row order. Ids are 16-bit (common_type): as uint16,
    # numpy's stable sort is a radix sort, several times faster than on int64.
    by_id = np.argsort(ids.astype(np.uint16), kind="stable")
    uniq, starts = _runs(ids[by_id])
    for ev_id, lo, hi in zip(uniq, starts, [*starts[1:], len(ids)], strict=True):
        idx = by_id[lo:hi]
        fmt = trace.formats.get(int(ev_id))
        if fmt is None:  # kept, never dropped: the summary shows unknown ids
            id_name[int(ev_id)] = (f"unknown_id_{int(ev_id)}", "")
            continue
        sub = Gatherer(g.buf, g.payload[idx], g.length[idx], g.endian)
        if not have_header or not has_standard_common(fmt):
            common = common_columns(sub, fmt)
            c.flags[idx] = common.get("common_flags", 0)
            c.preempt[idx] = common.get("common_preempt_count", 0)
            c.pid[idx] = common.get("common_pid", 0)
        name = _table_name(fmt, names)
        id_name[int(ev_id)] = (name, fmt.system)
        head = {"row": idx.astype(np.int64, copy=False), "ts": c.ts[idx], "cpu": c.cpu[idx]}
        head["common_pid"] = c.pid[idx]
        cols = [field_column(sub, s, trace.printk, trace.long_size) for s in fmt.own]
        cols = add_symbol_columns(cols, fmt.own, syms, trace.long_size)
        by_event[name] = pl.DataFrame(head).with_columns(_unique_names(cols, set(head)))
    return by_event, id_name


def _runs(grouped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of an array of equal runs, and where each run starts."""
    if not len(grouped):
        return grouped, np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], grouped[1:] != grouped[:-1])))
    return grouped[starts], starts


# Small non-negative keys (pids up to pid_max, 16-bit event ids) use a lookup table.
LUT_LIMIT = 1 << 23


def _codes(values: np.ndarray) -> tuple[list[int], pl.Series]:
    """The distinct values and, per row, the index of its value among them.

    For small non-negative integers a bincount lookup table does it in two linear
    passes, far cheaper than np.unique's full sort of millions of rows.
    """
    if len(values) and values.min() >= 0 and values.max() < LUT_LIMIT:
        present = np.flatnonzero(np.bincount(values))
        lut = np.zeros(int(present[-1]) + 1, dtype=np.uint32)
        lut[present] = np.arange(len(present), dtype=np.uint32)
        return present.tolist(), pl.Series(lut[values])
    distinct, at = np.unique(values, return_inverse=True)
    return distinct.tolist(), pl.Series(at.ravel().astype(np.uint32))


def _events_frame(
    trace: BinaryTrace, ids: np.ndarray, c: _Common, id_name: dict[int, tuple[str, str]]
) -> pl.DataFrame:
    """The events table; comm/tgid/event/system are gathered from small per-pid and
    per-id columns, so no string is built per event."""
    events = pl.DataFrame(
        {"row": np.arange(len(ids), dtype=np.int64), "ts": c.ts, "cpu": c.cpu, "pid": c.pid}
    )
    pids, pid_at = _codes(c.pid)
    comms = {**trace.cmdlines, 0: "<idle>"}
    uniq, id_at = _codes(ids)
    comm = pl.Series([comms.get(int(p)) for p in pids], dtype=pl.Categorical)
    tgid = pl.Series([trace.tgids.get(int(p)) for p in pids], dtype=pl.Int32)
    event = pl.Series([id_name[int(i)][0] for i in uniq], dtype=pl.Categorical)
    system = pl.Series([id_name[int(i)][1] for i in uniq], dtype=pl.Categorical)
    return events.with_columns(
        tgid=tgid.gather(pid_at),
        comm=comm.gather(pid_at),
        event=event.gather(id_at),
        system=system.gather(id_at),
        flags=pl.Series(c.flags, dtype=pl.UInt8),
        preempt_count=pl.Series(c.preempt, dtype=pl.UInt8),
    )


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
    for cpu, stats in sorted(trace.stats.items()):
        for key, source in (
            ("overrun", "stats_overrun"),
            ("dropped events", "stats_dropped"),
            ("commit overrun", "stats_commit_overrun"),
            ("entries", "stats_unread"),
        ):
            value = stats.get(key, "0")
            if value.isdigit() and int(value) > 0:
                rows.append(
                    dict(
                        cpu=cpu, ts=None, page=None, count=int(value), source=source,
                        detail=f"{trace.stats_origin}: {key}",
                    )
                )  # fmt: skip
    return pl.DataFrame(rows, schema=LOST_SCHEMA)
