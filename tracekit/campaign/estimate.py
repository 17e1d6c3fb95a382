"""What a campaign costs before it runs: cells, time on the target, runs a verdict needs.

The time is the plan's own durations (collect's runs x duration per measure phase, the
probe slots) plus a per-cell boot and setup that the plan's [design.timing] may set;
defaults are stated in design.DEFAULT_TIMING. Standard library only (runs on the board).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.campaign.design import DEFAULT_TIMING, REPLICATES_FOR_INTERVALS, runs_for_verdict
from tracekit.campaign.plan import Plan
from tracekit.cpus import parse_cpu_list
from tracekit.host.protocol import Roles, plan_runs, scenario_named

# collect's own defaults for what a plan leaves out (tracekit/host/collect.py).
COLLECT_DEFAULTS = {"runs": 8, "traced_runs": 2, "duration": 20}
PROBE_MAX_SECONDS = 10  # host/runners.py: a probe slot runs at most this long
GUEST_RUN_SECONDS = 2.0  # one guest VM, created, run and torn down (assumed)
THROWAWAY_VM_SECONDS = 0.5  # one MMU-off VM of collect --vmid's prep (assumed)


@dataclass(frozen=True)
class Estimate:
    """A campaign's size and duration on one kind of target."""

    cells: int
    conditions: int
    measure_s: float  # per cell, from the plan's durations
    emulated_s: float  # whole campaign, emulated host
    board_s: float  # whole campaign, one board


def cell_measure_seconds(plan: Plan, scenario: str, placement: str, vmid: object = None) -> float:
    """Seconds of one cell's collect steps, from the plan's runs and durations."""
    opts = COLLECT_DEFAULTS | {k: v for k, v in plan.collect.items() if k in COLLECT_DEFAULTS}
    where = plan.placements[placement]
    roles = Roles(
        where.rt_cpu,
        tuple(parse_cpu_list(where.stress_cpus)),
        tuple(parse_cpu_list(where.guest_cpu)),
    )
    chosen = None if vmid is None else int(str(vmid))
    steps = plan_runs(
        scenario_named(scenario), roles, opts["runs"], opts["traced_runs"], "none", None, chosen
    )
    per_kind = {
        "quiet": float(opts["duration"]),
        "traced": float(opts["duration"]),
        "probe": float(min(opts["duration"], PROBE_MAX_SECONDS)),
    }
    prep = sum(int(str(s.detail["vms"])) for s in steps if s.kind == "vmid-prep")
    rest = sum(per_kind.get(s.kind, GUEST_RUN_SECONDS) for s in steps if s.kind != "vmid-prep")
    return rest + prep * THROWAWAY_VM_SECONDS


def estimate(plan: Plan, cells: list[dict[str, object]]) -> Estimate:
    """The campaign's duration on the emulated host and on a board, from its cells' axes."""
    timing = plan.design.timing if plan.design else dict(DEFAULT_TIMING)
    measure = [
        cell_measure_seconds(
            plan, str(c["scenario"]), str(c["placement"]), c.get("vmid", plan.collect.get("vmid"))
        )
        for c in cells
    ]
    total = sum(measure)
    emulated = total + len(cells) * (timing["boot_s"] + timing["setup_s"])
    board = total + len(cells) * (timing["board_boot_s"] + timing["board_setup_s"])
    conditions = len({tuple(sorted(map(str, c.items()))) for c in cells})
    return Estimate(len(cells), conditions, total / max(len(cells), 1), emulated, board)


def hours(seconds: float) -> str:
    """A duration for people: 2 h 05 min, or 12 min."""
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def summary_lines(plan: Plan, cells: list[dict[str, object]]) -> list[str]:
    """The design, cell count, estimated time and the runs a verdict needs, for printing."""
    lines = list(plan.design.summary()) if plan.design else ["design: the [matrix] only"]
    est = estimate(plan, cells)
    timing = plan.design.timing if plan.design else dict(DEFAULT_TIMING)
    lines.append(
        f"cells: {est.cells} ({est.conditions} conditions x {plan.repeats} replicate(s), each "
        "its own boot)"
    )
    lines.append(
        f"estimated time: emulated host {hours(est.emulated_s)} (boot {timing['boot_s']:g} s + "
        f"setup {timing['setup_s']:g} s + {est.measure_s:.0f} s measured per cell); a board "
        f"{hours(est.board_s)} (boot {timing['board_boot_s']:g} s + setup "
        f"{timing['board_setup_s']:g} s per cell); set [design.timing] to your target's"
    )
    lines += verdict_lines(plan)
    return lines


def verdict_lines(plan: Plan) -> list[str]:
    """Whether each cell has the runs its own verdict needs, and the design its intervals."""
    needed = runs_for_verdict()
    runs = int(plan.collect.get("runs", COLLECT_DEFAULTS["runs"]))
    lines = [
        f"runs per cell: a cell's before/after verdict needs {needed} quiet runs per phase "
        f"(exact rank test, alpha 0.05); the plan gives {runs}"
        + ("" if runs >= needed else f": TOO FEW, set [collect] runs = {needed}")
    ]
    if plan.design is not None:
        ok = plan.repeats >= REPLICATES_FOR_INTERVALS
        lines.append(
            f"replicates: effect intervals need {REPLICATES_FOR_INTERVALS} boots per condition"
            f" (the spread between boots); the plan gives {plan.repeats}"
            + ("" if ok else f": TOO FEW, set repeats = {REPLICATES_FOR_INTERVALS}")
        )
    return lines
