"""Perfetto's own importer (trace_processor_shell) for the tests: found, run, queried by SQL.

The shell is looked for in $TRACEKIT_TRACE_PROCESSOR, then ../shared/tools next to the
repository, then ~/.cache/tracekit/tools (or $TRACEKIT_CACHE/tools). Tests that need it
skip with one line saying how to get it when none is found.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHELL = "trace_processor_shell"
HOW_TO_GET = (
    f"no {SHELL} found: set TRACEKIT_TRACE_PROCESSOR to one (Perfetto v58+, needs Debian's "
    f"libprotobuf32), or put it in ../shared/tools/ or ~/.cache/tracekit/tools/"
)


def candidates() -> list[Path]:
    """Where the shell may be, in order of preference."""
    found = []
    if os.environ.get("TRACEKIT_TRACE_PROCESSOR"):
        found.append(Path(os.environ["TRACEKIT_TRACE_PROCESSOR"]))
    found.append(REPO.parent / "shared" / "tools" / SHELL)
    cache_root = os.environ.get("TRACEKIT_CACHE") or str(Path.home() / ".cache" / "tracekit")
    found.append(Path(cache_root) / "tools" / SHELL)
    return found


@cache
def find_shell() -> Path | None:
    """The first candidate that runs (`--version` exits 0), or None."""
    for path in candidates():
        if path.is_file() and os.access(path, os.X_OK) and shell_version(path) is not None:
            return path
    return None


@cache
def shell_version(path: Path) -> str | None:
    """`Perfetto v58.2 (...)`: the shell's first --version line, or None if it fails."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except OSError:
        return None  # e.g. a missing libprotobuf32
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def require_shell() -> Path:
    """The shell, or skip the test with one line saying how to get it."""
    path = find_shell()
    if path is None:
        pytest.skip(HOW_TO_GET)
    return path


class Imported:
    """One .pftrace as trace_processor imports it; `query` runs SQL on it."""

    def __init__(self, shell: Path, trace: Path) -> None:
        self.shell = shell
        self.trace = trace
        self.version = shell_version(shell) or "unknown version"

    def query(self, sql: str) -> list[dict[str, str]]:
        """Rows of one SQL statement as dicts of strings ("[NULL]" for NULL)."""
        done = subprocess.run(
            [self.shell, "-q", "/dev/stdin", str(self.trace)],
            input=sql,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise AssertionError(f"{self.version}: {sql!r} failed: {done.stderr[-2000:]}")
        return list(csv.DictReader(io.StringIO(done.stdout.strip())))

    def column(self, sql: str) -> dict[str, int]:
        """A two-column query (key, count) as a dict."""
        rows = self.query(sql)
        return {next(iter(r.values())): int(list(r.values())[1]) for r in rows}

    def scalar(self, sql: str) -> int:
        """A one-value query as an int."""
        rows = self.query(sql)
        return int(next(iter(rows[0].values())))

    def problems(self) -> dict[str, int]:
        """Every non-zero stat of severity error or data_loss: name[idx] -> value."""
        rows = self.query(
            "select name, idx, value from stats where value != 0 "
            "and severity in ('error', 'data_loss') order by name, idx"
        )
        return {
            r["name"] + ("" if r["idx"] == "[NULL]" else f"[{r['idx']}]"): int(r["value"])
            for r in rows
        }
