"""The `tracekit` command: a thin click layer over the library.

Each command group lives in its own module here and imports the library lazily, so
`tracekit --help` stays fast and the host-side commands never import polars.
"""

from __future__ import annotations

import sys

import click

from tracekit import __version__
from tracekit.errors import TracekitError

# What the analysis side imports beyond the host side's click and pyelftools.
ANALYSIS_MODULES = ("polars", "numpy", "perfetto", "zstandard")


def missing_analysis(ctx: click.Context, module: str) -> str:
    """One line: this command analyses, the module is missing, what to install."""
    command = ctx.invoked_subcommand or "this command"
    return (
        f"`tracekit {command}` analyses traces and needs {module}, which this python does"
        f" not have: pip install tracekit (polars, numpy, perfetto, zstandard); a board needs"
        " only collect, cleanup and campaign --board (python3-click, python3-pyelftools)"
    )


class TracekitGroup(click.Group):
    """A click group that turns TracekitError and Ctrl-C into one clear line."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except TracekitError as err:
            click.echo(f"tracekit: error: {err}", err=True)
            sys.exit(err.exit_code)
        except ModuleNotFoundError as err:
            if err.name not in ANALYSIS_MODULES:
                raise
            # A board's python3 has only click and pyelftools: say what the command needs.
            click.echo(f"tracekit: error: {missing_analysis(ctx, err.name)}", err=True)
            sys.exit(2)
        except KeyboardInterrupt as err:
            # Ctrl-C, or SIGTERM/SIGHUP turned into an interrupt by the host side.
            click.echo(f"tracekit: interrupted {err}".rstrip(), err=True)
            sys.exit(getattr(err, "exit_code", 130))


@click.group(cls=TracekitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracekit")
def main() -> None:
    """Record and explain KVM/arm64 TLB-invalidation effects.

    Host side (root on the arm64 host): collect, cleanup. Anywhere: board-pack (the archive
    for a board), vhost (the emulated arm64 host), ingest, events, report, perfetto,
    symbols, verify, campaign, dataset.
    """


def _register() -> None:
    """Attach the command groups that exist; each module owns its commands."""
    from tracekit.cli import (
        boardpack,
        campaign,
        cleanup,
        collect,
        dataset,
        ingest,
        perfetto,
        report,
        simulate,
        symbols,
        verify,
        vhost,
    )
    from tracekit.cli.examples import add_examples

    main.add_command(vhost.vhost)
    main.add_command(collect.collect)
    main.add_command(cleanup.cleanup)
    ingest.register(main)
    main.add_command(perfetto.perfetto)
    main.add_command(simulate.simulate)
    main.add_command(symbols.symbols)
    main.add_command(report.report)
    main.add_command(verify.verify)
    main.add_command(campaign.campaign)
    main.add_command(dataset.dataset)
    main.add_command(boardpack.board_pack)
    add_examples(main)


_register()
