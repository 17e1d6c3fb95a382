"""`tracekit ingest` and `tracekit events`: decode a trace, summarise it, print rows."""

from __future__ import annotations

import click

from tracekit.cli.progress import progress_bar

TABLE_ROWS = 50
SYMBOLS_HELP = (
    "A kallsyms copy or vmlinux naming address fields (`<field>_sym` columns); "
    "default: the trace's own kallsyms copy."
)


@click.command("ingest")
@click.argument("path", type=click.Path(path_type=str))
@click.option(
    "--salvage", is_flag=True, help="Read up to damage in a corrupt file and say what was skipped."
)
@click.option("--no-cache", is_flag=True, help="Parse again and do not write the Parquet cache.")
@click.option("--symbols", type=click.Path(path_type=str), help=SYMBOLS_HELP)
@click.option(
    "--parquet",
    "parquet_dir",
    type=click.Path(path_type=str),
    help="Also write every table as Parquet into this directory, with tables.json listing"
    " them (docs/tables.md).",
)
def ingest(
    path: str, salvage: bool, no_cache: bool, symbols: str | None, parquet_dir: str | None
) -> None:
    """Decode PATH (trace.dat, raw capture directory, text trace or a bundle), cache it as
    Parquet and print a summary: events per type per CPU, time span, lost events."""
    from tracekit.ingest import open_path

    with progress_bar("ingest: runs") as steps:
        trace = open_path(
            path, salvage=salvage, use_cache=not no_cache, symbols=symbols, progress=steps
        )
    click.echo(trace.summary())
    if trace.meta.get("cache"):
        click.echo(f"cache: {trace.meta['cache']}")
    if parquet_dir is not None:
        click.echo(f"parquet: {trace.write_parquet(parquet_dir)}")


@click.command("events")
@click.argument("path", type=click.Path(path_type=str))
@click.option("--event", "-e", "event", help="Show this event's typed table (its fields).")
@click.option(
    "--cpu",
    "cpu_list",
    help="Only these CPUs, a list as the kernel writes it (0-2,5); each must be in the trace.",
)
@click.option("--phase", help="A bundle: only the runs of this phase (before, guest, after, ...).")
@click.option("--run", "run_id", help="A bundle: only this run (its id, as `ingest` lists them).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@click.option("--limit", type=int, help=f"At most this many rows (table default {TABLE_ROWS}).")
@click.option("--salvage", is_flag=True, help="Read up to damage in a corrupt file.")
@click.option("--symbols", type=click.Path(path_type=str), help=SYMBOLS_HELP)
def events(
    path: str,
    event: str | None,
    cpu_list: str | None,
    phase: str | None,
    run_id: str | None,
    fmt: str,
    limit: int | None,
    salvage: bool,
    symbols: str | None,
) -> None:
    """Print the events of PATH (or one event type's fields) for a quick look."""
    import polars as pl

    from tracekit.ingest import open_path

    trace = open_path(path, salvage=salvage, symbols=symbols)
    df = trace.event(event) if event else trace.events
    if cpu_list is not None:
        df = df.filter(pl.col("cpu").is_in(_cpus(trace, cpu_list)))
    for option, column, wanted in (("phase", "phase", phase), ("run", "run_id", run_id)):
        if wanted is not None:
            df = df.filter(pl.col(column).cast(pl.String) == _known(trace, option, column, wanted))
    if limit is None and fmt == "table":
        limit = TABLE_ROWS
    if limit is not None:
        df = df.head(limit)
    df = _hex_addresses(df)
    if fmt == "csv":
        click.echo(_flat(df).write_csv(), nl=False)
    elif fmt == "json":
        click.echo(df.write_json())
    else:
        with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, fmt_str_lengths=60):
            click.echo(df)


def _known(trace: "Trace", option: str, column: str, wanted: str) -> str:  # noqa: F821, UP037
    """WANTED if the bundle has that run or phase (--OPTION, COLUMN of the meta's runs);
    otherwise one line saying what it has."""
    from tracekit.errors import TracekitError

    runs = trace.meta.get("runs")
    if runs is None:
        raise TracekitError(f"--{option} needs a bundle; {trace.path} is a single trace")
    have = list(dict.fromkeys(r[column] for r in runs))
    if wanted not in have:
        raise TracekitError(
            f"--{option} {wanted!r}: this bundle's traced {option}s are {', '.join(have)}"
        )
    return wanted


def _cpus(trace: "Trace", text: str) -> list[int]:  # noqa: F821, UP037
    """The CPUs of a --cpu list, each one the trace recorded (else one line saying which)."""
    from tracekit.cpus import format_cpu_list, parse_cpu_list
    from tracekit.errors import TracekitError

    wanted = parse_cpu_list(text)
    if not wanted:
        raise TracekitError("--cpu: the list is empty; name CPUs as the kernel does, e.g. 0-2,5")
    recorded = {int(c) for c in trace.meta.get("cpus") or trace.events["cpu"].unique()}
    absent = [c for c in wanted if c not in recorded]
    if absent:
        raise TracekitError(
            f"--cpu {text}: CPU {format_cpu_list(absent)} not in this trace, which recorded"
            f" CPUs {format_cpu_list(recorded) or 'none'}; pick from those"
        )
    return wanted


def _hex_addresses(df: "pl.DataFrame") -> "pl.DataFrame":  # noqa: F821, UP037
    """Address fields (those with a `_sym` column) as 0x... text, as the kernel prints them;
    also in JSON, where a 64-bit kernel address would lose digits as a number."""
    import polars as pl

    addresses = [c for c in df.columns if f"{c}_sym" in df.columns]
    return df.with_columns(
        pl.Series(c, [None if v is None else f"{v:#x}" for v in df[c].to_list()], pl.String)
        for c in addresses
    )


def _flat(df: "pl.DataFrame") -> "pl.DataFrame":  # noqa: F821, UP037
    """CSV cannot hold lists: render list columns as space-separated values."""
    import polars as pl

    lists = [c for c, t in df.schema.items() if isinstance(t, (pl.List, pl.Array))]
    return df.with_columns(pl.col(c).cast(pl.List(pl.String)).list.join(" ") for c in lists)
