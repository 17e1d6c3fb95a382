"""A plan's cells: the matrix product times the repeats, in a seeded random order.

Order matters on real hardware (drift, warm-up, thermal state), so cells run in a random
order drawn from a recorded seed: the same plan and seed give the same order again.
"""

from __future__ import annotations

import itertools
import random
import secrets
from dataclasses import dataclass
from typing import Any

from tracekit.campaign.plan import AXES, Plan


@dataclass(frozen=True)
class Cell:
    """One condition of the matrix, one repeat: one fresh boot."""

    cell_id: str
    position: int  # 1-based, in run order
    repeat: int  # 1-based
    axes: dict[str, Any]

    @property
    def kernel(self) -> str:
        """The kernel spec, e.g. `trixie` or `sid:16k`."""
        return str(self.axes["kernel"])


def draw_seed() -> int:
    """A fresh seed for a plan that gives none (it is recorded, so the order can be redone)."""
    return secrets.randbits(32)


def _label(value: Any, axis: str = "") -> str:
    """An axis value as it appears in a directory name (a design factor's with its name)."""
    text = "default" if value is None else str(value).replace(":", "-").replace("/", "-")
    return text if axis in AXES or not axis else f"{axis}{text}"


def cell_name(
    position: int, axes: dict[str, Any], varying: list[str], repeat: int, repeats: int
) -> str:
    """`NNN-<varying axis values>[-rK]`: sortable in run order, readable, unique."""
    parts = [f"{position:03d}", *(_label(axes[axis], axis) for axis in varying)]
    if repeats > 1:
        parts.append(f"r{repeat}")
    return "-".join(parts)


def plan_conditions(plan: Plan) -> list[dict[str, Any]]:
    """The matrix's conditions, each crossed with the design's (factor name -> level)."""
    axes = list(AXES)
    design = plan.design.conditions() if plan.design else [{}]
    return [
        dict(zip(axes, values, strict=True)) | levels
        for values in itertools.product(*plan.matrix.values())
        for levels in design
    ]


def _varying(plan: Plan) -> list[str]:
    """The matrix axes and design factors that take more than one value."""
    axes = [axis for axis in AXES if len(plan.matrix[axis]) > 1]
    return axes + [f.name for f in plan.design.factors] if plan.design else axes


def expand_cells(plan: Plan, seed: int) -> list[Cell]:
    """Every (condition, repeat) of the plan, shuffled with `seed` unless shuffle is off."""
    conditions = plan_conditions(plan)
    todo = [
        (condition, repeat) for repeat in range(1, plan.repeats + 1) for condition in conditions
    ]
    if plan.shuffle:
        random.Random(seed).shuffle(todo)
    varying = _varying(plan)
    return [
        Cell(
            cell_name(position, condition, varying, repeat, plan.repeats),
            position,
            repeat,
            condition,
        )
        for position, (condition, repeat) in enumerate(todo, 1)
    ]
