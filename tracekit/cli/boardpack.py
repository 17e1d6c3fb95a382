"""`tracekit board-pack`: the archive a board needs to collect (standard library only)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("board-pack")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("tracekit-board.tar.gz"),
    show_default=True,
    help="The archive to write.",
)
@click.option(
    "--cross-compile",
    "cross",
    help="Compiler prefix (default: aarch64-linux-gnu- off arm64, none on arm64).",
)
def board_pack(output: Path, cross: str | None) -> None:
    """Build the reproducer static and pack it with the host-side tracekit and a run
    script into one archive: copy it to the board, unpack, run ./run.sh collect ..."""
    from tracekit.boardpack import board_pack as pack
    from tracekit.boardpack import default_cross

    pack(output, default_cross() if cross is None else cross, echo=click.echo)
    click.echo(f"board-pack: {output}: on the board, tar xf it, then ./tracekit-board/run.sh")
