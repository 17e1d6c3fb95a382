"""`--trace-processor PATH`: a real import by the user's own trace_processor, and its stats.

The given trace_processor_shell (never a downloaded one) loads the file with `-q` and
prints the non-zero rows of its `stats` table as CSV: import problems (data losses,
errors) are counted there. The shell is run directly rather than through the perfetto
package's RPC client, so nothing listens on a port and the output is plain CSV.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError

# The importer's error for a sched_switch whose prev_pid is not the CPU's running task.
SWITCH_MISMATCH = "mismatched_sched_switch_tids"
_STATS_QUERY = (
    "select name, idx, severity, source, value from stats where value != 0 order by severity, name"
)


@dataclass
class ImportStat:
    """One non-zero trace_processor stat: name[idx], severity (info/data_loss/error)."""

    name: str
    idx: int | None
    severity: str
    source: str
    value: int

    def __str__(self) -> str:
        where = f"[{self.idx}]" if self.idx is not None else ""
        return f"{self.severity}: {self.name}{where} = {self.value} ({self.source})"


def import_stats(binary: str | os.PathLike[str], trace: str | os.PathLike[str]) -> list[ImportStat]:
    """Load TRACE with the trace_processor at BINARY; return its non-zero stats."""
    if not Path(binary).is_file() or not os.access(binary, os.X_OK):
        raise TracekitError(
            f"{binary}: not an executable trace_processor; give the path of "
            "trace_processor_shell (see https://perfetto.dev/docs/analysis/trace-processor)"
        )
    try:
        done = subprocess.run(
            [str(binary), "-q", "/dev/stdin", str(trace)],
            input=_STATS_QUERY,
            capture_output=True,
            text=True,
        )
    except OSError as err:
        raise TracekitError(f"{binary}: cannot run it ({err.strerror})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise TracekitError(f"{binary}: trace_processor failed on {trace}: {last}")
    rows = csv.DictReader(io.StringIO(done.stdout.strip()))
    return [
        ImportStat(r["name"], None if r["idx"] == "[NULL]" else int(r["idx"]), r["severity"],
                   r["source"], int(r["value"]))
        for r in rows
    ]  # fmt: skip


def version(binary: str | os.PathLike[str]) -> str:
    """The shell's `--version` first line (e.g. `Perfetto v58.2 (...)`)."""
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    return (done.stdout.strip().splitlines() or ["unknown version"])[0]
