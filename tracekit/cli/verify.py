"""`tracekit verify BUNDLE...`: is a bundle whole and unchanged since it was collected?"""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
def verify(bundles: tuple[Path, ...]) -> None:
    """Check each bundle's manifest, completeness, and every file's size and sha256.

    One line per problem; exit status 1 when any bundle has one. A directory of bundles
    (a campaign's output) is checked bundle by bundle.

    Example: tracekit verify bundle/
    """
    from tracekit.bundle import bundle_problems, find_bundles, read_manifest

    damaged = 0
    for root in dict.fromkeys(b for path in bundles for b in find_bundles(path)):
        problems = bundle_problems(root, read_manifest(root), full=True)
        damaged += bool(problems)
        for problem in problems:
            click.echo(f"{root}: {problem}")
        if not problems:
            click.echo(f"{root}: ok (every file as collected)")
    if damaged:
        raise SystemExit(1)
