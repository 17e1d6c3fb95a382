"""Kernel events -> FtraceEventBundle packets, per CPU, in bounded memory.

Events are read in chunks of rows (time order) and written as bundles of at most
`BUNDLE_EVENTS` events of one CPU. A bundle that follows lost events (a ring-buffer page
flagged as having missed events) starts at the loss and has `lost_events` set, so the UI
and trace_processor know the gap is real. Loss counters (overrun, dropped) go into one
FtraceStats packet. Addresses of the fields trace_processor reads as kernel symbols
(events.SYMBOL_FIELDS) are interned on the ftrace sequence (SEQ_INCREMENTAL_STATE_CLEARED
on its first packet), named by kallsyms when given, else by the address itself.

common_flags is not written per event: trace_processor has no place for it outside
compact sched_waking and imports a field 5 as an extra, nameless ftrace_event row.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from tracekit.perfetto import wire
from tracekit.perfetto.columns import encode_rows as columns_encode
from tracekit.perfetto.compact import (
    CompactBuffer,
    SchedState,
    can_compact,
    compact_switches,
    running_before,
)
from tracekit.perfetto.events import EventPlan, plan_event
from tracekit.perfetto.protos import FtraceEventBundle, FtraceStats, TracePacket, pb
from tracekit.perfetto.system import kernel_release
from tracekit.perfetto.writer import (
    FTRACE_SEQUENCE,
    SEQ_INCREMENTAL_STATE_CLEARED,
    SEQ_NEEDS_INCREMENTAL_STATE,
    PacketWriter,
)

BUNDLE_EVENTS = 2048
CHUNK_ROWS = 65536  # events encoded at once: bounds the export's own memory

InternedData = pb.InternedData
# Field numbers of the messages written as bytes here.
_PACKET = TracePacket.DESCRIPTOR.fields_by_name
_BUNDLE = _PACKET["ftrace_events"].number
_SEQUENCE_ID = _PACKET["trusted_packet_sequence_id"].number
_FLAGS = _PACKET["sequence_flags"].number
_INTERNED = _PACKET["interned_data"].number
_EVENT = FtraceEventBundle.DESCRIPTOR.fields_by_name["event"].number
_LOST = FtraceEventBundle.DESCRIPTOR.fields_by_name["lost_events"].number

# FtraceStats counters fed by trace.lost sources that are counters (not page flags).
_STAT_FIELDS = {
    "stats_overrun": "overrun",
    "stats_dropped": "dropped_events",
    "stats_commit_overrun": "commit_overrun",
    "stats_unread": "entries",
}


class KernelSymbols:
    """Interns function addresses as kernel_symbols on the ftrace packet sequence."""

    def __init__(self, names: Mapping[int, str]) -> None:
        self.names = names
        self._iids: dict[int, int] = {}
        self._pending: list[tuple[int, str]] = []

    def intern(self, address: int) -> int:
        """The iid of an address (new ones are emitted with the next packet)."""
        iid = self._iids.get(address)
        if iid is None:
            iid = len(self._iids) + 1
            self._iids[address] = iid
            name = self.names.get(address) or f"0x{address:x}"
            self._pending.append((iid, name))
        return iid

    def take_pending(self) -> bytes:
        """The interned_data field with the symbols interned since the last packet."""
        if not self._pending:
            return b""
        data = InternedData()
        for iid, name in self._pending:
            data.kernel_symbols.add(iid=iid, str=name.encode())
        self._pending.clear()
        body = data.SerializeToString()
        return wire.tag(_INTERNED, wire.WIRE_LEN) + wire.varint_bytes(len(body)) + body


class FtraceSequence:
    """The ftrace packet sequence's state, shared by every trace one export writes.

    Its first packet clears the incremental state; interned symbols stay valid for the
    traces after it (the runs of one bundle share one boot, so one symbol table).
    """

    def __init__(self) -> None:
        self.first = True
        self.symbols: KernelSymbols | None = None
        self.sched = SchedState()  # what the importer infers compact sched events from

    def interner(self, names: Mapping[int, str] | None) -> KernelSymbols:
        """The symbol interner for the next trace (its names; addresses only without)."""
        if self.symbols is None:
            self.symbols = KernelSymbols(names or {})
        self.symbols.names = names or {}
        return self.symbols


@dataclass
class _Bundle:
    """One CPU's bundle being filled: encoded events, compact events, count, loss flag."""

    lost: bool
    events: list[bytes] = field(default_factory=list)
    compact: CompactBuffer = field(default_factory=CompactBuffer)
    size: int = 0


class FtraceBundleWriter:
    """Fills per-CPU bundles and writes each when full, at a loss, or at the end."""

    def __init__(
        self,
        writer: PacketWriter,
        lost_at: dict[int, list[int]],
        symbols: KernelSymbols,
        sequence: FtraceSequence,
    ) -> None:
        self._writer = writer
        self._lost_at = {cpu: np.array(points, dtype=np.int64) for cpu, points in lost_at.items()}
        self._losses_seen: dict[int, int] = {}
        self._symbols = symbols
        self._open: dict[int, _Bundle] = {}
        self._sequence = sequence

    def add_cpu(
        self,
        cpu: int,
        ts: npt.NDArray[np.int64],
        entries: wire.Rows,
        compact: Mapping[str, tuple[npt.NDArray[np.bool_], CompactColumns]],
    ) -> None:
        """One CPU's events of a chunk, in time order: ENTRIES are the encoded bundle
        entries (empty for compact rows); COMPACT says per kind which rows it holds."""
        points = self._lost_at.get(cpu)
        segment = np.searchsorted(points, ts, side="right") if points is not None else None
        starts = entries.starts
        at = 0
        while at < ts.size:
            seen = self._losses_seen.get(cpu, 0)
            if segment is not None and segment[at] > seen:
                self._losses_seen[cpu] = int(segment[at])
                self.flush(cpu)
                self._open[cpu] = _Bundle(lost=True)
            bundle = self._open.setdefault(cpu, _Bundle(lost=False))
            stop = min(ts.size, at + BUNDLE_EVENTS - bundle.size)
            if segment is not None:
                stop = at + int(np.searchsorted(segment[at:stop], segment[at], side="right"))
            first, last = int(starts[at]), int(starts[stop - 1] + entries.lengths[stop - 1])
            bundle.events.append(entries.data[first:last].tobytes())
            for kind, (rows, columns) in compact.items():
                picked = np.flatnonzero(rows[at:stop]) + at
                if picked.size:
                    bundle.compact.add(
                        kind,
                        [c[picked] for c in columns.ints],
                        columns.comms[picked],
                        columns.names,
                    )
            bundle.size += stop - at
            at = stop
            if bundle.size >= BUNDLE_EVENTS:
                self.flush(cpu)

    def flush(self, cpu: int) -> None:
        """Write CPU's open bundle, if it has any event."""
        bundle = self._open.pop(cpu, None)
        if bundle is None or not bundle.size:
            return
        body = wire.tag(1, wire.WIRE_VARINT) + wire.varint_bytes(cpu) + b"".join(bundle.events)
        if bundle.lost:
            body += wire.tag(_LOST, wire.WIRE_VARINT) + b"\x01"
        body += bundle.compact.encode()
        flags = SEQ_NEEDS_INCREMENTAL_STATE
        if self._sequence.first:
            flags |= SEQ_INCREMENTAL_STATE_CLEARED
            self._sequence.first = False
        packet = (
            wire.tag(_BUNDLE, wire.WIRE_LEN) + wire.varint_bytes(len(body)) + body
            + wire.tag(_SEQUENCE_ID, wire.WIRE_VARINT) + wire.varint_bytes(FTRACE_SEQUENCE)
            + wire.tag(_FLAGS, wire.WIRE_VARINT) + wire.varint_bytes(flags)
            + self._symbols.take_pending()
        )  # fmt: skip
        self._writer.write_raw(packet)

    def close(self) -> None:
        """Write every open bundle."""
        for cpu in sorted(self._open):
            self.flush(cpu)


@dataclass
class CompactColumns:
    """A kind's compact columns over a chunk's rows (ints in field order, comms)."""

    ints: list[npt.NDArray[np.int64]]
    comms: npt.NDArray[np.int64]  # indices into names
    names: list[str]

    def pick(self, rows: npt.NDArray[np.int64]) -> CompactColumns:
        """The columns at ROWS."""
        return CompactColumns([c[rows] for c in self.ints], self.comms[rows], self.names)


def _compact_rows(
    chunk: pl.DataFrame,
    own: Mapping[str, tuple[pl.DataFrame, npt.NDArray[np.int64]]],
    state: SchedState,
    ts: npt.NDArray[np.int64],
    cpus: npt.NDArray[np.int64],
) -> dict[str, tuple[npt.NDArray[np.bool_], CompactColumns]]:
    """Per kind (switch, waking): which chunk rows go compact, and their columns."""
    n = ts.size
    out: dict[str, tuple[npt.NDArray[np.bool_], CompactColumns]] = {}
    switch_at, next_pid = np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64)
    switch = own.get("sched_switch")
    if switch is not None:
        switch_at[switch[1]] = True
        next_pid[switch[1]] = switch[0]["next_pid"].to_numpy()
    running, since = running_before(cpus, ts, switch_at, next_pid, state)
    if switch is not None:
        table, at = switch
        mask = np.zeros(n, dtype=bool)
        mask[at] = compact_switches(table, state)
        ints = [ts] + [_spread(table[c], at, n) for c in ("prev_state", "next_pid", "next_prio")]
        out["switch"] = (mask, CompactColumns(ints, *_spread_text(table["next_comm"], at, n)))
    waking = own.get("sched_waking")
    flags = chunk["flags"]
    if waking is not None and flags.null_count() == 0:
        table, at = waking
        fields = [table[c] for c in ("pid", "target_cpu", "prio")]
        good = (
            (table["common_pid"].to_numpy() == running[at])
            & (since[at] >= 0) & (ts[at] > since[at])
            & table.select(pl.all_horizontal(pl.all().is_not_null())).to_series().to_numpy()
        )  # fmt: skip
        for f in fields:
            values = f.fill_null(0).cast(pl.Int64).to_numpy()
            good &= (values >= -(2**31)) & (values < 2**31)
        mask = np.zeros(n, dtype=bool)
        mask[at] = good
        ints = [ts] + [_spread(f, at, n) for f in fields] + [flags.cast(pl.Int64).to_numpy()]
        out["waking"] = (mask, CompactColumns(ints, *_spread_text(table["comm"], at, n)))
    return out


def _spread(column: pl.Series, at: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    """A kind's column placed at its chunk rows (0 elsewhere)."""
    out = np.zeros(n, dtype=np.int64)
    out[at] = column.fill_null(0).cast(pl.Int64).to_numpy()
    return out


def _spread_text(
    column: pl.Series, at: npt.NDArray[np.int64], n: int
) -> tuple[npt.NDArray[np.int64], list[str]]:
    """A kind's text column at its chunk rows as indices into its distinct texts."""
    filled = column.fill_null("")
    out = np.zeros(n, dtype=np.int64)
    out[at] = (filled.rank("dense") - 1).cast(pl.Int64).to_numpy()
    return out, filled.unique().sort().to_list()


def write_ftrace(
    writer: PacketWriter,
    events: pl.DataFrame,
    tables: Mapping[str, pl.DataFrame],
    lost: pl.DataFrame,
    symbols: Mapping[int, str] | None = None,
    sequence: FtraceSequence | None = None,
    stats: bool = True,
    meta: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Counter[str]:
    """Write every event as a bundle entry (or compact sched); return the number written
    per event name. PROGRESS, if given, is called with (events written, of total).

    Several traces go into one file through one SEQUENCE, with `stats=False` and one
    `write_stats` over all their losses at the end.
    """
    release = kernel_release(meta or {})
    plans = {name: plan_event(name, table.schema, release) for name, table in tables.items()}
    sequence = sequence or FtraceSequence()
    interner = sequence.interner(symbols)
    bundles = FtraceBundleWriter(writer, _loss_points(lost), interner, sequence)
    counts: Counter[str] = Counter()
    compactable = can_compact(tables)
    columns = events.select("row", "ts", "cpu", "common_pid", "event", "flags")
    for start in range(0, columns.height, CHUNK_ROWS):
        chunk = columns.slice(start, CHUNK_ROWS)
        _write_chunk(chunk, tables, plans, bundles, counts, interner, sequence, compactable)
        if progress is not None:
            progress(start + chunk.height, columns.height)
    bundles.close()
    if stats:
        write_stats(writer, lost)
    return counts


def _write_chunk(
    chunk: pl.DataFrame,
    tables: Mapping[str, pl.DataFrame],
    plans: Mapping[str, EventPlan],
    bundles: FtraceBundleWriter,
    counts: Counter[str],
    interner: KernelSymbols,
    sequence: FtraceSequence,
    compactable: bool,
) -> None:
    """Write one chunk of events (consecutive rows) into the per-CPU bundles."""
    rows = chunk["row"].to_numpy()
    first, last = int(rows[0]), int(rows[-1])
    names = chunk["event"].cast(pl.String).unique(maintain_order=True).to_list()
    parts, where, own = [], [], {}
    for name in names:
        table = _rows_between(tables[name], first, last)
        at = np.searchsorted(rows, table["row"].to_numpy())
        if (
            at.size != table.height
            or (at >= rows.size).any()
            or (rows[np.minimum(at, rows.size - 1)] != table["row"].to_numpy()).any()
        ):
            raise AssertionError(f"event table {name} out of step with events ({first}..{last})")
        parts.append(columns_encode(table, plans[name], interner.intern))
        where.append(at)
        own[name] = (table, at)
        counts[name] += table.height
    if sum(a.size for a in where) != rows.size:
        raise AssertionError(f"event tables and the events table differ ({first}..{last})")
    # Encoded straight into per-CPU order (time order within a CPU): each CPU's
    # bundle entries are then one contiguous run of bytes.
    ts = chunk["ts"].to_numpy().astype(np.int64)
    cpus = chunk["cpu"].to_numpy().astype(np.int64)
    by_cpu = np.argsort(cpus, kind="stable")
    in_chunk = np.empty(rows.size, dtype=np.int64)
    in_chunk[np.concatenate(where)] = np.arange(rows.size)
    payload = wire.take(wire.concat(parts), in_chunk[by_cpu])
    compact = _compact_rows(chunk, own, sequence.sched, ts, cpus) if compactable else {}
    full = np.ones(rows.size, dtype=bool)
    for mask, _ in compact.values():
        full &= ~mask
    pids = chunk["common_pid"].fill_null(0).to_numpy()[by_cpu]
    fields = [wire.int_field(1, ts[by_cpu]), wire.int_field(2, pids), payload]
    entries = wire.message(_EVENT, fields, full[by_cpu])
    sorted_cpus = cpus[by_cpu]
    bounds = [0, *(np.flatnonzero(np.diff(sorted_cpus)) + 1).tolist(), rows.size]
    for start, stop in itertools.pairwise(bounds):
        if stop <= start:
            continue
        group = by_cpu[start:stop]
        kinds = {kind: (mask[group], cols.pick(group)) for kind, (mask, cols) in compact.items()}
        cpu_entries = wire.cut(entries, start, stop)
        bundles.add_cpu(int(sorted_cpus[start]), ts[group], cpu_entries, kinds)


def _rows_between(table: pl.DataFrame, first: int, last: int) -> pl.DataFrame:
    """The rows of a typed table for event rows first..last."""
    rows = table["row"]
    lo = rows.search_sorted(first, side="left")
    hi = rows.search_sorted(last, side="right")
    return table.slice(lo, hi - lo)


def _loss_points(lost: pl.DataFrame) -> dict[int, list[int]]:
    """Per CPU, the sorted timestamps after which events were lost."""
    points: dict[int, list[int]] = {}
    for cpu, ts in lost.filter(pl.col("ts").is_not_null()).select("cpu", "ts").iter_rows():
        bisect.insort(points.setdefault(cpu, []), ts)
    return points


def write_stats(writer: PacketWriter, lost: pl.DataFrame) -> None:
    """One FtraceStats packet with the loss counters per CPU (summed over traces), if any."""
    counters = (
        lost.filter(pl.col("source").is_in(list(_STAT_FIELDS)) & pl.col("count").is_not_null())
        .group_by("cpu", "source", maintain_order=True)
        .agg(pl.col("count").sum())
    )
    if counters.is_empty():
        return
    stats = FtraceStats(phase=FtraceStats.END_OF_TRACE)
    per_cpu: dict[int, Any] = {}
    for cpu, source, count in counters.select("cpu", "source", "count").iter_rows():
        entry = per_cpu.get(cpu)
        if entry is None:
            entry = per_cpu[cpu] = stats.cpu_stats.add(cpu=cpu)
        setattr(entry, _STAT_FIELDS[source], count)
    writer.write(TracePacket(ftrace_stats=stats, trusted_packet_sequence_id=FTRACE_SEQUENCE))
