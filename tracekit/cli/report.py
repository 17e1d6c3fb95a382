"""`tracekit report`: what a bundle shows, for a terminal (more formats with issue 7)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to a file.")
def report(bundle: Path, output: Path | None) -> None:
    """Summarise a collect bundle: numbers with spread, before/after verdicts, losses."""
    from tracekit.ingest.bundle import load_bundle
    from tracekit.report.text import render_text

    text = render_text(load_bundle(bundle))
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)
        click.echo(f"wrote {output}")
