"""Ingest: recorded traces (trace.dat, raw captures, text) -> polars tables.

`open_trace(path)` detects the format from the content and returns a `Trace`.
This package imports polars and numpy; the host side must not import it.
"""

from tracekit.ingest.trace import Trace, open_trace

__all__ = ["Trace", "open_trace"]
