"""The `tracekit` command: a thin click layer over the library.

Each command group lives in its own module here and imports the library lazily, so
`tracekit --help` stays fast and the host-side commands never import polars.
"""

from __future__ import annotations

import importlib
import sys

import click

from tracekit import __version__
from tracekit.cli.examples import add_examples_to
from tracekit.errors import TracekitError

# What the analysis side imports beyond the host side's click and pyelftools.
ANALYSIS_MODULES = ("polars", "numpy", "perfetto", "zstandard")


def missing_analysis(ctx: click.Context, module: str) -> str:
    """One line: this command analyses, the module is missing, what to install."""
    # While a command's module is imported click has not yet named it: resolve_command's
    # first argument is the name.
    command = ctx.invoked_subcommand or (ctx.protected_args or ["this command"])[0]
    return (
        f"`tracekit {command}` analyses traces and needs {module}, which this python does"
        f" not have: pip install tracekit (polars, numpy, perfetto, zstandard); a board needs"
        " only collect, cleanup and campaign --board (python3-click, python3-pyelftools)"
    )


# Each command: the module that defines it and its name there. A command's module is
# imported only when that command runs (or when --help lists them all): importing every
# one cost each command about 0.45 s of start-up (the vhost and host-side modules).
COMMANDS: dict[str, tuple[str, str]] = {
    "board-pack": ("tracekit.cli.boardpack", "board_pack"),
    "campaign": ("tracekit.cli.campaign", "campaign"),
    "cleanup": ("tracekit.cli.cleanup", "cleanup"),
    "collect": ("tracekit.cli.collect", "collect"),
    "dataset": ("tracekit.cli.dataset", "dataset"),
    "events": ("tracekit.cli.ingest", "events"),
    "ingest": ("tracekit.cli.ingest", "ingest"),
    "perfetto": ("tracekit.cli.perfetto", "perfetto"),
    "report": ("tracekit.cli.report", "report"),
    "simulate": ("tracekit.cli.simulate", "simulate"),
    "symbols": ("tracekit.cli.symbols", "symbols"),
    "verify": ("tracekit.cli.verify", "verify"),
    "vhost": ("tracekit.cli.vhost", "vhost"),
}


class TracekitGroup(click.Group):
    """A click group that loads each command's module when it is needed (click's lazy
    group) and turns TracekitError and Ctrl-C into one clear line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command, loaded or not."""
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command, its module imported on first use (with its examples attached)."""
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(module), attribute)
            add_examples_to(cmd_name, command)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

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
