"""tracekit: explain KVM/arm64 TLB-invalidation effects from ftrace/perf recordings.

Importing this package must stay cheap and must not import polars: the host side
(`tracekit.host`) runs on boards that only have the standard library, click and
pyelftools.
"""

from __future__ import annotations

from os import PathLike
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracekit.ingest.trace import Trace

__version__ = "0.1.0"
# The package's own API: open() returns a tracekit.ingest.Trace (imported on first call).
__all__ = ["__version__", "open"]


def open(
    path: str | PathLike[str],
    *,
    salvage: bool = False,
    use_cache: bool = True,
    symbols: str | PathLike[str] | None = None,
) -> Trace:
    """Open a trace (trace.dat, raw capture directory, text), a bundle, or a directory of
    bundles (a campaign's, as `tracekit report DIR` takes it) as a tracekit Trace.

    `symbols` (a kallsyms copy or vmlinux) names address fields; by default the trace's
    own kallsyms copy does. Imports the ingest package (and so polars) only when called.
    """
    from tracekit.ingest import open_path

    return open_path(path, salvage=salvage, use_cache=use_cache, symbols=symbols)
