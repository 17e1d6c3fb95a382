"""Ingest: recorded traces (trace.dat, raw captures, text) -> polars tables.

`open_path(path)` opens a recording or a whole bundle as a `Trace`; `open_trace` one
recording, its format detected from the content.
This package imports polars and numpy; the host side must not import it.
"""

from tracekit.ingest.opening import open_path, open_trace
from tracekit.ingest.trace import Trace

__all__ = ["Trace", "open_path", "open_trace"]
