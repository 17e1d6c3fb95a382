"""A ring-buffer page encoder for the tests, following the kernel's layout.

Header word: type_len in the low 5 bits, time delta in the high 27; type_len 0 puts the
length in the next word; 29 padding, 30 time extend, 31 absolute stamp. Pages built with
it hold every record kind and the missed-events flags, including the rare ones real
fixtures may not have.
"""

from __future__ import annotations

import struct

from tracekit.ingest import ringbuf
from tracekit.ingest.formats import HeaderEvent, HeaderPage

HP, HE = HeaderPage(), HeaderEvent()
PAGE = HP.page_size


class PageWriter:
    """Builds one 4 KB page: records appended in order, header written by page()."""

    def __init__(self, ts: int) -> None:
        self.ts = ts
        self.body = b""

    def _word(self, type_len: int, delta: int) -> bytes:
        return struct.pack("<I", (delta << 5) | type_len)

    def event(self, delta: int, payload: bytes, big: bool = False) -> None:
        """A data record; small ones use type_len = words, big ones type_len 0."""
        payload += b"\0" * (-len(payload) % 4)
        if big or len(payload) > 28 * 4:
            self.body += self._word(0, delta) + struct.pack("<I", len(payload) + 4) + payload
        else:
            self.body += self._word(len(payload) // 4, delta) + payload

    def extend(self, delta: int) -> None:
        """A time extend carrying a delta too large for 27 bits."""
        self.body += self._word(30, delta & ((1 << 27) - 1)) + struct.pack("<I", delta >> 27)

    def stamp(self, ts: int) -> None:
        """An absolute time stamp (59 bits)."""
        self.body += self._word(31, ts & ((1 << 27) - 1)) + struct.pack("<I", ts >> 27)

    def padding(self, delta: int, skip: int) -> None:
        """A discarded event: padding whose length word says how many bytes follow."""
        self.body += self._word(29, delta) + struct.pack("<I", skip) + b"\xee" * (skip - 4)

    def page(self, missed: int | None = None, stored: bool = False) -> bytes:
        """The finished page, with the missed-events flags (and count) if asked."""
        commit = len(self.body)
        body = self.body
        if missed is not None:
            commit |= ringbuf.MISSED_EVENTS
            if stored:
                commit |= ringbuf.MISSED_STORED
                body += struct.pack("<Q", missed)
        return (struct.pack("<QQ", self.ts, commit) + body).ljust(PAGE, b"\0")


def payload(tag: int, size: int = 8) -> bytes:
    """An event payload whose first two bytes (common_type) are the tag."""
    return struct.pack("<H", tag).ljust(size, b"\x01")
