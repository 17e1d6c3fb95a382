"""Where a simulated model's delays landed, beside what it intended: pure functions.

The plugin's log gives, per vCPU over the whole boot, what the model asked (issuer
delays, responder payments), what the busy waits took, and how much of the vCPU's own
TLBI -> DSB spans overlapped another vCPU's delay (MTTCG's exclusive sections: a delay
on one vCPU holds up the others' broadcasts). A bundle's probe slots add, per CPU, the
probe account (tracekit.simulate.expected): the model's per-call intent against the
observed increase, and the part held up inside the call's own invalidations.
"""

from __future__ import annotations

import polars as pl

from tracekit.simulate.expected import ProbeAccount, per_call, probe_account
from tracekit.simulate.simlog import SimLog

LANDED_SCHEMA = {
    "vCPU": pl.Int64,
    "issuer delays": pl.Int64,
    "asked ms": pl.Float64,
    "took ms": pl.Float64,
    "responder pays": pl.Int64,
    "responder asked ms": pl.Float64,
    "responder took ms": pl.Float64,
    "spans held up": pl.Int64,
    "held up ms": pl.Float64,
}


def landed_table(log: SimLog) -> pl.DataFrame:
    """Per vCPU: the model's intent (asked) and where it landed (took, held up)."""
    rows = [
        (
            vcpu,
            c["delayed"],
            c["injected_ns"] / 1e6,
            c["actual_ns"] / 1e6,
            c["pays"],
            c["asked_ns"] / 1e6,
            c["paid_actual_ns"] / 1e6,
            c["waited_spans"],
            c["waited_ns"] / 1e6,
        )
        for vcpu, c in sorted(log.vcpus.items())
    ]
    return pl.DataFrame(rows, schema=LANDED_SCHEMA, orient="row")


def landed_line(log: SimLog) -> str:
    """One sentence: what the model asked in all, what it took, what it held up."""
    asked = (log.total("injected_ns") + log.total("asked_ns")) / 1e6
    took = (log.total("actual_ns") + log.total("paid_actual_ns")) / 1e6
    held = log.total("waited_ns") / 1e6
    return (
        f"the model asked {asked:.1f} ms of delays over the boot (issuers and responders),"
        f" the busy waits took {took:.1f} ms, and held up the other vCPUs' own"
        f" invalidations for {held:.1f} ms ({log.total('waited_spans')} TLBI -> DSB spans)"
    )


def probe_accounts(
    samples: pl.DataFrame,
    rows: pl.DataFrame,
    cost_ns: int,
    windows: dict[int, list[tuple[int, int]]],
) -> list[tuple[int, str, ProbeAccount]]:
    """Per probe CPU and mode (one slot each before and after): the probe account.

    `samples`: the bundle's probe samples (ingest.probe.probe_samples); `rows`: its
    ground truth, with run_id; `windows`: each CPU's paying windows (expected.paying_windows).
    Slots without a partner in the other phase are left out.
    """
    accounts = []
    keys = samples.select("cpu", "mode", "pages").unique().sort("cpu", "mode", "pages")
    for cpu, mode, pages in keys.iter_rows():
        slot = samples.filter(
            (pl.col("cpu") == cpu) & (pl.col("mode") == mode) & (pl.col("pages") == pages)
        )
        calls = {}
        for phase in ("before", "after"):
            mine = slot.filter(pl.col("phase") == phase)
            ids = mine["run_id"].unique().to_list()
            if len(ids) == 1:
                mine_rows = rows.filter(pl.col("run_id") == ids[0])
                calls[phase] = per_call(mine, mine_rows, cpu, windows.get(cpu, []))
        if len(calls) == 2:
            accounts.append((cpu, mode, probe_account(calls["before"], calls["after"], cost_ns)))
    return accounts
