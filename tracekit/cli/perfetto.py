"""`tracekit perfetto`: export a trace to a Perfetto .pftrace, check one, open it in the UI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracekit.errors import TracekitError


@click.command("perfetto")
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option(
    "-o", "--output", "out", type=click.Path(path_type=str), help="The .pftrace to write."
)
@click.option(
    "--window", help="Only events in T0:T1 (seconds of the trace clock; a side may be empty)."
)
@click.option("--run", "run_id", help="In a bundle with several traced runs: the run to export.")
@click.option(
    "--kallsyms",
    type=click.Path(path_type=str),
    help="Kernel symbols (/proc/kallsyms format) to name function_graph addresses "
    "(default: the raw capture's own kallsyms copy).",
)
@click.option(
    "--check",
    "check_file",
    type=click.Path(path_type=str),
    help="Validate this .pftrace against Perfetto's import rules (alone, or after an export).",
)
@click.option(
    "--trace-processor",
    "processor",
    type=click.Path(path_type=str),
    help="Also load the output with this trace_processor_shell and print its import stats"
    " (untested here: none can be fetched on the development machine).",
)
@click.option(
    "--open",
    "open_ui",
    is_flag=True,
    help="Serve the output once on 127.0.0.1:9001 and print the ui.perfetto.dev link.",
)
def perfetto(
    path: str | None,
    out: str | None,
    window: str | None,
    run_id: str | None,
    kallsyms: str | None,
    check_file: str | None,
    processor: str | None,
    open_ui: bool,
) -> None:
    """Export PATH (bundle, trace.dat, raw capture or text trace) as a Perfetto trace.

    The output is checked with the same rules as --check, including that every event
    type has as many events as the source. Nothing is uploaded: --open serves the file
    from this machine to the browser only.
    """
    if path is None and check_file is None:
        raise TracekitError("give a trace to export (PATH -o OUT.pftrace) or --check FILE")
    if path is not None:
        if out is None:
            raise TracekitError("say where to write the Perfetto trace: -o OUT.pftrace")
        _export(path, out, window, run_id, kallsyms)
    if check_file is not None:
        _check(check_file, None)
    if processor is not None:
        _real_import(processor, out or check_file)  # type: ignore[arg-type]
    if open_ui:
        _open(out or check_file)  # type: ignore[arg-type]


def _export(
    path: str, out: str, window: str | None, run_id: str | None, kallsyms: str | None
) -> None:
    """Export, then validate the result against the source's counts."""
    import tracekit
    from tracekit.perfetto.export import export_trace, parse_window, read_kallsyms

    bounds = parse_window(window) if window else (None, None)
    trace_path, runs = _resolve(Path(path), run_id)
    if kallsyms is None and (trace_path / "kallsyms").is_file():
        kallsyms = str(trace_path / "kallsyms")  # a raw capture carries its own copy
    symbols = read_kallsyms(kallsyms) if kallsyms else None
    result = export_trace(tracekit.open(trace_path), out, bounds, symbols, runs)
    click.echo(
        f"wrote {out}: {sum(result.counts.values())} events of "
        f"{len(result.counts)} types, {result.packets} packets, {result.bytes} bytes"
    )
    _check(out, result.source_counts)


def _check(path: str, expected: Any) -> None:
    """Run the validator and fail (exit 1) when a rule is broken."""
    from tracekit.perfetto.validate import validate_file

    report = validate_file(path, expected)
    if report.ok:
        click.echo(f"{path}: {report.packets} packets, every import rule holds")
        return
    for problem in report.problems:
        click.echo(f"{path}: {problem}", err=True)
    for rule, more in report.suppressed.items():
        click.echo(f"{path}: {rule}: {more} more problems not shown", err=True)
    rules = ", ".join(sorted(report.broken_rules()))
    raise TracekitError(f"{path}: broken Perfetto import rules: {rules}", exit_code=1)


def _real_import(processor: str, path: str) -> None:
    """Print a real trace_processor's non-zero import stats; fail on errors/data loss."""
    from tracekit.perfetto.processor import import_stats

    stats = import_stats(processor, path)
    for stat in stats:
        click.echo(f"{path}: trace_processor: {stat}")
    bad = [s for s in stats if s.severity in ("error", "data_loss")]
    if bad:
        raise TracekitError(
            f"{path}: trace_processor reported {len(bad)} error/data-loss stats (listed above)",
            exit_code=1,
        )
    click.echo(f"{path}: trace_processor imported it with no error or data-loss stat")


def _resolve(path: Path, run_id: str | None) -> tuple[Path, list[dict[str, Any]]]:
    """The trace to open and the runs to draw: a bundle gives both, a trace only itself."""
    from tracekit.bundle import MANIFEST, read_manifest

    if not (path.is_dir() and (path / MANIFEST).exists()):
        return path, []
    manifest = read_manifest(path)
    runs = [vars(run) for run in manifest.runs]
    # A run's trace: its raw capture directory (files sit below it), or a trace.dat file.
    candidates = {
        (run.run_id, (path / f).parent if f.endswith("/capture.json") else path / f)
        for run in manifest.runs
        for f in run.files
    }
    every = sorted((rid, f) for rid, f in candidates if _is_trace(f))
    traced = [(rid, f) for rid, f in every if run_id is None or rid == run_id]
    if len(traced) != 1:
        have = ", ".join(rid for rid, _ in every) or "none"
        raise TracekitError(
            f"{path}: {len(traced)} traced runs match (have: {have}); choose one with --run"
        )
    return traced[0][1], runs


def _is_trace(path: Path) -> bool:
    """A raw capture directory or a trace.dat (by content)."""
    if path.is_dir():
        return (path / "capture.json").exists()
    if not path.is_file():
        return False
    from tracekit.ingest.tracedat import MAGIC

    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def _open(path: str) -> None:
    """Serve the file once and tell the user which link loads it."""
    from tracekit.perfetto.serve import serve_once

    def ready(link: str, port: int) -> None:
        """Print the link while the server waits."""
        click.echo(f"serving {path} once on 127.0.0.1:{port} (nothing is uploaded); open:")
        click.echo(link)

    serve_once(path, on_ready=ready)
