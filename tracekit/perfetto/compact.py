"""Perfetto's compact sched encoding (FtraceEventBundle.CompactSched), only where lossless.

Compact sched_switch keeps prev_state and next_*; trace_processor takes prev_pid and
prev_prio from the CPU's previous switch. Compact sched_waking has no common_pid; the
importer takes the task running on the CPU. So an event is written compact only when
those inferences give back what was recorded: the switch's prev_pid and prev_prio are
the previous switch's next_pid and next_prio on its CPU (and its common_pid is prev_pid),
the waking's common_pid is the task the CPU's last switch (strictly earlier) ran. A
switch whose prev_comm is not the previous next_comm (the task exec'd or was renamed
while it ran), or that leaves the idle task (whose name the importer makes "swapper"),
stays full too, so the export keeps every recorded value; every other event
stays a full FtraceEvent. The state runs across chunks and traces of one sequence, as the
importer's does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import polars as pl

from tracekit.perfetto import wire
from tracekit.perfetto.protos import FtraceEventBundle

SWITCH_FIELDS = ("prev_comm", "prev_pid", "prev_prio", "prev_state", "next_comm", "next_pid",
                 "next_prio")  # fmt: skip
WAKING_FIELDS = ("comm", "pid", "prio", "target_cpu")
_C = FtraceEventBundle.CompactSched.DESCRIPTOR.fields_by_name
_COMPACT = FtraceEventBundle.DESCRIPTOR.fields_by_name["compact_sched"].number
_INT32 = (-(2**31), 2**31 - 1)


@dataclass
class SchedState:
    """Per CPU, as the importer will have it: the last switch's next task and its time."""

    next_pid: dict[int, int] = field(default_factory=dict)
    next_prio: dict[int, int] = field(default_factory=dict)
    next_comm: dict[int, str] = field(default_factory=dict)
    switch_ts: dict[int, int] = field(default_factory=dict)


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


def compact_switches(switch: pl.DataFrame, state: SchedState) -> npt.NDArray[np.bool_]:
    """Which of a chunk's sched_switch rows (time order) are lossless as compact; updates
    STATE with every switch."""
    frame = switch.select(
        "cpu", "ts", "common_pid", "prev_pid", "prev_prio", "prev_state", "next_pid",
        "next_prio", "next_comm", "prev_comm",
    )  # fmt: skip
    ok = np.zeros(frame.height, dtype=bool)
    for cpu, part in frame.with_row_index("i").group_by("cpu", maintain_order=True):
        c = int(cpu[0])  # type: ignore[index]
        idx = part["i"].to_numpy()
        nxt = part["next_pid"].to_numpy().astype(np.int64)
        prio = part["next_prio"].to_numpy().astype(np.int64)
        last_pid = np.concatenate([[state.next_pid.get(c, -1)], nxt[:-1]])
        last_prio = np.concatenate([[state.next_prio.get(c, -1)], prio[:-1]])
        known = np.concatenate([[c in state.next_pid], np.ones(len(idx) - 1, bool)])
        prev_pid = part["prev_pid"].to_numpy().astype(np.int64)
        nexts = part["next_comm"]
        last_comm = pl.concat([pl.Series([state.next_comm.get(c)], dtype=pl.String), nexts[:-1]])
        same_comm = (part["prev_comm"] == last_comm).fill_null(False).to_numpy()
        good = (
            known
            & same_comm
            & (prev_pid == last_pid)
            & (prev_pid != 0)  # the importer names every CPU's idle task "swapper"
            & (part["prev_prio"].to_numpy().astype(np.int64) == last_prio)
            & (part["common_pid"].to_numpy().astype(np.int64) == prev_pid)
            & part.select(pl.all_horizontal(pl.all().is_not_null())).to_series().to_numpy()
            & _in(nxt, _INT32) & _in(prio, _INT32)
        )  # fmt: skip
        ok[idx] = good
        state.next_pid[c], state.next_prio[c] = int(nxt[-1]), int(prio[-1])
        state.switch_ts[c] = int(part["ts"][-1])
        state.next_comm[c] = nexts[-1]
    return ok


def running_before(
    cpus: npt.NDArray[np.int64],
    ts: npt.NDArray[np.int64],
    switch_at: npt.NDArray[np.bool_],
    next_pid: npt.NDArray[np.int64],
    state: SchedState,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per chunk row: the pid the CPU's last switch ran and that switch's time (-1 if
    none), from the rows before it and STATE (read before the chunk's switches)."""
    frame = pl.DataFrame(
        {
            "cpu": cpus,
            "pid": np.where(switch_at, next_pid, -2),
            "ts": np.where(switch_at, ts, -2),
        }
    ).with_columns(pl.col("pid", "ts").replace(-2, None))
    filled = frame.with_columns(pl.col("pid", "ts").forward_fill().over("cpu"))
    carry_pid, carry_ts = _per_cpu(state.next_pid, cpus), _per_cpu(state.switch_ts, cpus)
    pid = filled["pid"].fill_null(-3).to_numpy()
    when = filled["ts"].fill_null(-3).to_numpy()
    return np.where(pid == -3, carry_pid, pid), np.where(when == -3, carry_ts, when)


def _per_cpu(values: Mapping[int, int], cpus: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each row's CPU's value (-1 for a CPU without one)."""
    table = np.full(int(cpus.max(initial=0)) + 1, -1, dtype=np.int64)
    for cpu, value in values.items():
        if cpu < table.size:
            table[cpu] = value
    return table[cpus]


def _in(values: npt.NDArray[np.int64], bounds: tuple[int, int]) -> npt.NDArray[np.bool_]:
    """Values within the inclusive bounds."""
    return (values >= bounds[0]) & (values <= bounds[1])


@dataclass
class CompactBuffer:
    """One bundle's compact events: columns gathered until the bundle is written."""

    comms: dict[str, int] = field(default_factory=dict)
    switch: list[npt.NDArray[np.int64]] = field(default_factory=list)  # ts, state, pid, prio, comm
    waking: list[npt.NDArray[np.int64]] = field(
        default_factory=list
    )  # ts, pid, cpu, prio, comm, flags

    def add(
        self,
        kind: str,
        columns: list[npt.NDArray[np.int64]],
        comms: npt.NDArray[np.int64],
        names: list[str],
    ) -> None:
        """Append events of KIND (switch or waking): their int columns and comms (indices
        into NAMES), each distinct comm put in the bundle's table once."""
        distinct, inverse = np.unique(comms, return_inverse=True)
        slots = [self.comms.setdefault(names[c], len(self.comms)) for c in distinct.tolist()]
        index = np.array(slots, dtype=np.int64)[inverse.reshape(-1)]
        target = self.switch if kind == "switch" else self.waking
        rows = [*columns[:4], index, *columns[4:]]
        if not target:
            target.extend(rows)
        else:
            target[:] = [np.concatenate([a, b]) for a, b in zip(target, rows, strict=True)]

    def encode(self) -> bytes:
        """The bundle's compact_sched field, or nothing when it holds no event."""
        if not self.switch and not self.waking:
            return b""
        body = b"".join(
            wire.tag(_C["intern_table"].number, wire.WIRE_LEN) + wire.varint_bytes(len(t)) + t
            for t in (c.encode() for c in self.comms)
        )
        names = (
            ("switch_timestamp", "switch_prev_state", "switch_next_pid", "switch_next_prio",
             "switch_next_comm_index"),
            ("waking_timestamp", "waking_pid", "waking_target_cpu", "waking_prio",
             "waking_comm_index", "waking_common_flags"),
        )  # fmt: skip
        for columns, fields in ((self.switch, names[0]), (self.waking, names[1])):
            if not columns:
                continue
            deltas = np.diff(columns[0], prepend=0)  # timestamps: deltas, the first absolute
            for name, values in zip(fields, [deltas, *columns[1:]], strict=True):
                body += wire.packed(_C[name].number, values)
        return wire.tag(_COMPACT, wire.WIRE_LEN) + wire.varint_bytes(len(body)) + body
