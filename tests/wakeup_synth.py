"""Generated event tables of cyclictest wake-ups whose every part is known in advance.

Each `Loop` says how long each stage takes; `events()` lays the loops out one after the
other on the rt CPU (local timers) with the same tables and columns the ingest gives a
real trace (docs/tables.md), so the wake-up analysis cannot tell them from a recording.
Used where a real run cannot give a known answer: an injected long interrupt, a blocking
task, a missing event.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

RT_CPU = 3
THREAD = 100  # the measuring thread (SCHED_FIFO 99: kernel prio 0)
HOG = 200  # a task that keeps the CPU
TIMER = 0xFFFF000012340000
PERIOD = 1_000_000
SCHEMAS = {
    "hrtimer_start": {"hrtimer": pl.UInt64, "function_sym": pl.Categorical, "expires": pl.Int64},
    "hrtimer_expire_entry": {"hrtimer": pl.UInt64, "now": pl.Int64, "function_sym": pl.Categorical},
    "irq_handler_entry": {"irq": pl.Int32, "name": pl.String},
    "irq_handler_exit": {"irq": pl.Int32, "ret": pl.Int32},
    "sched_waking": {"comm": pl.String, "pid": pl.Int32, "prio": pl.Int32, "target_cpu": pl.Int32},
    "sched_wakeup": {"comm": pl.String, "pid": pl.Int32, "prio": pl.Int32, "target_cpu": pl.Int32},
    "sched_switch": {
        "prev_comm": pl.String,
        "prev_pid": pl.Int32,
        "prev_prio": pl.Int32,
        "prev_state": pl.Int64,
        "next_comm": pl.String,
        "next_pid": pl.Int32,
        "next_prio": pl.Int32,
    },
    "softirq_entry": {"vec": pl.UInt32},
    "softirq_exit": {"vec": pl.UInt32},
}
COMMON = {"row": pl.Int64, "ts": pl.Int64, "cpu": pl.Int32, "common_pid": pl.Int32}


@dataclass(frozen=True)
class Loop:
    """One wake-up's stage lengths in ns (all local to the rt CPU)."""

    irq_delay: int = 20_000  # expiry -> timer interrupt entry
    handler: int = 5_000  # interrupt entry -> sched_waking
    enqueue: int = 1_000  # sched_waking -> sched_wakeup
    tail: int = 2_000  # sched_wakeup -> the interrupt's exit
    other_irq: int = 0  # another interrupt after the timer's (0: none)
    softirq: int = 0  # a softirq after that (0: none)
    hog: int = 0  # another task runs this long before the switch (0: none)
    sched: int = 3_000  # the rest, up to the switch-in

    @property
    def total(self) -> int:
        """Expected latency: expiry -> switch-in."""
        parts = (self.irq_delay, self.handler, self.enqueue, self.tail, self.other_irq)
        return sum(parts) + self.softirq + self.hog + self.sched


def events(loops: list[Loop], start: int = 10_000_000) -> dict[str, pl.DataFrame]:
    """The event tables of these loops, one period apart."""
    rows: dict[str, list[dict[str, object]]] = {name: [] for name in SCHEMAS}

    def add(event: str, ts: int, current: int, **fields: object) -> None:
        seq = sum(len(v) for v in rows.values())  # insertion order breaks ties in ts
        rows[event].append({"ts": ts, "cpu": RT_CPU, "common_pid": current, "_seq": seq, **fields})

    for i, loop in enumerate(loops):
        t = start + i * PERIOD
        expiry = t + 100_000
        add(
            "hrtimer_start", t, THREAD, hrtimer=TIMER, function_sym="hrtimer_wakeup", expires=expiry
        )
        add("sched_switch", t + 1_000, THREAD, **_switch(THREAD, "cyclictest", 0, 0, "swapper/3"))
        now = expiry + loop.irq_delay
        add("irq_handler_entry", now, 0, irq=11, name="arch_timer")
        add(
            "hrtimer_expire_entry",
            now + 100,
            0,
            hrtimer=TIMER,
            now=now,
            function_sym="hrtimer_wakeup",
        )
        now += loop.handler
        add("sched_waking", now, 0, comm="cyclictest", pid=THREAD, prio=0, target_cpu=RT_CPU)
        now += loop.enqueue
        add("sched_wakeup", now, 0, comm="cyclictest", pid=THREAD, prio=0, target_cpu=RT_CPU)
        now += loop.tail
        add("irq_handler_exit", now, 0, irq=11, ret=1)
        current, comm = 0, "swapper/3"
        if loop.hog:
            add("sched_switch", now, 0, **_switch(0, "swapper/3", HOG, 120, "hog"))
            current, comm = HOG, "hog"
        if loop.other_irq:
            add("irq_handler_entry", now, current, irq=2, name="injected")
            now += loop.other_irq
            add("irq_handler_exit", now, current, irq=2, ret=1)
        if loop.softirq:
            add("softirq_entry", now, current, vec=1)
            now += loop.softirq
            add("softirq_exit", now, current, vec=1)
        now += loop.hog + loop.sched
        add("sched_switch", now, current, **_switch(current, comm, THREAD, 0, "cyclictest"))
    return _tables(rows)


def _switch(prev: int, prev_comm: str, nxt: int, prio: int, next_comm: str) -> dict[str, object]:
    """sched_switch fields."""
    return {
        "prev_comm": prev_comm,
        "prev_pid": prev,
        "prev_prio": 0 if prev == THREAD else 120,
        "prev_state": 1 if prev == THREAD else 0,
        "next_comm": next_comm,
        "next_pid": nxt,
        "next_prio": prio,
    }


def _tables(rows: dict[str, list[dict[str, object]]]) -> dict[str, pl.DataFrame]:
    """Typed tables with `row` numbering every event in time order, as ingest does."""
    base = {k: v for k, v in COMMON.items() if k != "row"} | {"_seq": pl.Int64}
    frames = {
        name: pl.DataFrame(found, schema=base | SCHEMAS[name]).with_columns(
            pl.lit(name).alias("_event")
        )
        for name, found in rows.items()
    }
    everything = pl.concat(list(frames.values()), how="diagonal_relaxed").sort("ts", "_seq")
    everything = everything.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64))
    return {
        name: everything.filter(pl.col("_event") == name).select(*COMMON, *SCHEMAS[name])
        for name in frames
    }
