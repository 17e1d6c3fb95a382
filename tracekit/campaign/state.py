"""campaign.json: what a campaign is, which cells ran, how each ended, where it stopped.

The same record is the resume state: it is rewritten (atomically) before and after every
cell, so a Ctrl-C, a crash or a reboot between cells loses nothing, and the next start
picks up the first cell that has not finished.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracekit import __version__
from tracekit.campaign.cells import Cell
from tracekit.campaign.plan import Plan
from tracekit.errors import TracekitError

CAMPAIGN_FILE = "campaign.json"
SCHEMA = "tracekit-campaign"
SCHEMA_VERSION = 1

# A cell the host died in is tried again, but not forever: it may be what kills the host.
MAX_ATTEMPTS = 2

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"


def now() -> str:
    """The wall-clock time, ISO 8601 UTC, for records."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Attempt:
    """One try at a cell: when, how it ended, and where a partial output was moved."""

    started: str
    finished: str = ""
    # done, failed, stopped (Ctrl-C: tried again), interrupted (the host died or rebooted)
    outcome: str = "running"
    exit_status: int | None = None
    note: str = ""
    moved_to: str = ""


@dataclass
class CellRecord:
    """A cell, its status, and what the host it ran on really was."""

    cell_id: str
    position: int
    repeat: int
    axes: dict[str, Any]
    status: str = PENDING
    bundle: str | None = None  # relative to the campaign directory
    kernel_release: str = ""
    kvm_mode: str = ""  # as the kernel initialised it
    notes: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)

    @classmethod
    def from_cell(cls, cell: Cell) -> CellRecord:
        """A pending record for a freshly expanded cell."""
        return cls(cell.cell_id, cell.position, cell.repeat, dict(cell.axes))


@dataclass
class Campaign:
    """The whole campaign record, serialised as campaign.json."""

    mode: str  # "vhost" or "board"
    plan: dict[str, Any]
    plan_file: str
    fingerprint: str
    seed: int
    cells: list[CellRecord]
    emulated: bool
    created: str = field(default_factory=now)
    updated: str = ""
    complete: bool = False
    stopped: dict[str, str] = field(default_factory=dict)
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION
    tracekit_version: str = __version__

    @classmethod
    def new(cls, mode: str, plan: Plan, seed: int, cells: list[Cell]) -> Campaign:
        """A campaign about to start: every cell pending."""
        return cls(
            mode=mode,
            plan=plan.to_json() | {"seed": seed},
            plan_file=plan.source,
            fingerprint=plan.fingerprint(),
            seed=seed,
            cells=[CellRecord.from_cell(cell) for cell in cells],
            emulated=mode == "vhost",
        )

    def next_pending(self) -> CellRecord | None:
        """The first cell, in run order, that still has to run."""
        return next((cell for cell in self.cells if cell.status == PENDING), None)

    def counts(self) -> dict[str, int]:
        """How many cells are in each status."""
        counts = dict.fromkeys((PENDING, RUNNING, DONE, FAILED), 0)
        for cell in self.cells:
            counts[cell.status] += 1
        return counts

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON data."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Campaign:
        """Rebuild the record from campaign.json data."""
        cells = [
            CellRecord(**{**cell, "attempts": [Attempt(**a) for a in cell["attempts"]]})
            for cell in data["cells"]
        ]
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**fields, "cells": cells})


def save(campaign: Campaign, paths: list[Path]) -> None:
    """Write the record to every path, atomically (a crash leaves the old or the new one)."""
    campaign.updated = now()
    text = json.dumps(campaign.to_json(), indent=1) + "\n"
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        with partial.open("w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        partial.replace(path)


def load(path: Path) -> Campaign:
    """Read a campaign record; a damaged or foreign file is one clear error."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TracekitError(
            f"cannot read campaign state {path}: {err}; delete it to start the campaign afresh"
        ) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise TracekitError(f"{path} is not a tracekit campaign record; give another --state")
    return Campaign.from_json(data)


def check_same_plan(campaign: Campaign, plan: Plan, path: Path) -> None:
    """Resuming must continue the same plan: a changed plan would mix two experiments."""
    if campaign.fingerprint != plan.fingerprint():
        raise TracekitError(
            f"{path} records a campaign of another plan ({campaign.plan_file}, plan changed "
            "since?); resume it with that plan, or use a new output directory/--state"
        )


def begin_attempt(cell: CellRecord) -> Attempt:
    """Mark a cell running with a fresh attempt (saved before the cell starts)."""
    attempt = Attempt(started=now())
    cell.attempts.append(attempt)
    cell.status = RUNNING
    return attempt


def end_attempt(
    cell: CellRecord, attempt: Attempt, outcome: str, exit_status: int | None, note: str = ""
) -> None:
    """Close an attempt; a stopped or interrupted cell goes back to pending.

    Only interruptions by the host itself count against MAX_ATTEMPTS: a Ctrl-C is the
    user's choice, a host that dies in a cell may do so every time.
    """
    attempt.finished = now()
    attempt.outcome = outcome
    attempt.exit_status = exit_status
    attempt.note = note
    if outcome == "stopped":
        cell.status = PENDING
    elif outcome == "interrupted":
        tries = sum(1 for a in cell.attempts if a.outcome == "interrupted")
        cell.status = PENDING if tries < MAX_ATTEMPTS else FAILED
        if cell.status == FAILED:
            cell.notes.append(f"interrupted {tries} times; not tried again")
    else:
        cell.status = DONE if outcome == "done" else FAILED
