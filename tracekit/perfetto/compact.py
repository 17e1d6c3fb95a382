"""Perfetto's compact sched encoding (FtraceEventBundle.CompactSched), only where lossless.

Compact sched_switch keeps prev_state and next_*; trace_processor takes prev_pid and
prev_prio from the CPU's previous switch. Compact sched_waking has no common_pid; the
importer takes the task running on the CPU. So an event is written compact only when
those inferences give back what was recorded: the switch's prev_pid and prev_prio are
the previous switch's next_pid and next_prio on its CPU (and its common_pid is prev_pid),
the waking's common_pid is the task the CPU's last switch (strictly earlier) ran. A
switch whose prev_comm is not the previous next_comm (the task exec'd or was renamed
while it ran), or not the name the process tree gave the task (the importer takes the
thread's name for prev_comm, and a tree's name outranks every sched event's comm), or
that leaves the idle task (whose name the importer makes "swapper"), stays full too, so
the export keeps every recorded value; every other event stays a full FtraceEvent. The
state runs across chunks and traces of one sequence, as the importer's does.

Everything is decided and encoded for a whole chunk at once, in the chunk's output order
(per CPU, time order within it): a switch's predecessor is the row before it, a waking's
running task the last switch before it, each bundle's columns a slice of one encoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import polars as pl

from tracekit.perfetto import wire
from tracekit.perfetto.protos import FtraceEventBundle
from tracekit.perfetto.wire import Ints, TableTexts, Texts

SWITCH_FIELDS = ("prev_comm", "prev_pid", "prev_prio", "prev_state", "next_comm", "next_pid",
                 "next_prio")  # fmt: skip
WAKING_FIELDS = ("comm", "pid", "prio", "target_cpu")
_C = FtraceEventBundle.CompactSched.DESCRIPTOR.fields_by_name
_COMPACT = FtraceEventBundle.DESCRIPTOR.fields_by_name["compact_sched"].number
_INT32 = (-(2**31), 2**31 - 1)
# The packed fields of each kind, in the order of its columns (timestamps first).
_FIELDS = {
    "switch": ("switch_timestamp", "switch_prev_state", "switch_next_pid", "switch_next_prio",
               "switch_next_comm_index"),
    "waking": ("waking_timestamp", "waking_pid", "waking_target_cpu", "waking_prio",
               "waking_comm_index", "waking_common_flags"),
}  # fmt: skip
_COMM_AT = {"switch": 4, "waking": 4}


@dataclass
class SchedState:
    """Per CPU, as the importer will have it: the last switch's next task and its time."""

    next_pid: dict[int, int] = field(default_factory=dict)
    next_prio: dict[int, int] = field(default_factory=dict)
    next_comm: dict[int, str] = field(default_factory=dict)
    switch_ts: dict[int, int] = field(default_factory=dict)
    # Per pid, the thread name a process tree gave: the importer's prev_comm for it.
    tree_names: dict[int, str] = field(default_factory=dict)


def can_compact(tables: Mapping[str, pl.DataFrame]) -> bool:
    """Whether the trace's sched tables have exactly the fields compact sched carries."""
    switch, waking = tables.get("sched_switch"), tables.get("sched_waking")
    if (
        switch is None
        or not _exactly(switch, SWITCH_FIELDS)
        or not switch["prev_state"].dtype.is_integer()
    ):
        return False
    return waking is None or _exactly(waking, WAKING_FIELDS)


def _exactly(table: pl.DataFrame, fields: tuple[str, ...]) -> bool:
    """Own columns are FIELDS (derived `_sym` columns aside)."""
    own = [c for c in table.columns if c not in ("row", "ts", "cpu", "common_pid")]
    return sorted(c for c in own if not c.endswith("_sym")) == sorted(fields)


@dataclass
class ChunkOrder:
    """A chunk's output order: per CPU, time order within it."""

    order: Ints  # output position -> chunk row
    rank: Ints  # chunk row -> output position
    cpus: Ints  # per output position
    ts: Ints  # per output position
    cpu_start: Ints  # per output position: where its CPU's rows begin

    @classmethod
    def of(cls, cpus: Ints, ts: Ints) -> ChunkOrder:
        """The order of a chunk's rows (CPU and time per chunk row)."""
        small = cpus.astype(np.int16) if cpus.max(initial=0) < 2**15 else cpus
        order = np.argsort(small, kind="stable")  # a radix sort for 16-bit CPU numbers
        rank = np.empty(order.size, dtype=np.int64)
        rank[order] = np.arange(order.size)
        out_cpus = cpus[order]
        new = np.ones(order.size, dtype=bool)
        new[1:] = out_cpus[1:] != out_cpus[:-1]
        cpu_start = np.maximum.accumulate(np.where(new, np.arange(order.size), 0))
        return cls(order, rank, out_cpus, ts[order], cpu_start)


def _not_null(table: pl.DataFrame, columns: tuple[str, ...]) -> npt.NDArray[np.bool_]:
    """Rows with a value in every one of COLUMNS."""
    if not any(table[c].null_count() for c in columns):
        return np.ones(table.height, dtype=bool)
    return table.select(pl.all_horizontal(pl.col(*columns).is_not_null())).to_series().to_numpy()


def _state_of(values: Mapping[int, int], cpus: Ints, missing: int = -1) -> Ints:
    """Each CPU's value in the carried state (MISSING for a CPU without one)."""
    table = np.full(int(cpus.max(initial=0)) + 1, missing, dtype=np.int64)
    for cpu, value in values.items():
        if 0 <= cpu < table.size:
            table[cpu] = value
    return table[cpus]


def in_output_order(where: Ints, n: int) -> tuple[Ints, Ints]:
    """Output positions WHERE (distinct, of N) sorted, and the index into WHERE of each
    (by marking them: no sort)."""
    back = np.full(n, -1, dtype=np.int64)
    back[where] = np.arange(where.size)
    ordered = np.flatnonzero(back >= 0)
    return ordered, back[ordered]


def _first_per_cpu(cpus: Ints) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Rows (sorted by CPU) that are their CPU's first, and those that are its last."""
    first = np.ones(cpus.size, dtype=bool)
    first[1:] = cpus[1:] != cpus[:-1]
    last = np.ones(cpus.size, dtype=bool)
    last[:-1] = first[1:]
    return first, last


def _previous(values: Ints, first: npt.NDArray[np.bool_], carried: Ints) -> Ints:
    """Each row's predecessor on its CPU: the row before, or CARRIED for a CPU's first."""
    out = np.empty_like(values)
    out[1:] = values[:-1]
    out[first] = carried
    return out


@dataclass
class Compact:
    """A chunk's compact events of one kind, in output order."""

    rows: Ints  # output positions
    columns: list[Ints]  # the kind's columns but the comm, in _FIELDS order
    comms: Ints  # codes into the chunk's shared comm texts


def compact_switches(
    table: pl.DataFrame, at: Ints, chunk: ChunkOrder, state: SchedState, comms: Texts
) -> Compact:
    """A chunk's sched_switch rows (chunk rows AT) that are lossless as compact; updates
    STATE with every switch. COMMS: next_comm, prev_comm and STATE's comms, coded."""
    m = table.height
    _, perm = in_output_order(chunk.rank[at], chunk.rank.size)  # the switches in output order
    cols = {c: wire.ints(table[c])[perm] for c in ("prev_pid", "prev_prio", "next_pid", "next_prio",
                                               "common_pid", "prev_state")}  # fmt: skip
    next_comm, prev_comm = comms.codes[:m][perm], comms.codes[m : 2 * m][perm]
    carried_comm = comms.codes[2 * m :]
    cpus = chunk.cpus[chunk.rank[at][perm]]
    first, last = _first_per_cpu(cpus)
    firsts = cpus[first]
    known = ~first
    known[first] = [int(c) in state.next_pid for c in firsts]
    comm_of = {cpu: carried_comm[i] for i, cpu in enumerate(sorted(state.next_comm))}

    def previous(values: Ints, carried: Mapping[int, int]) -> Ints:
        """The CPU's previous switch's value (carried over for a CPU's first)."""
        return _previous(values, first, _state_of(carried, firsts))

    good = (
        known
        & (prev_comm == previous(next_comm, comm_of))
        & _named_so(cols["prev_pid"], prev_comm, state.tree_names, comms.distinct)
        & (cols["prev_pid"] == previous(cols["next_pid"], state.next_pid))
        & (cols["prev_pid"] != 0)  # the importer names every CPU's idle task "swapper"
        & (cols["prev_prio"] == previous(cols["next_prio"], state.next_prio))
        & (cols["common_pid"] == cols["prev_pid"])
        & _not_null(table, (*SWITCH_FIELDS, "common_pid"))[perm]
        & _in(cols["next_pid"], _INT32) & _in(cols["next_prio"], _INT32)
    )  # fmt: skip
    ts = chunk.ts[chunk.rank[at][perm]]
    texts = [t.decode() for t in comms.distinct]
    for i in np.flatnonzero(last).tolist():
        c = int(cpus[i])
        state.next_pid[c], state.next_prio[c] = int(cols["next_pid"][i]), int(cols["next_prio"][i])
        state.switch_ts[c], state.next_comm[c] = int(ts[i]), texts[int(next_comm[i])]
    keep = np.flatnonzero(good)
    columns = [ts, cols["prev_state"], cols["next_pid"], cols["next_prio"]]
    return Compact(chunk.rank[at][perm][keep], [c[keep] for c in columns], next_comm[keep])


def compact_wakings(
    table: pl.DataFrame,
    at: Ints,
    chunk: ChunkOrder,
    state: SchedState,
    switches: tuple[Ints, Ints],
    flags: Ints,
    comms: Ints,
) -> Compact:
    """A chunk's sched_waking rows (chunk rows AT) that are lossless as compact: woken by
    the task the CPU's last switch (strictly earlier) ran. SWITCHES: every switch's output
    position (sorted) and next_pid; STATE is read before this chunk's switches."""
    where = chunk.rank[at]
    last_switch = np.searchsorted(switches[0], where, side="left") - 1
    ours = last_switch >= 0
    ours[ours] = switches[0][last_switch[ours]] >= chunk.cpu_start[where[ours]]
    picked = np.maximum(last_switch, 0)
    cpus = chunk.cpus[where]
    running = np.where(ours, switches[1][picked] if switches[1].size else 0,
                       _state_of(state.next_pid, cpus))  # fmt: skip
    switch_ts = chunk.ts[switches[0]] if switches[0].size else np.zeros(1, np.int64)
    since = np.where(ours, switch_ts[np.minimum(picked, switch_ts.size - 1)],
                     _state_of(state.switch_ts, cpus))  # fmt: skip
    ts = chunk.ts[where]
    fields = [wire.ints(table[c]) for c in ("pid", "target_cpu", "prio")]
    good = (
        (wire.ints(table["common_pid"]) == running) & (since >= 0) & (ts > since)
        & _not_null(table, (*WAKING_FIELDS, "common_pid"))
    )  # fmt: skip
    for values in fields:
        good &= _in(values, _INT32)
    keep = np.flatnonzero(good)
    keep = keep[in_output_order(where[keep], chunk.rank.size)[1]]
    columns = [ts, *fields, flags[at]]
    return Compact(where[keep], [c[keep] for c in columns], comms[keep])


def _named_so(
    pids: Ints, comms: Ints, names: Mapping[int, str], texts: list[bytes]
) -> npt.NDArray[np.bool_]:
    """Rows whose comm (codes into TEXTS) is the name NAMES gives their pid, if any."""
    if not names or not pids.size:
        return np.ones(pids.size, dtype=bool)
    distinct, inverse = np.unique(pids, return_inverse=True)
    code = {text: i for i, text in enumerate(texts)}
    # -1: no name given (any comm goes); -2: a name none of the comms is (none goes).
    wanted = np.array(
        [code.get(names[p].encode(), -2) if p in names else -1 for p in distinct.tolist()],
        dtype=np.int64,
    )[inverse.reshape(-1)]
    return (wanted == -1) | (wanted == comms)


def _in(values: npt.NDArray[np.int64], bounds: tuple[int, int]) -> npt.NDArray[np.bool_]:
    """Values within the inclusive bounds."""
    return (values >= bounds[0]) & (values <= bounds[1])


def _distinct(keys: Ints, bound: int) -> tuple[Ints, Ints]:
    """Sorted distinct KEYS (all below BOUND) and each key's index among them: by marking
    when BOUND is small, else by sorting."""
    if bound > 8 * keys.size + (1 << 16):
        distinct, inverse = np.unique(keys, return_inverse=True)
        return distinct, inverse.reshape(-1)
    seen = np.zeros(bound, dtype=bool)
    seen[keys] = True
    return np.flatnonzero(seen), (np.cumsum(seen) - 1)[keys]


class CompactChunk:
    """A chunk's compact events, encoded once; each bundle's compact_sched is slices."""

    def __init__(self, kinds: Mapping[str, Compact], comms: Texts, bundle_of: Ints) -> None:
        self._kinds = {k: c for k, c in kinds.items() if c.rows.size}
        self._encoded: dict[str, tuple[list[tuple[wire.Bytes, Ints]], Ints]] = {}
        width = max(len(comms.distinct), 1)
        keys = {k: bundle_of[c.rows] * width + c.comms for k, c in self._kinds.items()}
        every = np.concatenate([*keys.values(), np.zeros(0, np.int64)])
        bundles = int(bundle_of.max(initial=-1)) + 1
        distinct, inverse = _distinct(every, bundles * width)
        # Where each bundle's comms begin among the distinct (bundle, comm) keys, and
        # every bundle's intern_table fields end to end.
        self._table_at = np.searchsorted(distinct, np.arange(bundles + 1) * width)
        names = wire.texts(Texts(distinct % width, comms.distinct))
        self._tables = wire.assemble(wire.field(_C["intern_table"].number, names))
        at = 0
        for kind, compact in self._kinds.items():
            local = inverse[at : at + compact.rows.size]
            at += compact.rows.size
            bundle = bundle_of[compact.rows]
            local = local - self._table_at[bundle]
            new = np.ones(bundle.size, dtype=bool)
            new[1:] = bundle[1:] != bundle[:-1]
            ts = compact.columns[0]
            deltas = np.where(new, ts, ts - np.concatenate([[0], ts[:-1]]))
            values = [deltas, *compact.columns[1:]]
            values.insert(_COMM_AT[kind], local)
            bounds = np.searchsorted(bundle, np.arange(bundles + 1))
            self._encoded[kind] = ([wire.packed_body(v) for v in values], bounds)

    def rows(self) -> Ints:
        """Every compact event's output position."""
        return np.concatenate([c.rows for c in self._kinds.values()] + [np.zeros(0, np.int64)])

    def encode(self, bundle: int) -> bytes:
        """Bundle BUNDLE's compact_sched field, or nothing when it holds no event."""
        lo, hi = int(self._table_at[bundle]), int(self._table_at[bundle + 1])
        if lo == hi:
            return b""
        data, starts = self._tables
        body = data[starts[lo] : starts[hi]].tobytes()
        for kind, (columns, bounds) in self._encoded.items():
            first, last = int(bounds[bundle]), int(bounds[bundle + 1])
            if first == last:
                continue
            for name, (data, starts) in zip(_FIELDS[kind], columns, strict=True):
                chunk = data[starts[first] : starts[last]].tobytes()
                body += wire.len_field(_C[name].number, chunk)
        return wire.len_field(_COMPACT, body)


def decide(
    own: Mapping[str, tuple[pl.DataFrame, Ints]],
    texts: Mapping[str, TableTexts],
    flags: pl.Series,
    chunk: ChunkOrder,
    state: SchedState,
) -> tuple[dict[str, Compact], Texts]:
    """Which of a chunk's switches and wakings (OWN: table and chunk rows per event; TEXTS:
    their coded text columns) go compact, with their columns; the comm texts their codes
    index. Updates STATE."""
    switch, waking = own.get("sched_switch"), own.get("sched_waking")
    carried = [state.next_comm[c].encode() for c in sorted(state.next_comm)]
    parts = []
    if switch is not None:
        parts += [texts["sched_switch"]("next_comm"), texts["sched_switch"]("prev_comm")]
    parts.append(Texts(np.arange(len(carried), dtype=np.int64), carried))
    if waking is not None:
        parts.append(texts["sched_waking"]("comm"))
    recoded = wire.shared(parts)
    comms = Texts(np.concatenate([t.codes for t in recoded]), recoded[0].distinct)
    through = (2 * switch[0].height if switch is not None else 0) + len(carried)
    kinds: dict[str, Compact] = {}
    if switch is not None:
        where, perm = in_output_order(chunk.rank[switch[1]], chunk.rank.size)
        switches = (where, wire.ints(switch[0]["next_pid"])[perm])
    else:
        switches = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if waking is not None and not flags.null_count():
        kinds["waking"] = compact_wakings(
            *waking, chunk, state, switches, wire.ints(flags), comms.codes[through:]
        )
    if switch is not None:
        kinds["switch"] = compact_switches(
            *switch, chunk, state, Texts(comms.codes[:through], comms.distinct)
        )
    return kinds, comms
