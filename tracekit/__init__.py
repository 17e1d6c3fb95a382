"""tracekit: explain KVM/arm64 TLB-invalidation effects from ftrace/perf recordings.

Importing this package must stay cheap and must not import polars: the host side
(`tracekit.host`) runs on boards that only have the standard library, click and
pyelftools.
"""

__version__ = "0.1.0"
