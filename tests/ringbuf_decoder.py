"""A small ring-buffer page decoder for the tests, independent of tracekit's ingest.

Written from the layout that events/header_page describes and the ring buffer's event
header (5-bit type_len, 27-bit time delta), so that tests can check a raw capture
without trusting the code that will read it in production.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path


def _header_layout(header_page: str) -> dict[str, tuple[int, int]]:
    """Offsets and sizes of the page header fields, read from a header_page file."""
    fields = re.findall(r"field: [\w ]+? (\w+);\s*offset:(\d+);\s*size:(\d+);", header_page)
    return {name: (int(offset), int(size)) for name, offset, size in fields}


def _decode_pages(data: bytes, page_size: int, header_page: str) -> Iterator[tuple[int, bytes]]:
    """Yield (page timestamp, event payload) from concatenated ring-buffer pages.

    Written from the ring buffer's documented layout: a page header (timestamp, commit),
    then events with a 32-bit header (5-bit type_len, 27-bit time delta). type_len 1-28:
    payload of type_len*4 bytes; 0: length in the next word; 29 padding; 30/31 time
    extend/stamp (8 bytes). Asserts that the events end exactly at the commit size.
    """
    layout = _header_layout(header_page)
    ts_offset, _ = layout["timestamp"]
    commit_offset, commit_size = layout["commit"]
    data_offset, data_size = layout["data"]
    assert data_offset + data_size == page_size
    assert len(data) % page_size == 0
    for start in range(0, len(data), page_size):
        page = data[start : start + page_size]
        (timestamp,) = struct.unpack_from("<Q", page, ts_offset)
        raw_commit = int.from_bytes(page[commit_offset : commit_offset + commit_size], "little")
        commit = raw_commit & ((1 << 30) - 1)  # bits 30/31 flag missed events
        assert 0 < commit <= data_size
        body = page[data_offset : data_offset + commit]
        offset = 0
        while offset < commit:
            (header,) = struct.unpack_from("<I", body, offset)
            type_len, delta = header & 0x1F, header >> 5
            if type_len == 0:
                (length,) = struct.unpack_from("<I", body, offset + 4)
                yield timestamp, body[offset + 8 : offset + 4 + length]
                offset += 4 + length
            elif type_len <= 28:
                yield timestamp, body[offset + 4 : offset + 4 + type_len * 4]
                offset += 4 + type_len * 4
            elif type_len == 29:
                if delta == 0:
                    break
                (length,) = struct.unpack_from("<I", body, offset + 4)
                offset += 4 + length
            else:
                offset += 8
        else:
            assert offset == commit


def _event_ids(capture: Path) -> dict[int, str]:
    """Event id -> "system/event", from the format files in the capture."""
    ids = {}
    for fmt in capture.glob("events/*/*/format"):
        match = re.search(r"^ID: (\d+)", fmt.read_text(), re.MULTILINE)
        if match:
            ids[int(match[1])] = f"{fmt.parent.parent.name}/{fmt.parent.name}"
    return ids


def decoded_events(capture: Path) -> dict[int, list[tuple[int, str, bytes]]]:
    """Per CPU: (page timestamp, event name, payload) of everything in the capture."""
    manifest = json.loads((capture / "capture.json").read_text())
    header_page = (capture / "header_page").read_text()
    ids = _event_ids(capture)
    decoded: dict[int, list[tuple[int, str, bytes]]] = {}
    for cpu in manifest["cpus"]:
        raw = capture / "per_cpu" / f"cpu{cpu}" / "trace_pipe_raw"
        data = raw.read_bytes() if raw.exists() else b""
        decoded[cpu] = [
            (ts, ids.get(struct.unpack_from("<H", payload)[0], "?"), payload)
            for ts, payload in _decode_pages(data, manifest["page_size"], header_page)
        ]
    return decoded
