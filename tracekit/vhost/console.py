"""The emulated host's serial console: logged whole, streamed only between markers.

/init prints `@@tracekit-vhost:begin:TOKEN@@` before the command and
`@@tracekit-vhost:end:TOKEN:STATUS@@` after it; the token is fresh per run so the
command's own output cannot fake them. Lines in between go to the user, the rest
(boot and shutdown noise) only to the console log.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import BinaryIO


class ConsoleStream:
    """Feeds raw console bytes to a log and the command's lines to `emit`."""

    def __init__(self, token: str, emit: Callable[[str], None], log: BinaryIO) -> None:
        self._begin = f"@@tracekit-vhost:begin:{token}@@"
        self._end = re.compile(rf"@@tracekit-vhost:end:{re.escape(token)}:(\d+)@@")
        self._emit = emit
        self._log = log
        self._pending = b""
        self.started = False
        self.started_at: float | None = None  # time.monotonic() when the command began
        self.status: int | None = None
        self.tail: list[str] = []

    def feed(self, data: bytes) -> None:
        """Take the next chunk of console output (any size, split anywhere)."""
        self._log.write(data)
        self._log.flush()  # the log is live: users (and tests) tail it during the run
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for raw in lines:
            self._line(raw.decode(errors="replace").rstrip("\r"))

    def finish(self) -> None:
        """Handle a last line that had no newline when the console closed."""
        if self._pending:
            self._line(self._pending.decode(errors="replace").rstrip("\r"))
            self._pending = b""
        self._log.flush()

    def _line(self, line: str) -> None:
        """Route one console line by where the run is."""
        self.tail = [*self.tail[-19:], line]
        if self.status is not None:
            return
        if not self.started:
            self.started = line.endswith(self._begin)
            if self.started:
                self.started_at = time.monotonic()
            return
        end = self._end.search(line)
        if end is None:
            self._emit(line)
            return
        self.status = int(end.group(1))
        before = line[: end.start()]
        if before:  # the command's last line had no newline of its own
            self._emit(before)
