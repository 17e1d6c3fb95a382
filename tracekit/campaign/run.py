"""Run a campaign: every cell in a fresh emulated host, or one cell per boot of a board.

The campaign directory holds one bundle per finished cell (`<dir>/<cell id>/`, each
with its manifest.json, so `tracekit report DIR` reads them all), `campaign.json` (the
record and resume state), `logs/` (each board cell's output), `vhost-logs/<cell id>/`
(each emulated boot's console and kernel logs) and `interrupted/` (partial outputs of
cells that were stopped, kept, never mixed with the finished bundles).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracekit.bundle import MANIFEST
from tracekit.campaign import state
from tracekit.campaign.cells import Cell, draw_seed, expand_cells
from tracekit.campaign.command import (
    VHOST_CAMPAIGN_DIR,
    VHOST_GUESTS_DIR,
    check_board_plan,
    check_vhost_cells,
    collect_argv,
    describe,
    guests_dir_of,
    vhost_settings,
)
from tracekit.campaign.plan import Plan
from tracekit.campaign.state import Campaign, CellRecord
from tracekit.errors import TracekitError

Echo = Callable[[str], None]

# The board-side default way to start the next boot (`--reboot`).
REBOOT_ARGV = ("systemctl", "reboot")


def _project() -> Path:
    """The checkout holding tracekit and the reproducer (shared into the emulated host)."""
    from tracekit.vhost.runner import project_tree

    return project_tree()


def open_campaign(plan: Plan, mode: str, state_path: Path) -> Campaign:
    """The campaign recorded at `state_path` (same plan, same mode), else a new one."""
    if state_path.is_file():
        campaign = state.load(state_path)
        state.check_same_plan(campaign, plan, state_path)
        if campaign.mode != mode:
            where = "on a board" if campaign.mode == "board" else "in the emulated host"
            raise TracekitError(
                f"{state_path} records a campaign run {where}; resume it the same way, or use "
                "a new output directory"
            )
        return campaign
    seed = plan.seed if plan.seed is not None else draw_seed()
    return Campaign.new(mode, plan, seed, expand_cells(plan, seed))


def record_paths(out: Path, state_path: Path) -> list[Path]:
    """campaign.json in the campaign directory, and the --state file if it is elsewhere."""
    main = out / state.CAMPAIGN_FILE
    return [main] if state_path.resolve() == main.resolve() else [main, state_path]


def cell_of(record: CellRecord) -> Cell:
    """The Cell a record stands for."""
    return Cell(record.cell_id, record.position, record.repeat, record.axes)


def check_guests(plan: Plan) -> None:
    """Every guest variant the matrix names must be built, before the first cell runs."""
    guests = Path(guests_dir_of(_project()))
    for variant in plan.matrix["guest"]:
        if variant is not None and not (guests / f"{variant}.elf").is_file():
            raise TracekitError(
                f"plan {plan.source}: guest {variant!r} not found in {guests}; build the "
                "reproducer (`make -C reproducer CROSS_COMPILE=aarch64-linux-gnu-`) or fix "
                "the name"
            )


def _move_aside(out: Path, record: CellRecord, attempt: state.Attempt) -> None:
    """Keep a stopped cell's partial output under interrupted/, out of the bundles."""
    partial = out / record.cell_id
    if not partial.exists():
        return
    dest = out / "interrupted" / f"{record.cell_id}-attempt{len(record.attempts)}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(dest)
    attempt.moved_to = str(dest.relative_to(out))


def _bundle_facts(bundle: Path) -> dict[str, Any]:
    """The host facts a finished bundle recorded (kernel release, KVM mode)."""
    try:
        host = json.loads((bundle / MANIFEST).read_text()).get("host", {})
    except (OSError, ValueError):
        return {}
    return host if isinstance(host, dict) else {}


def _finish_cell(
    out: Path, plan: Plan, record: CellRecord, attempt: state.Attempt, exit_status: int
) -> None:
    """Close a cell that ran to its end: done with a bundle (or a dry run), else failed."""
    bundle = out / record.cell_id
    has_bundle = (bundle / MANIFEST).is_file()
    if has_bundle:
        record.bundle = record.cell_id
        host = _bundle_facts(bundle)
        record.kernel_release = record.kernel_release or str(host.get("kernel_release", ""))
        kvm = host.get("kvm")
        if isinstance(kvm, dict) and not record.kvm_mode:
            record.kvm_mode = str(kvm.get("mode", ""))
    dry_run = bool(plan.collect.get("dry_run"))
    if exit_status == 0 and (has_bundle or dry_run):
        state.end_attempt(record, attempt, "done", 0, "dry run: no bundle" if dry_run else "")
        return
    note = f"collect exited with status {exit_status}"
    if exit_status == 0:
        note = "collect exited 0 but wrote no bundle (manifest.json missing)"
    state.end_attempt(record, attempt, "failed", exit_status, note)


def run_vhost_campaign(plan: Plan, out: Path, echo: Echo) -> Campaign:
    """Run every pending cell, each in a fresh boot of the emulated host."""
    from tracekit.vhost.runner import GT_BUNDLE_DIR, VhostConfig, add_ground_truth
    from tracekit.vhost.runner import run as run_vhost

    state_path = out / state.CAMPAIGN_FILE
    campaign = open_campaign(plan, "vhost", state_path)
    check_vhost_cells(plan, [cell_of(record) for record in campaign.cells])
    check_guests(plan)
    paths = record_paths(out, state_path)
    for message in recover_running(campaign, out):
        echo(message)
    state.save(campaign, paths)
    while (record := campaign.next_pending()) is not None:
        cell = cell_of(record)
        settings = vhost_settings(cell, plan)
        logs = out / "vhost-logs" / record.cell_id
        config = VhostConfig(**settings, share=out.resolve(), out=logs)
        bundle = f"{VHOST_CAMPAIGN_DIR}/{record.cell_id}"
        command = collect_argv(cell, plan, bundle, VHOST_GUESTS_DIR, "python3")
        _announce(campaign, record, echo, describe(command))
        attempt = state.begin_attempt(record)
        campaign.stopped = {}
        state.save(campaign, paths)
        try:
            result = run_vhost(
                config, command, on_output=echo, progress=lambda m: echo(f"vhost: {m}")
            )
        except KeyboardInterrupt:
            _stop(campaign, out, record, attempt, paths, "interrupted (Ctrl-C)")
            raise
        except TracekitError as err:
            state.end_attempt(record, attempt, "failed", err.exit_code, str(err))
            state.save(campaign, paths)
            echo(f"campaign: cell {record.cell_id} failed: {err}")
            continue
        record.kernel_release = result.kernel_release
        record.kvm_mode = result.kvm_mode
        record.notes = list(result.notes)
        if config.ground_truth and (out / record.cell_id / MANIFEST).is_file():
            # The bundle is on the share (out/CELL), not under the boot's --out: by name.
            add_ground_truth(logs, out / record.cell_id)
            record.notes.append(f"ground truth added to {record.cell_id}/{GT_BUNDLE_DIR}/")
        _finish_cell(out, plan, record, attempt, result.exit_status)
        state.save(campaign, paths)
        echo(f"campaign: cell {record.cell_id}: {record.status}")
    campaign.complete = True
    state.save(campaign, paths)
    return campaign


def _announce(campaign: Campaign, record: CellRecord, echo: Echo, command: str) -> None:
    """Say which cell starts, of how many, and what it runs."""
    axes = ", ".join(
        f"{k}={'(scenario default)' if v is None else v}" for k, v in record.axes.items()
    )
    echo(f"campaign: cell {record.position}/{len(campaign.cells)} {record.cell_id}: {axes}")
    echo(f"campaign: {command}")


def _stop(
    campaign: Campaign,
    out: Path,
    record: CellRecord,
    attempt: state.Attempt,
    paths: list[Path],
    reason: str,
) -> None:
    """Record where the campaign stopped; the cell runs again from scratch next time."""
    _move_aside(out, record, attempt)
    state.end_attempt(record, attempt, "stopped", None, reason)
    campaign.stopped = {"cell": record.cell_id, "reason": reason, "at": state.now()}
    state.save(campaign, paths)


def recover_running(campaign: Campaign, out: Path) -> list[str]:
    """Cells left `running` died with the host (or with tracekit): close them, say so."""
    messages = []
    for record in campaign.cells:
        if record.status == state.RUNNING and record.attempts:
            attempt = record.attempts[-1]
            _move_aside(out, record, attempt)
            state.end_attempt(
                record, attempt, "interrupted", None, "the host restarted while this cell ran"
            )
            messages.append(
                f"campaign: cell {record.cell_id} was running when the host went down; "
                f"{'it runs again' if record.status == state.PENDING else 'given up'}"
            )
    return messages


def run_board_step(
    plan: Plan, out: Path, state_path: Path, echo: Echo, reboot: list[str] | None = None
) -> Campaign:
    """Run the next pending cell on this host and return (a boot hook calls this each boot)."""
    check_board_plan(plan)
    check_guests(plan)
    campaign = open_campaign(plan, "board", state_path)
    paths = record_paths(out, state_path)
    for message in recover_running(campaign, out):
        echo(message)
    record = campaign.next_pending()
    if record is None:
        campaign.complete = True
        state.save(campaign, paths)
        return campaign
    command = collect_argv(
        cell_of(record), plan, str(out / record.cell_id), guests_dir_of(_project()), sys.executable
    )
    _announce(campaign, record, echo, describe(command))
    attempt = state.begin_attempt(record)
    campaign.stopped = {}
    state.save(campaign, paths)
    try:
        exit_status = _run_logged(command, out / "logs" / f"{record.cell_id}.txt", echo)
    except KeyboardInterrupt:
        _stop(campaign, out, record, attempt, paths, "interrupted (Ctrl-C)")
        raise
    if not record.kernel_release:
        record.kernel_release = os.uname().release
    _finish_cell(out, plan, record, attempt, exit_status)
    note_emulated(campaign, record, out / record.cell_id)
    campaign.complete = campaign.next_pending() is None
    state.save(campaign, paths)
    echo(f"campaign: cell {record.cell_id}: {record.status}")
    if reboot and not campaign.complete:
        left = campaign.counts()[state.PENDING]
        echo(f"campaign: {left} cells left; rebooting: {describe(reboot)}")
        subprocess.run(reboot, check=False)
    return campaign


def note_emulated(campaign: Campaign, record: CellRecord, bundle: Path) -> None:
    """A board step whose bundle says the host was emulated: campaign.json says so too."""
    from tracekit.vhost.runner import EMULATED_NOTE

    if _bundle_facts(bundle).get("emulated") is not True:
        return
    campaign.emulated = True
    if EMULATED_NOTE not in record.notes:
        record.notes.append(EMULATED_NOTE)


def _run_logged(argv: list[str], log: Path, echo: Echo) -> int:
    """Run a cell's command, its output both shown and saved; wait for it even on Ctrl-C."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                handle.write(line)
                echo(line.rstrip("\n"))
        except KeyboardInterrupt:
            # The collector got the same Ctrl-C and is restoring the host: let it finish.
            proc.wait()
            raise
        return proc.wait()
