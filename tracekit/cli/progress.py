"""Progress bars for long commands: click's bar on stderr, only when stderr is a terminal.

Piped or redirected output (a script, CI, `2> log`) gets no bar, so nothing but results
and errors reaches a file.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from tracekit.progress import Steps


@contextmanager
def progress_bar(label: str) -> Iterator[Steps | None]:
    """A Steps callback drawing a bar labelled `label`, or None when stderr is no tty."""
    if not sys.stderr.isatty():
        yield None
        return
    bar: Any = None
    shown = 0

    def step(done: int, total: int, item: str) -> None:
        nonlocal bar, shown
        if bar is None:
            bar = click.progressbar(
                length=total, label=label, file=sys.stderr, item_show_func=lambda i: i
            )
            bar.__enter__()
        bar.update(done - shown, item)
        shown = done

    try:
        yield step
    finally:
        if bar is not None:
            bar.update(bar.length - shown, "")
            bar.__exit__(None, None, None)
