"""`tracekit report BUNDLE...`: what bundles show, as text, email, html or json."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-f",
    "--format",
    "fmt",
    default="text",
    show_default=True,
    help="text (terminal), email (plain, 72 columns), html (one file, plots), json.",
)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to a file.")
@click.option(
    "--verify",
    is_flag=True,
    help="Check every file's sha256 against the manifest first (sizes are always checked).",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress lines on stderr (default: when stderr is a terminal).",
)
def report(
    bundles: tuple[Path, ...], fmt: str, output: Path | None, verify: bool, progress: bool | None
) -> None:
    """Report on bundles: numbers with spread, verdicts, attribution, what is not known.

    A directory of bundles (a campaign's output) is taken as a whole.
    """
    from tracekit.errors import TracekitError
    from tracekit.report.assemble import build_report
    from tracekit.report.load import load_bundles
    from tracekit.report.render import FORMATS, render

    if fmt not in FORMATS:
        raise TracekitError(f"report: unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")

    show = sys.stderr.isatty() if progress is None else progress

    def step(message: str) -> None:
        if show:
            click.echo(message, err=True)

    data = load_bundles(list(bundles), step, verify)
    text = render(build_report(data, step), fmt)
    if output is None:
        click.echo(text, nl=False)
    else:
        try:
            output.write_text(text)
        except OSError as err:
            raise TracekitError(f"report: cannot write {output} ({err.strerror})") from None
        click.echo(f"wrote {output}", err=True)
