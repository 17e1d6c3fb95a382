"""`--trace-processor PATH`: a real import by the user's own trace_processor, and its stats.

trace_processor cannot be fetched on the development machine, so this path is untested
there and kept small: the perfetto package's Python API starts the given binary (never
a downloaded one), loads the file, and returns the non-zero rows of its `stats` table,
where import problems (data losses, errors) are counted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError

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
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    config = TraceProcessorConfig(bin_path=str(binary))
    try:
        with TraceProcessor(trace=str(trace), config=config) as tp:
            rows = tp.query(_STATS_QUERY)
            return [ImportStat(r.name, r.idx, r.severity, r.source, int(r.value)) for r in rows]
    except TracekitError:
        raise
    except Exception as err:  # the API raises its own types for a failed start or load
        raise TracekitError(f"{binary}: trace_processor failed on {trace}: {err}") from None
