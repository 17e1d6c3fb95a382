"""`tracekit cleanup`: undo what killed runs left on this host; stdlib and click only."""

from __future__ import annotations

import click


@click.command()
def cleanup() -> None:
    """Undo what killed tracekit runs left: instances, probes, settings, children, mounts.

    Reads the journals under /run/tracekit (written before each change a run makes),
    then removes tracekit instances and probes of dead runs that no journal names. Live
    runs are left alone. What cannot be undone is named, with the command to do it.
    """
    from tracekit.host.cleanup import CleanupStack
    from tracekit.host.probes import remove_leftovers
    from tracekit.host.tracefs import Tracefs

    with CleanupStack() as stack:
        removed = remove_leftovers(Tracefs.open(stack))
    for line in removed:
        click.echo(f"undone: {line}")
    if not removed:
        click.echo("nothing left behind by killed tracekit runs")
