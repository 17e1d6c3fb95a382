"""`tracekit perfetto`: export a trace to a Perfetto .pftrace, check one, open it in the UI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracekit.cli.progress import progress_bar
from tracekit.errors import TracekitError


@click.command("perfetto")
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option(
    "-o",
    "--output",
    "out",
    type=click.Path(path_type=str),
    help="The file to write (default: named after PATH in the current directory: .pftrace,"
    " or .tar for a bundle's several traced runs, a TAR of one trace each).",
)
@click.option(
    "--window", help="Only events in T0:T1 (seconds of the trace clock; a side may be empty)."
)
@click.option("--run", "run_id", help="In a bundle: export only this run (default: every run).")
@click.option("--phase", help="In a bundle: export only this phase's runs (before, guest, ...).")
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
    help="Also load the output with this trace_processor_shell (Perfetto's importer, the"
    " UI's code) and print its import stats; fail on an error or data-loss stat.",
)
@click.option(
    "--open",
    "open_ui",
    is_flag=True,
    help="Serve the output once on 127.0.0.1:9001 and print the ui.perfetto.dev link.",
)
@click.option(
    "--open-wait",
    "open_wait",
    type=click.FloatRange(min=1),
    default=300,
    show_default=True,
    help="With --open: seconds to wait for the UI to fetch the file before giving up.",
)
def perfetto(
    path: str | None,
    out: str | None,
    window: str | None,
    run_id: str | None,
    phase: str | None,
    kallsyms: str | None,
    check_file: str | None,
    processor: str | None,
    open_ui: bool,
    open_wait: float,
) -> None:
    """Export PATH (bundle, trace.dat, raw capture or text trace) as a Perfetto trace.

    A bundle becomes one timeline: every run (before -> guest -> after) with its trace,
    cyclictest latencies and probe samples, unless --run or --phase selects. The export
    checks that every event type has as many events written as the source has; give
    --check OUT too to read the file back against every import rule (slower than the
    export on a large trace), or --trace-processor to load it into Perfetto's own
    importer. Nothing is uploaded: --open serves the file from this machine to the
    browser only.
    """
    if path is None and check_file is None:
        raise TracekitError("give a trace to export (PATH [-o OUT.pftrace]) or --check FILE")
    result = None
    if path is not None:
        result = _export(path, out, window, run_id, phase, kallsyms)
        out = result.path
    if check_file is not None:
        own = result is not None and Path(check_file) == Path(out or "")
        _check(check_file, result.source_counts if own else None)  # type: ignore[union-attr]
    if processor is not None:
        gaps = None if result is None else result.switch_gaps
        _real_import(processor, out or check_file, gaps)  # type: ignore[arg-type]
    if open_ui:
        _open(out or check_file, open_wait)  # type: ignore[arg-type]


def _export(
    path: str,
    out: str | None,
    window: str | None,
    run_id: str | None,
    phase: str | None,
    kallsyms: str | None,
) -> Any:
    """Export, then check the counts written against the source's; the ExportResult."""
    from tracekit.bundle import is_bundle
    from tracekit.perfetto.bundle import export_bundle
    from tracekit.perfetto.export import parse_window
    from tracekit.symbols.kallsyms import address_names

    bounds = parse_window(window) if window else (None, None)
    if is_bundle(Path(path)):
        given = address_names(kallsyms) if kallsyms else None
        with progress_bar("perfetto: runs") as steps:
            result, notes = export_bundle(
                Path(path), out, bounds, run_id, phase, given, steps, ProgressLines()
            )
        for note in notes:
            click.echo(f"note: {note}", err=True)
        if result.traces:
            click.echo(f"traced runs exported: {', '.join(result.traces)}")
        if result.empty:
            click.echo(f"traced runs with no event in the window: {', '.join(result.empty)}")
    else:
        if run_id is not None or phase is not None:
            raise TracekitError(
                f"{path}: --run and --phase select runs of a bundle; this is a trace"
            )
        result = _export_trace(Path(path), out or _trace_output(path), bounds, kallsyms)
    out = result.path
    click.echo(
        f"wrote {out}: {sum(result.counts.values())} events of "
        f"{len(result.counts)} types, {result.packets} packets, {result.bytes} bytes"
    )
    _tell_kind(out, len(result.members))
    _check_counts(out, result.counts, result.source_counts)
    return result


def _trace_output(path: str) -> str:
    """A trace's default output: its name (a file's without its suffix) + .pftrace, here."""
    given = Path(path).resolve()
    return f"{given.name if given.is_dir() else given.stem}.pftrace"


def _tell_kind(out: str, members: int) -> None:
    """Say what OUT is when several traces went into it (a TAR), and when its name says
    otherwise than what it holds (a TAR named .pftrace, one trace named .tar)."""
    tar = Path(out).suffix == ".tar"
    if members and tar:
        click.echo(
            f"{out}: a TAR of {members} Perfetto traces (one per traced run, one of the "
            "tracks), which the Perfetto UI and trace_processor open as one timeline"
        )
    elif members:
        click.echo(
            f"note: {out} is a TAR of {members} Perfetto traces (one per traced run, one of "
            "the tracks), not one trace: the Perfetto UI and trace_processor open it as one "
            "timeline, other tools may not; name it .tar (the default without -o) to say so",
            err=True,
        )
    elif tar:
        click.echo(f"note: {out} is one Perfetto trace, not a TAR; .pftrace says so", err=True)


def _check_counts(out: str, written: Any, source: Any) -> None:
    """Fail (exit 1) unless every event type has as many events written as the source."""
    differ = sorted(n for n in set(written) | set(source) if written[n] != source[n])
    if differ:
        shown = ", ".join(f"{n}: {written[n]} written, {source[n]} in the source" for n in differ)
        raise TracekitError(f"{out}: events lost on the way: {shown}", exit_code=1)
    click.echo(
        f"{out}: every event written ({len(source)} types, as many of each as the source);"
        f" every import rule: add --check {out}"
    )


def _export_trace(
    path: Path, out: str, bounds: tuple[int | None, int | None], kallsyms: str | None
) -> Any:
    """One trace (trace.dat, raw capture, text) into OUT."""
    import tracekit
    from tracekit.perfetto.export import export_trace
    from tracekit.symbols.kallsyms import address_names

    if kallsyms is None and (path / "kallsyms").is_file():
        kallsyms = str(path / "kallsyms")  # a raw capture carries its own copy
    symbols = address_names(kallsyms) if kallsyms else None
    return export_trace(tracekit.open(path), out, bounds, symbols, progress=ProgressLines())


class ProgressLines:
    """The export's progress on stderr: a line per trace at each tenth of its events (only
    for traces large enough to take a while)."""

    def __init__(self, least: int = 500_000) -> None:
        self.least = least
        self._shown: dict[str, int] = {}

    def __call__(self, name: str, done: int, total: int) -> None:
        """Print when NAME's export passes the next tenth."""
        if total < self.least:
            return
        tenth = done * 10 // total
        if tenth > self._shown.get(name, 0):
            self._shown[name] = tenth
            click.echo(f"exporting {name}: {done:,} of {total:,} events ({tenth * 10}%)", err=True)


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


def _real_import(processor: str, path: str, gaps: int | None = None) -> None:
    """Print a real trace_processor's non-zero import stats; fail on errors/data loss but
    the sched_switch mismatches the export says were recorded (GAPS)."""
    from tracekit.perfetto.processor import SWITCH_MISMATCH, import_stats, version

    stats = import_stats(processor, path)
    click.echo(f"{path}: trace_processor {version(processor)}")
    for stat in stats:
        click.echo(f"{path}: trace_processor: {stat}")
    mismatches = sum(s.value for s in stats if s.name == SWITCH_MISMATCH)
    recorded = gaps is not None and mismatches == gaps
    if recorded and mismatches:
        click.echo(
            f"{path}: {SWITCH_MISMATCH} = {mismatches} is what the trace recorded: that many "
            "sched_switches whose prev_pid is not the next_pid of the CPU's switch before "
            "(e.g. a CPU taken offline and back)"
        )
    bad = [
        s
        for s in stats
        if s.severity in ("error", "data_loss") and not (recorded and s.name == SWITCH_MISMATCH)
    ]
    if bad:
        raise TracekitError(
            f"{path}: trace_processor reported {len(bad)} error/data-loss stats (listed above)",
            exit_code=1,
        )
    beyond = " beyond what the trace recorded" if recorded and mismatches else ""
    click.echo(f"{path}: trace_processor imported it with no error or data-loss stat{beyond}")


def _open(path: str, wait_s: float) -> None:
    """Serve the file once and tell the user which link loads it."""
    from tracekit.perfetto.serve import serve_once

    def ready(link: str, port: int) -> None:
        """Print the link while the server waits."""
        click.echo(
            f"serving {path} once on 127.0.0.1:{port} for up to {wait_s:g} s "
            "(nothing is uploaded); open:"
        )
        click.echo(link)

    serve_once(path, on_ready=ready, wait_s=wait_s)
