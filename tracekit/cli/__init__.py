"""The `tracekit` command: a thin click layer over the library.

Each command group lives in its own module here and imports the library lazily, so
`tracekit --help` stays fast and the host-side commands never import polars.
"""

from __future__ import annotations

import sys

import click

from tracekit import __version__
from tracekit.errors import TracekitError


class TracekitGroup(click.Group):
    """A click group that turns TracekitError and Ctrl-C into one clear line."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except TracekitError as err:
            click.echo(f"tracekit: error: {err}", err=True)
            sys.exit(err.exit_code)
        except KeyboardInterrupt as err:
            # Ctrl-C, or SIGTERM/SIGHUP turned into an interrupt by the host side.
            click.echo(f"tracekit: interrupted {err}".rstrip(), err=True)
            sys.exit(getattr(err, "exit_code", 130))


@click.group(cls=TracekitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracekit")
def main() -> None:
    """Record and explain KVM/arm64 TLB-invalidation effects.

    Host side (root on the arm64 host): collect, cleanup. Anywhere: vhost (the emulated arm64
    host), ingest, report, perfetto, symbols.
    """


def _register() -> None:
    """Attach the command groups that exist; each module owns its commands."""
    from tracekit.cli import (
        campaign,
        cleanup,
        collect,
        ingest,
        perfetto,
        report,
        simulate,
        symbols,
        verify,
        vhost,
    )

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


_register()
