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
from collections import Counter
from collections.abc import Mapping
from typing import Any

import polars as pl

from tracekit.perfetto.events import EventPlan, plan_event
from tracekit.perfetto.protos import FtraceStats, TracePacket
from tracekit.perfetto.system import kernel_release
from tracekit.perfetto.writer import (
    FTRACE_SEQUENCE,
    SEQ_INCREMENTAL_STATE_CLEARED,
    SEQ_NEEDS_INCREMENTAL_STATE,
    PacketWriter,
)

BUNDLE_EVENTS = 2048
CHUNK_ROWS = 16384

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

    def attach_pending(self, packet: Any) -> None:
        """Put the symbols interned since the last packet into this packet."""
        for iid, name in self._pending:
            item = packet.interned_data.kernel_symbols.add()
            item.iid = iid
            item.str = name.encode()
        self._pending.clear()


class FtraceSequence:
    """The ftrace packet sequence's state, shared by every trace one export writes.

    Its first packet clears the incremental state; interned symbols stay valid for the
    traces after it (the runs of one bundle share one boot, so one symbol table).
    """

    def __init__(self) -> None:
        self.first = True
        self.symbols: KernelSymbols | None = None

    def interner(self, names: Mapping[int, str] | None) -> KernelSymbols:
        """The symbol interner for the next trace (its names; addresses only without)."""
        if self.symbols is None:
            self.symbols = KernelSymbols(names or {})
        self.symbols.names = names or {}
        return self.symbols


class FtraceBundleWriter:
    """Collects per-CPU bundles and writes each when full, at a loss, or at the end."""

    def __init__(
        self,
        writer: PacketWriter,
        lost_at: dict[int, list[int]],
        symbols: KernelSymbols | None,
        sequence: FtraceSequence | None = None,
    ) -> None:
        self._writer = writer
        self._lost_at = lost_at
        self._symbols = symbols
        self._open: dict[int, Any] = {}
        self._sizes: dict[int, int] = {}
        self._lost_next: set[int] = set()
        self._sequence = sequence or FtraceSequence()

    def add(self, cpu: int, ts: int, pid: int, payload: dict[str, Any]) -> None:
        """Append one FtraceEvent to CPU's bundle, cutting the bundle at a loss or when full."""
        pending = self._lost_at.get(cpu)
        if pending and ts >= pending[0]:
            while pending and ts >= pending[0]:
                pending.pop(0)
            self.flush(cpu)
            self._lost_next.add(cpu)
        packet = self._open.get(cpu)
        if packet is not None and self._sizes[cpu] >= BUNDLE_EVENTS:
            self.flush(cpu)
            packet = None
        if packet is None:
            packet = self._open[cpu] = TracePacket(trusted_packet_sequence_id=FTRACE_SEQUENCE)
            packet.ftrace_events.cpu = cpu
            self._sizes[cpu] = 0
            if cpu in self._lost_next:
                packet.ftrace_events.lost_events = True
                self._lost_next.discard(cpu)
        packet.ftrace_events.event.add(timestamp=ts, pid=pid, **payload)
        self._sizes[cpu] += 1

    def flush(self, cpu: int) -> None:
        """Write CPU's open bundle, if any."""
        packet = self._open.pop(cpu, None)
        if packet is None or not packet.ftrace_events.event:
            return
        if self._symbols is not None:
            self._symbols.attach_pending(packet)
        packet.sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE
        if self._sequence.first:
            packet.sequence_flags |= SEQ_INCREMENTAL_STATE_CLEARED
            self._sequence.first = False
        self._writer.write(packet)

    def close(self) -> None:
        """Write every open bundle."""
        for cpu in sorted(self._open):
            self.flush(cpu)


def write_ftrace(
    writer: PacketWriter,
    events: pl.DataFrame,
    tables: Mapping[str, pl.DataFrame],
    lost: pl.DataFrame,
    symbols: Mapping[int, str] | None = None,
    sequence: FtraceSequence | None = None,
    stats: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> Counter[str]:
    """Write every event as a bundle entry; return the number written per event name.

    Several traces go into one file through one SEQUENCE, with `stats=False` and one
    `write_stats` over all their losses at the end.
    """
    release = kernel_release(meta or {})
    plans = {name: plan_event(name, table.schema, release) for name, table in tables.items()}
    sequence = sequence or FtraceSequence()
    interner = sequence.interner(symbols)
    bundles = FtraceBundleWriter(writer, _loss_points(lost), interner, sequence)
    counts: Counter[str] = Counter()
    columns = events.select("row", "ts", "cpu", "pid", "event")
    for start in range(0, columns.height, CHUNK_ROWS):
        chunk = columns.slice(start, CHUNK_ROWS)
        _write_chunk(chunk, tables, plans, bundles, counts, interner)
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
    interner: KernelSymbols | None,
) -> None:
    """Write one chunk of events (consecutive rows) into the per-CPU bundles."""
    first, last = chunk["row"][0], chunk["row"][-1]
    values = {
        name: _rows_between(tables[name], plans[name], first, last)
        for name in chunk["event"].cast(pl.String).unique().to_list()
    }
    # Each typed table lists its rows in the same order as the events table.
    own_rows = {name: iter(rows) for name, rows in values.items()}
    intern = interner.intern if interner is not None else None
    for row, ts, cpu, pid, name in chunk.iter_rows():
        own = next(own_rows[name])
        if own[0] != row:
            raise AssertionError(f"event table {name} out of step with events at row {row}")
        bundles.add(cpu, ts, pid, plans[name].build(own[1:], intern))
    if any(next(rows, None) is not None for rows in own_rows.values()):
        raise AssertionError(f"event tables have rows the events table lacks ({first}..{last})")
    counts.update({name: len(rows) for name, rows in values.items()})


def _rows_between(
    table: pl.DataFrame, plan: EventPlan, first: int, last: int
) -> list[tuple[Any, ...]]:
    """The (row, own fields...) tuples of a typed table for rows first..last."""
    rows = table["row"]
    lo = rows.search_sorted(first, side="left")
    hi = rows.search_sorted(last, side="right")
    return table.slice(lo, hi - lo).select("row", *plan.columns).rows()


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
