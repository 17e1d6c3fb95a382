"""What one cell runs: the `tracekit collect` command line, and the emulated host it boots.

Pure functions: no process is started here, so every cell's command can be printed,
checked and tested without a boot.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from tracekit.campaign.cells import Cell
from tracekit.campaign.design import factor_target, target_argv
from tracekit.campaign.plan import COLLECT_OPTIONS, Plan
from tracekit.errors import TracekitError
from tracekit.vhost.kernels import parse_kernel_spec
from tracekit.vhost.qemu import check_page_size

# The campaign directory is shared into the emulated host here; each cell's bundle is
# written to <this>/<cell id>. The checkout is at /tracekit (tracekit vhost's layout).
VHOST_CAMPAIGN_DIR = "/share"
VHOST_GUESTS_DIR = "/tracekit/reproducer/build/guests"


def collect_argv(cell: Cell, plan: Plan, bundle: str, guests_dir: str, python: str) -> list[str]:
    """`python -m tracekit collect ...` for the cell, writing its bundle to `bundle`."""
    placement = plan.placements[cell.axes["placement"]]
    argv = [
        python,
        "-m",
        "tracekit",
        "collect",
        "--rt-cpu",
        str(placement.rt_cpu),
        "--stress-cpus",
        placement.stress_cpus,
        "--guest-cpu",
        placement.guest_cpu,
        "--after-guest",
        cell.axes["after_guest"],
        "--scenario",
        cell.axes["scenario"],
    ]
    if cell.axes["guest"] is not None:
        argv += ["--guest", f"{guests_dir}/{cell.axes['guest']}.elf"]
    for key, value in plan.collect.items():
        argv += _option(key, value)
    return [*argv, *design_argv(cell, plan), "-o", bundle]


def design_argv(cell: Cell, plan: Plan) -> list[str]:
    """The collect arguments of the design's fixed settings and this cell's factor levels."""
    design = plan.design
    if design is None:
        return []
    argv: list[str] = []
    for name, value in design.fixed.items():
        argv += target_argv(name, factor_target(plan.source, name, COLLECT_OPTIONS), value)
    for factor in design.factors:
        argv += factor.argv(str(cell.axes[factor.name]))
    return argv


def _option(key: str, value: Any) -> list[str]:
    """One [collect] entry as command-line arguments (lists repeat, true flags stand alone)."""
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [flag] if value else []
    if isinstance(value, list):
        return [item for entry in value for item in (flag, str(entry))]
    return [flag, str(value)]


def isolation_args(rt_cpu: int) -> str:
    """Kernel arguments that isolate the rt CPU as the brief's protocol does."""
    return f"isolcpus={rt_cpu} nohz_full={rt_cpu} rcu_nocbs={rt_cpu}"


def vhost_settings(cell: Cell, plan: Plan) -> dict[str, Any]:
    """The VhostConfig fields of the cell's boot (kernel, mode, model, CPUs, isolation)."""
    placement = plan.placements[cell.axes["placement"]]
    extra = str(plan.vhost.get("append", ""))
    settings: dict[str, Any] = {
        "kernel": cell.kernel,
        "kvm_mode": cell.axes["kvm_mode"],
        "cpu_model": cell.axes["cpu_model"],
        "smp": int(plan.vhost.get("smp", 4)),
        "clusters": int(plan.vhost.get("clusters", 1)),
        "memory_mb": int(plan.vhost.get("memory", 2048)),
        "timeout_s": float(plan.vhost.get("timeout", 3600)),
        "append": " ".join(part for part in (isolation_args(placement.rt_cpu), extra) if part),
        # A simulated mechanism is applied by the plugin, so its cells load it.
        "ground_truth": bool(plan.vhost.get("ground_truth", False))
        or bool(cell.axes.get("simulate")),
        "simulate": cell.axes.get("simulate"),
    }
    return settings


def check_vhost_cells(plan: Plan, cells: list[Cell]) -> None:
    """Refuse, before the first boot, cells the emulated host cannot run as asked."""
    smp = int(plan.vhost.get("smp", 4))
    for name, placement in plan.placements.items():
        if name in plan.matrix["placement"] and placement.highest_cpu() >= smp:
            raise TracekitError(
                f"plan {plan.source}: placement {name!r} uses CPU {placement.highest_cpu()} "
                f"but the emulated host has {smp} CPUs; raise [vhost] smp"
            )
    for cell in cells:
        mode, model = cell.axes["kvm_mode"], cell.axes["cpu_model"]
        if mode == "vhe" and model != "max":
            raise TracekitError(
                f"plan {plan.source}: kvm_mode 'vhe' needs cpu_model 'max' (QEMU's cortex "
                f"models have no VHE), but a cell pairs it with {model!r}; drop that pair"
            )
        try:
            check_page_size(model, parse_kernel_spec(cell.kernel).info.page_kb, cell.kernel)
        except TracekitError as err:
            raise TracekitError(f"plan {plan.source}: {err}") from None


def check_board_plan(plan: Plan) -> None:
    """On a board the kernel, KVM mode and CPU are what it booted: one value each, if any."""
    for axis in ("kernel", "kvm_mode", "cpu_model"):
        if len(plan.matrix[axis]) > 1:
            raise TracekitError(
                f"plan {plan.source}: [matrix] {axis} has several values, but a board runs "
                "the kernel and CPU it booted; run one campaign per board setup"
            )
    if plan.matrix["simulate"] != [None]:
        raise TracekitError(
            f"plan {plan.source}: [matrix] simulate is for the emulated host only: a board "
            "runs its own mechanism; leave simulate out"
        )


def describe(argv: list[str]) -> str:
    """A command line as a shell would show it."""
    return shlex.join(argv)


def guests_dir_of(project: Path) -> str:
    """Where the reproducer's guest ELFs are in a checkout."""
    return str(project / "reproducer" / "build" / "guests")
