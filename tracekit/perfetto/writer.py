"""Streaming writer of Perfetto traces: one TracePacket at a time, never the whole Trace.

A Perfetto trace file is the serialised `Trace` message, which is nothing but its
repeated field 1 (`packet`). Writing each packet as that field (tag, length, bytes) as
soon as it is built keeps memory bounded by the largest packet, whatever the trace size.

Several recordings of one boot (a bundle's traced runs) are written as a plain TAR of
Perfetto traces, which trace_processor and the UI merge into one timeline on one machine
(docs/analysis/merging-traces.md in Perfetto's source: files of one boot share BOOTTIME).
Each member is a trace of its own to the importer: its per-CPU sched state starts
afresh, so the untraced gap between two runs is not read as one long sched slice.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, BinaryIO

from tracekit.errors import TracekitError
from tracekit.perfetto.protos import TracePacket

# Field 1 of `Trace`, wire type 2 (length-delimited): (1 << 3) | 2.
_PACKET_TAG = b"\x0a"

# Packet sequences: Perfetto keeps interned data and incremental state per sequence.
FTRACE_SEQUENCE = 1
TRACKS_SEQUENCE = 2

# A tar block; a member's header is one (names are kept under 100 bytes).
_BLOCK = 512

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
    With ARCHIVE, OUT is a TAR whose members (begin_member .. end_member, append_file)
    hold the packets; each member's header is written once its size is known.
    """

    def __init__(self, path: str | os.PathLike[str], archive: bool = False) -> None:
        self.path = Path(path)
        self.archive = archive
        self._tmp = self.path.with_name(f".{self.path.name}.partial")
        self._file: BinaryIO | None = None
        self._member: tuple[str, int] | None = None  # its name and header's offset
        self.packets = 0
        self.bytes = 0
        self.members: list[str] = []

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
        assert self._member is not None or not self.archive, "a packet outside any member"
        head = _PACKET_TAG + encode_varint(len(payload))
        self._file.write(head)
        self._file.write(payload)
        self.packets += 1
        self.bytes += len(head) + len(payload)

    def begin_member(self, name: str) -> None:
        """Start the archive member NAME (ending the open one): its header comes later."""
        assert self._file is not None and self.archive
        self.end_member()
        self._member = (name, self._file.tell())
        self._file.write(bytes(_BLOCK))

    def end_member(self) -> None:
        """Close the open member, if any: pad it to a block, then write its header."""
        assert self._file is not None
        if self._member is None:
            return
        name, at = self._member
        end = self._file.tell()
        self._file.write(bytes(-(end - at) % _BLOCK))
        done = self._file.tell()
        self._file.seek(at)
        self._file.write(_header(name, end - at - _BLOCK))
        self._file.seek(done)
        self.members.append(name)
        self._member = None

    def append_file(self, name: str, path: Path, packets: int) -> None:
        """Copy a finished trace file (of PACKETS packets) in as the member NAME."""
        assert self._file is not None
        self.begin_member(name)
        with open(path, "rb") as source:
            shutil.copyfileobj(source, self._file, 1 << 20)
        self.bytes += path.stat().st_size
        self.packets += packets
        self.end_member()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._file is not None
        if kind is None and self.archive:
            self.end_member()
            self._file.write(bytes(2 * _BLOCK))  # the end-of-archive mark
        self._file.close()
        if kind is None:
            os.replace(self._tmp, self.path)
        else:
            self._tmp.unlink(missing_ok=True)


def _header(name: str, size: int) -> bytes:
    """A member's tar header block (a regular file, read-write for its owner)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    block = info.tobuf(format=tarfile.GNU_FORMAT)
    assert len(block) == _BLOCK, name  # a name under 100 bytes needs one block
    return block


def is_archive(path: str | os.PathLike[str]) -> bool:
    """Whether a file is a TAR (of several traces) rather than one Perfetto trace."""
    try:
        with open(path, "rb") as f:
            head = f.read(_BLOCK)
    except OSError:
        return False
    return len(head) == _BLOCK and head[257:262] == b"ustar"


def read_members(path: str | os.PathLike[str]) -> Iterator[tuple[str, Iterator[bytes]]]:
    """Each trace of a file as (its member name, its packets): one for a plain trace."""
    if not is_archive(path):
        yield "", read_packets(path)
        return
    try:
        archive = tarfile.open(path, "r:")  # noqa: SIM115 - closed by the with below
    except (OSError, tarfile.TarError) as err:
        raise TracekitError(f"cannot read {path} as a TAR of traces: {err}") from None
    with archive:
        for member in archive:
            source = archive.extractfile(member) if member.isfile() else None
            if source is not None:
                yield member.name, _packets(source, f"{path}:{member.name}")


def read_packets(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """Yield each serialised packet of a Perfetto trace file, reading it in a stream (a
    TAR's members one after another)."""
    if is_archive(path):
        for _, packets in read_members(path):
            yield from packets
        return
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as err:
        raise TracekitError(f"cannot read {path}: {err.strerror}") from None
    with f:
        yield from _packets(f, path)


def _packets(f: IO[bytes], path: str | os.PathLike[str]) -> Iterator[bytes]:
    """The packets of one trace from an open file."""
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


def _read_varint(f: IO[bytes], path: str | os.PathLike[str]) -> int:
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
