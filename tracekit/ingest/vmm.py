"""The reproducer VMM's stdout (`record=run|vm|summary` key=value lines) as polars tables.

The format is documented in reproducer/README.md ("Output"). One file may hold several
VMM invocations one after another (a `run` record starts each); every `vm` row carries
the index of its invocation (`batch`) and that invocation's parameters, so an analysis
gets one flat table. Lines that are not records are counted, never dropped silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from tracekit.errors import TracekitError
from tracekit.guests import vmm_unescape

if TYPE_CHECKING:
    from tracekit.bundle import RunRecord
    from tracekit.ingest.bundle import BundleData


_PAIR = re.compile(r"(\w+)=(\S*)")
# Parameters of the `run` record copied onto each of its VMs.
RUN_KEYS = ("variant", "vcpus", "ram_mb", "touch_kb", "clock", "backing")
VM_SCHEMA = {
    "batch": pl.Int32,
    "vm": pl.Int32,
    "ipa_bits": pl.Int32,
    "create_start_ns": pl.Int64,
    "create_ns": pl.Int64,
    "run_ns": pl.Int64,
    "teardown_ns": pl.Int64,
    "teardown_end_ns": pl.Int64,
    "result": pl.String,
    "variant": pl.String,
    "vcpus": pl.Int32,
    "ram_mb": pl.Int32,
    "touch_kb": pl.Int64,
    "clock": pl.String,
    "backing": pl.String,  # the run record's (default, 4k, thp, hugetlb); null before it
}


@dataclass(frozen=True)
class VmmOutput:
    """Every invocation's `run` record, one row per VM, and the lines that were no record."""

    runs: list[dict[str, str]]  # the `run` records as given (values unescaped only for %XX)
    vms: pl.DataFrame  # VM_SCHEMA: one row per `vm` record, in file order
    summaries: list[dict[str, str]]
    skipped: list[str]  # lines that were not key=value records
    # The ground-truth sync markers (`sync` records: source, vm, event, cpu, t0, t1).
    syncs: list[dict[str, str]] = field(default_factory=list)


def _record(line: str) -> dict[str, str] | None:
    """The key=value pairs of one line, or None when it is not a VMM record."""
    if not line.startswith("record="):
        return None
    return {key: vmm_unescape(value) for key, value in _PAIR.findall(line)}


def _vm_row(fields: dict[str, str], batch: int, run: dict[str, str]) -> dict[str, object]:
    """One `vm` record as a typed row, tagged with its invocation's parameters."""
    row: dict[str, object] = {"batch": batch, "result": fields.get("result")}
    for key, dtype in VM_SCHEMA.items():
        if key in ("batch", "result"):
            continue
        text = fields.get(key, run.get(key))
        if dtype == pl.String:
            row[key] = text
        else:
            row[key] = _bounded(key, text, 31 if dtype == pl.Int32 else 63)
    return row


def _bounded(key: str, text: str | None, bits: int) -> int | None:
    """An integer field that fits its column; ValueError (the line's error) when not."""
    if text in (None, ""):
        return None
    value = int(text)  # type: ignore[arg-type]
    if not -(1 << bits) <= value < 1 << bits:
        raise ValueError(f"{key}={text} does not fit a {bits + 1}-bit integer")
    return value


def parse_vmm_output(text: str, source: str = "VMM output") -> VmmOutput:
    """Parse the VMM's stdout text; a `vm` record before any `run` record is an error."""
    runs: list[dict[str, str]] = []
    vms: list[dict[str, object]] = []
    summaries: list[dict[str, str]] = []
    skipped: list[str] = []
    syncs: list[dict[str, str]] = []
    for n, line in enumerate(text.splitlines(), 1):
        fields = _record(line.strip())
        if fields is None:
            if line.strip():
                skipped.append(f"{source}: line {n}: {line[:60]!r}")
            continue
        kind = fields["record"]
        if kind == "run":
            runs.append(fields)
        elif kind == "vm" and runs:
            try:
                vms.append(_vm_row(fields, len(runs) - 1, runs[-1]))
            except ValueError as err:
                raise TracekitError(
                    f"{source}: line {n}: a `vm` record with a non-integer field ({err}); "
                    "give the VMM's stdout unchanged"
                ) from None
        elif kind == "vm":
            raise TracekitError(
                f"{source}: line {n}: a `vm` record before any `run` record; "
                "give the VMM's whole stdout, starting with its record=run line"
            )
        elif kind == "summary":
            summaries.append(fields)
        elif kind == "sync":
            syncs.append(fields)
        else:
            skipped.append(f"{source}: line {n}: unknown record kind {kind!r}")
    if not runs:
        raise TracekitError(
            f"{source}: no record=run line; this is not the output of reproducer/build/vmm"
        )
    vm_table = pl.DataFrame(vms, schema=VM_SCHEMA, orient="row")
    return VmmOutput(runs, vm_table, summaries, skipped, syncs)


def read_vmm_output(path: Path) -> VmmOutput:
    """Read a file holding the VMM's stdout (a bundle run's vmm.txt)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise TracekitError(f"VMM output: {path}: {err}") from None
    return parse_vmm_output(text, str(path))


def vmm_runs(data: BundleData) -> list[tuple[RunRecord, VmmOutput]]:
    """A bundle's runs that ran the VMM (their directory holds vmm.txt), in run order."""
    found = []
    for run in data.manifest.runs:
        vmm = data.run(run).vmm
        if vmm is not None:
            found.append((run, vmm))
    return found
