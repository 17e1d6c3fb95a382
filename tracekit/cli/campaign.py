"""`tracekit campaign PLAN`: a matrix of cells, one fresh boot each (emulated host or board)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click


@click.command()
@click.argument("plan_file", metavar="PLAN", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, file_okay=False),
    help="Campaign directory (bundles + campaign.json); default: campaign-<plan name>.",
)
@click.option("--board", is_flag=True, help="On this arm64 host: run the next cell, then exit.")
@click.option(
    "--state",
    "state_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Resume state (--board); default: <output>/campaign.json.",
)
@click.option("--reboot", is_flag=True, help="--board: reboot after the cell if cells remain.")
@click.option(
    "--reboot-command",
    default="systemctl reboot",
    show_default=True,
    help="How --reboot restarts the host.",
)
@click.option(
    "--lava",
    "lava",
    is_flag=True,
    help="Run each cell as a LAVA job on a board farm (the plan's [lava] table), via lavacli.",
)
@click.option(
    "--lava-jobs-only",
    is_flag=True,
    help="--lava: write each cell's job definition to <output>/lava-jobs/ and submit nothing.",
)
@click.option("--lava-identity", help="--lava: the lavacli identity (its config holds the token).")
@click.option(
    "--lava-poll",
    default=30.0,
    show_default=True,
    help="--lava: seconds between job status checks.",
)
@click.option(
    "--list", "list_only", is_flag=True, help="Print the cells in run order; run nothing."
)
@click.option(
    "--design",
    "design_only",
    is_flag=True,
    help="Print the design, cell count, estimated time and runs a verdict needs; run nothing.",
)
def campaign(
    plan_file: Path,
    output: Path | None,
    board: bool,
    state_file: Path | None,
    reboot: bool,
    reboot_command: str,
    lava: bool,
    lava_jobs_only: bool,
    lava_identity: str | None,
    lava_poll: float,
    list_only: bool,
    design_only: bool,
) -> None:
    """Run PLAN's matrix of cells, each on a freshly booted host, into one directory.

    Without --board every cell boots the emulated host (its timings are emulated, not
    hardware timings). With --board each call runs the next pending cell on this host
    and exits: call it from a boot hook (see README). Ctrl-C stops the current cell and
    records where; the same command resumes. `tracekit report DIR` reads the result.
    With --lava each cell is a job on a LAVA board farm, its bundle fetched back into
    the same directory (docs/campaign.md, "Board farms").
    Every start prints the design first (docs/campaign.md, "Designs").
    """
    from tracekit.campaign.cells import plan_conditions
    from tracekit.campaign.estimate import summary_lines
    from tracekit.campaign.plan import load_plan
    from tracekit.campaign.run import open_campaign, run_board_step, run_vhost_campaign
    from tracekit.campaign.state import CAMPAIGN_FILE, FAILED

    plan = load_plan(plan_file)
    out = output or Path(f"campaign-{plan_file.stem}")
    state_path = state_file or out / CAMPAIGN_FILE
    cells = [c for c in plan_conditions(plan) for _ in range(plan.repeats)]
    for line in summary_lines(plan, cells):
        click.echo(line)
    if design_only:
        return
    if list_only:
        record = open_campaign(plan, "board" if board else "vhost", state_path)
        drawn = " (drawn now: set `seed` in the plan to fix the order)" if plan.seed is None else ""
        click.echo(f"seed {record.seed}{drawn}; {len(record.cells)} cells in run order:")
        for cell in record.cells:
            click.echo(f"  {cell.cell_id:40} {cell.status}")
        return
    if lava or lava_jobs_only:
        from tracekit.campaign import lava as farm

        if lava_jobs_only:
            record = open_campaign(plan, "lava", state_path)
            written = farm.write_jobs(plan, record, out)
            click.echo(f"campaign: {len(written)} LAVA job definitions in {out / farm.JOBS_DIR}")
            return
        client = farm.Lavacli(lava_identity)
        result = farm.run_lava_campaign(plan, out, click.echo, client, lava_poll)
    elif board:
        reboot_argv = shlex.split(reboot_command) if reboot else None
        result = run_board_step(plan, out, state_path, click.echo, reboot_argv)
    else:
        result = run_vhost_campaign(plan, out, click.echo)
    counts = result.counts()
    click.echo(
        f"campaign: {counts['done']} done, {counts['failed']} failed, {counts['pending']} "
        f"pending of {len(result.cells)} (seed {result.seed}); record {out / CAMPAIGN_FILE}"
    )
    if result.complete:
        click.echo(f"campaign: complete; read it with `tracekit report {out}`")
    if any(cell.status == FAILED for cell in result.cells):
        sys.exit(1)
