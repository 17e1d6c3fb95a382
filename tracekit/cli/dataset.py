"""`tracekit dataset CAMPAIGN_DIR... -o DIR`: per-run results as one Parquet dataset."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command()
@click.argument("campaigns", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path),
    help="The dataset directory: created, or appended to.",
)
@click.option(
    "--campaign",
    help="The campaign's name in the dataset (default: each directory's name).",
)
def dataset(campaigns: tuple[Path, ...], output: Path, campaign: str | None) -> None:
    """Append campaigns' (or bundles') per-run results to a hive-partitioned Parquet dataset.

    One file per bundle and table under TABLE/campaign=NAME/schema_version=N/; a bundle
    already in the dataset (same manifest) is skipped. `tracekit report DIR` reads the
    dataset for the cross-campaign sections; DuckDB, polars or Spark read it directly.
    """
    from tracekit.dataset import add_campaigns

    show = sys.stderr.isatty()
    added = add_campaigns(
        list(campaigns),
        output,
        campaign,
        progress=(lambda m: click.echo(m, err=True)) if show else None,
    )
    for a in added:
        rows = ", ".join(f"{t} {n}" for t, n in a.rows.items() if n)
        click.echo(
            f"{a.campaign}: {a.added} bundles added, {a.skipped} already held"
            + (f" (rows: {rows})" if rows else "")
        )
