"""Kernel events -> FtraceEventBundle packets, per CPU, in bounded memory.

Events are read in chunks of rows (time order), encoded a chunk at a time from their
columns (wire.py, columns.py, compact.py), and written as bundles of at most
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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from tracekit.errors import TracekitError
from tracekit.perfetto import wire
from tracekit.perfetto.columns import encode_rows as columns_encode
from tracekit.perfetto.columns import symbol_column
from tracekit.perfetto.compact import (
    ChunkOrder,
    Compact,
    CompactChunk,
    SchedState,
    can_compact,
    decide,
)
from tracekit.perfetto.events import COMMON_COLUMNS, EventPlan, plan_event
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
        return wire.len_field(_INTERNED, data.SerializeToString())


class FtraceSequence:
    """The ftrace packet sequence's state, shared by every trace one export writes.

    Its first packet clears the incremental state; interned symbols stay valid for the
    traces after it (the runs of one bundle share one boot, so one symbol table).
    TREE_NAMES: the thread names earlier traces of the same machine gave (the importer
    keeps one thread table per machine, whatever the trace file).
    """

    def __init__(self, tree_names: Mapping[int, str] | None = None) -> None:
        self.first = True
        self.symbols: KernelSymbols | None = None
        self.sched = SchedState()  # what the importer infers compact sched events from
        self.sched.tree_names.update(tree_names or {})

    def interner(self, names: Mapping[int, str] | None) -> KernelSymbols:
        """The symbol interner for the next trace (its names; addresses only without)."""
        if self.symbols is None:
            self.symbols = KernelSymbols(names or {})
        self.symbols.names = names or {}
        return self.symbols


class FtraceBundleWriter:
    """Cuts a chunk's events (in output order) into per-CPU bundles and writes each: at
    most BUNDLE_EVENTS events, a new one at each loss (flagged), none across chunks."""

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
        self._sequence = sequence

    def cut(self, chunk: ChunkOrder) -> list[tuple[int, int, int, bool]]:
        """The chunk's bundles: (CPU, first and end output position, follows a loss)."""
        bundles = []
        edges = [*np.flatnonzero(np.diff(chunk.cpus)) + 1, chunk.cpus.size]
        start = 0
        for stop in (int(e) for e in edges):
            cpu = int(chunk.cpus[start])
            points = self._lost_at.get(cpu)
            if points is None:
                runs = [(start, stop, 0)]
            else:
                segment = np.searchsorted(points, chunk.ts[start:stop], side="right")
                cuts = [0, *(np.flatnonzero(np.diff(segment)) + 1).tolist(), stop - start]
                pairs = itertools.pairwise(cuts)
                runs = [(start + a, start + b, int(segment[a])) for a, b in pairs]
            for first, end, seen in runs:
                lost = seen > self._losses_seen.get(cpu, 0)
                if lost:
                    self._losses_seen[cpu] = seen
                for at in range(first, end, BUNDLE_EVENTS):
                    bundles.append((cpu, at, min(end, at + BUNDLE_EVENTS), lost and at == first))
            start = stop
        return bundles

    def write(
        self,
        bundles: list[tuple[int, int, int, bool]],
        full: npt.NDArray[np.bool_],
        data: wire.Bytes,
        starts: wire.Ints,
        compact: CompactChunk | None,
    ) -> None:
        """Write each bundle: its full events' bytes (FULL: which output positions have
        one, in DATA from STARTS), its loss flag and its compact events."""
        before = np.concatenate([[0], np.cumsum(full)])
        for index, (cpu, first, end, lost) in enumerate(bundles):
            lo, hi = int(starts[before[first]]), int(starts[before[end]])
            body = wire.tag(1, wire.WIRE_VARINT) + wire.varint_bytes(cpu) + data[lo:hi].tobytes()
            if lost:
                body += wire.tag(_LOST, wire.WIRE_VARINT) + b"\x01"
            if compact is not None:
                body += compact.encode(index)
            flags = SEQ_NEEDS_INCREMENTAL_STATE
            if self._sequence.first:
                flags |= SEQ_INCREMENTAL_STATE_CLEARED
                self._sequence.first = False
            packet = (
                wire.len_field(_BUNDLE, body)
                + wire.tag(_SEQUENCE_ID, wire.WIRE_VARINT) + wire.varint_bytes(FTRACE_SEQUENCE)
                + wire.tag(_FLAGS, wire.WIRE_VARINT) + wire.varint_bytes(flags)
                + self._symbols.take_pending()
            )  # fmt: skip
            self._writer.write_raw(packet)


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
    tables = {**tables, **untyped_tables(events, tables)}
    plans = {name: plan_event(name, table.schema, release) for name, table in tables.items()}
    sequence = sequence or FtraceSequence()
    interner = sequence.interner(symbols)
    bundles = FtraceBundleWriter(writer, _loss_points(lost), interner, sequence)
    counts: Counter[str] = Counter()
    compactable = can_compact(tables)
    columns = events.select("row", "ts", "cpu", "common_pid", "event", "flags")
    rows = {name: table["row"].to_numpy() for name, table in tables.items()}
    # Two threads: one chunk encoded (numpy and polars, mostly without the GIL) while the
    # next is prepared and the one before written; the bytes are those of one thread. A
    # trace of one chunk has nothing to overlap: no thread is started for it.
    one_chunk = columns.height <= CHUNK_ROWS
    with _Inline() if one_chunk else ThreadPoolExecutor(max_workers=1) as pool:
        waiting: tuple[_Chunk, Future[Any]] | None = None
        for start in range(0, columns.height, CHUNK_ROWS):
            chunk = columns.slice(start, CHUNK_ROWS)
            own = _own_rows(chunk, tables, rows)
            for name, (table, _) in own.items():
                counts[name] += table.height
            ready = _prepare(chunk, own, plans, bundles, interner, sequence, compactable)
            encoding = pool.submit(_encode, ready, plans, interner)
            if waiting is not None:
                bundles.write(waiting[0].cut, waiting[0].full, *waiting[1].result())
            waiting = (ready, encoding)
            if progress is not None:
                progress(start + chunk.height, columns.height)
        if waiting is not None:
            bundles.write(waiting[0].cut, waiting[0].full, *waiting[1].result())
    if stats:
        write_stats(writer, lost)
    return counts


def untyped_tables(
    events: pl.DataFrame, tables: Mapping[str, pl.DataFrame]
) -> dict[str, pl.DataFrame]:
    """Tables of the events that have no typed table (an id without a format file, kept
    by ingest as unknown_id_N): written generic with no field, never dropped."""
    if sum(table.height for table in tables.values()) == events.height:
        return {}  # the usual case, without a pass over the events
    names = pl.col("event").cast(pl.String)
    rest = events.filter(~names.is_in(list(tables))).with_columns(names)
    return {
        str(key[0]): part.select(COMMON_COLUMNS)
        for key, part in rest.partition_by("event", as_dict=True, maintain_order=True).items()
    }


class _Inline:
    """An executor that runs each job at once, in the caller's thread."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def submit(self, job: Callable[..., Any], *args: Any) -> Future[Any]:
        """JOB(*ARGS) done now, as a finished future."""
        done: Future[Any] = Future()
        done.set_result(job(*args))
        return done


def _own_rows(
    chunk: pl.DataFrame, tables: Mapping[str, pl.DataFrame], rows: Mapping[str, wire.Ints]
) -> dict[str, tuple[pl.DataFrame, wire.Ints]]:
    """Per event type in a chunk of consecutive events: its typed rows, and the chunk row
    of each (the typed tables and the events table must agree row for row)."""
    ids = chunk["row"].to_numpy()
    first, last = int(ids[0]), int(ids[-1])
    # Row numbers are mostly first..last, one each: a typed row's place is then its number.
    dense = last - first == ids.size - 1 and bool((np.diff(ids) == 1).all())
    own = {}
    for name, numbers in rows.items():
        lo, hi = np.searchsorted(numbers, [first, last + 1])
        if lo == hi:
            continue
        mine = rows[name][lo:hi]
        at = mine - first if dense else np.searchsorted(ids, mine)
        if not dense and (
            (at >= ids.size).any() or (ids[np.minimum(at, ids.size - 1)] != mine).any()
        ):
            raise _disagree(f"the {name} table has rows the events table lacks", first, last)
        own[name] = (tables[name].slice(int(lo), int(hi - lo)), at)
    if sum(at.size for _, at in own.values()) != ids.size:
        raise _disagree("the events table has rows no event table has", first, last)
    return own


def _disagree(what: str, first: int, last: int) -> TracekitError:
    """The one-line error for a trace whose tables do not agree row for row (ingest
    writes them together: a damaged or hand-edited cache, or a bug), never written half."""
    return TracekitError(
        f"{what} (rows {first}..{last}): the trace's tables disagree, so it is not exported;"
        " remove its ingest cache (.NAME.tracekit/ beside a trace file, .tracekit-cache/ in"
        " a capture or bundle) and export again, and report it if that does not help"
    )


@dataclass
class _Chunk:
    """A chunk decided (order, bundles, which rows go compact), ready to encode."""

    chunk: pl.DataFrame
    own: Mapping[str, tuple[pl.DataFrame, wire.Ints]]
    texts: dict[str, wire.TableTexts]
    order: ChunkOrder
    cut: list[tuple[int, int, int, bool]]
    full: npt.NDArray[np.bool_]  # per output position: written as a full event
    compact: tuple[dict[str, Compact], wire.Texts] | None


def _prepare(
    chunk: pl.DataFrame,
    own: Mapping[str, tuple[pl.DataFrame, wire.Ints]],
    plans: Mapping[str, EventPlan],
    bundles: FtraceBundleWriter,
    interner: KernelSymbols,
    sequence: FtraceSequence,
    compactable: bool,
) -> _Chunk:
    """What must run in order, chunk after chunk: the bundles, the compact sched state,
    the symbols interned (so their iids do not depend on threads)."""
    ts = chunk["ts"].to_numpy().astype(np.int64)
    order = ChunkOrder.of(chunk["cpu"].to_numpy().astype(np.int64), ts)
    texts = {name: wire.TableTexts(table) for name, (table, _) in own.items()}
    full = np.ones(ts.size, dtype=bool)
    compact = None
    if compactable:
        compact = decide(own, texts, chunk["flags"], order, sequence.sched)
        for kind in compact[0].values():
            full[kind.rows] = False
    for name, (table, _) in own.items():
        column = symbol_column(plans[name])
        if column is not None and table[column].dtype.is_integer():
            for address in np.unique(wire.ints(table[column]).view(np.uint64)).tolist():
                interner.intern(address)
    return _Chunk(chunk, own, texts, order, bundles.cut(order), full, compact)


def _encode(
    ready: _Chunk, plans: Mapping[str, EventPlan], interner: KernelSymbols
) -> tuple[wire.Bytes, wire.Ints, CompactChunk | None]:
    """A chunk's full events straight into their places in per-CPU time order, and its
    compact events (the bulk of the work: numpy, run beside the next chunk's _prepare)."""
    order, full = ready.order, ready.full
    compact = None
    if ready.compact is not None:
        bundle_of = np.empty(full.size, dtype=np.int64)
        for index, (_, first, end, _) in enumerate(ready.cut):
            bundle_of[first:end] = index
        compact = CompactChunk(*ready.compact, bundle_of)
    place = np.cumsum(full) - 1  # output position -> place among the full events
    parts = []
    for name, (table, at) in ready.own.items():
        where = order.rank[at]
        keep = full[where]
        coded = ready.texts[name]
        if not keep.all():
            kept = np.flatnonzero(keep)
            table, where = table[kept], where[kept]
            coded = coded.pick(kept, table)
        if table.height:
            piece = columns_encode(table, plans[name], interner.intern, coded)
            parts.append((place[where], piece))
    pids = wire.ints(ready.chunk["common_pid"])[order.order[full]]
    entries = wire.message(
        _EVENT,
        [
            wire.varints(order.ts[full], wire.tag(1, wire.WIRE_VARINT)),
            wire.varints(pids, wire.tag(2, wire.WIRE_VARINT)),
            wire.interleave(pids.size, parts),
        ],
    )
    data, starts = wire.assemble(entries)
    return data, starts, compact


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
