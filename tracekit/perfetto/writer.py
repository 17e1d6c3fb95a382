"""Streaming writer of Perfetto traces: one TracePacket at a time, never the whole Trace.

A Perfetto trace file is the serialised `Trace` message, which is nothing but its
repeated field 1 (`packet`). Writing each packet as that field (tag, length, bytes) as
soon as it is built keeps memory bounded by the largest packet, whatever the trace size.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from tracekit.errors import TracekitError
from tracekit.perfetto.protos import TracePacket

# Field 1 of `Trace`, wire type 2 (length-delimited): (1 << 3) | 2.
_PACKET_TAG = b"\x0a"

# Packet sequences: Perfetto keeps interned data and incremental state per sequence.
FTRACE_SEQUENCE = 1
TRACKS_SEQUENCE = 2

# Sequence flags (TracePacket.SequenceFlags).
SEQ_INCREMENTAL_STATE_CLEARED = 1
SEQ_NEEDS_INCREMENTAL_STATE = 2


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class PacketWriter:
    """Writes packets to OUT via a temporary file, renamed into place on success.

    An interrupted export therefore never leaves a truncated .pftrace that looks whole.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.partial")
        self._file: BinaryIO | None = None
        self.packets = 0
        self.bytes = 0

    def __enter__(self) -> PacketWriter:
        try:
            self._file = open(self._tmp, "wb")
        except OSError as err:
            raise TracekitError(
                f"{self.path}: cannot write the Perfetto trace ({err.strerror}); "
                "choose a writable output path with -o"
            ) from None
        return self

    def write(self, packet: TracePacket) -> None:
        """Append one packet."""
        self.write_raw(packet.SerializeToString())

    def write_raw(self, payload: bytes) -> None:
        """Append one already serialised packet."""
        assert self._file is not None, "PacketWriter used outside its with-block"
        head = _PACKET_TAG + encode_varint(len(payload))
        self._file.write(head)
        self._file.write(payload)
        self.packets += 1
        self.bytes += len(head) + len(payload)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._file is not None
        self._file.close()
        if kind is None:
            os.replace(self._tmp, self.path)
        else:
            self._tmp.unlink(missing_ok=True)


def read_packets(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """Yield each serialised packet of a Perfetto trace file, reading it in a stream."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as err:
        raise TracekitError(f"cannot read {path}: {err.strerror}") from None
    with f:
        while True:
            tag = f.read(1)
            if not tag:
                return
            if tag != _PACKET_TAG:
                raise TracekitError(
                    f"{path}: byte {f.tell() - 1} is not a Trace packet field "
                    f"(0x{tag[0]:02x}); is this a Perfetto protobuf trace?"
                )
            size = _read_varint(f, path)
            payload = f.read(size)
            if len(payload) != size:
                raise TracekitError(
                    f"{path}: the last packet is cut short ({len(payload)} of {size} "
                    "bytes); the file is truncated, export it again"
                )
            yield payload


def _read_varint(f: BinaryIO, path: str | os.PathLike[str]) -> int:
    """Read one varint from a file, or fail with a clear error."""
    value = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            raise TracekitError(f"{path}: the file ends inside a packet length; it is truncated")
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise TracekitError(f"{path}: a packet length is not a valid varint")
