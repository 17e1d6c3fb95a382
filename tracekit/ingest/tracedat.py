"""trace-cmd's trace.dat, versions 6 and 7, read natively into a BinaryTrace.

v6: a fixed sequence (header_page, header_event, ftrace formats, event formats, kallsyms,
printk formats, saved cmdlines, CPU count, options, flyrecord CPU offsets).
v7: an options section whose options point at sections (each with a 16-byte header,
optionally compressed with zstd or zlib); BUFFER options give each instance's per-CPU
data, which is stored in compressed chunks when the file is compressed.
Layout as documented in trace-cmd's trace-cmd.dat.v6(5) and .v7(5) pages.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tracekit.errors import TracekitError
from tracekit.ingest import membuf
from tracekit.ingest.formats import FormatSet, parse_header_event, parse_header_page
from tracekit.ingest.tables import BinaryTrace, CpuData, parse_cmdlines, parse_printk, parse_stats
from tracekit.ingest.threads import map_threads

MAGIC = b"\x17\x08\x44tracing"
OPT_DONE, OPT_DATE, OPT_CPUSTAT, OPT_BUFFER, OPT_TRACECLOCK, OPT_UNAME = 0, 1, 2, 3, 4, 5
OPT_OFFSET, OPT_CPUCOUNT, OPT_VERSION, OPT_TSC2NSEC = 7, 8, 9, 14
OPT_HEADERS, OPT_FTRACE, OPT_EVENTS, OPT_KALLSYMS, OPT_PRINTK, OPT_CMDLINES = range(16, 22)
OPT_BUFFER_TEXT = 22


class Truncated(Exception):
    """A read went past the end of the file or of a section."""


def _offset_option(text: str, at: int) -> int:
    """The OFFSET option's timestamp offset (an integer in C syntax; none when empty)."""
    try:
        return int(text or "0", 0)
    except ValueError:
        raise Truncated(
            f"the time offset option at offset {at} is not a number: {text!r}"
        ) from None


class Cursor:
    """Reads integers and strings from a byte buffer, remembering the file offset."""

    def __init__(self, data: bytes | memoryview, endian: str, base: int = 0) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.endian = endian
        self.base = base  # file offset of data[0], for error messages

    @property
    def offset(self) -> int:
        """Current position as a file offset."""
        return self.base + self.pos

    def take(self, n: int) -> memoryview:
        """The next n bytes."""
        if n < 0 or self.pos + n > len(self.data):
            raise Truncated(f"need {n} bytes at offset {self.offset}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def uint(self, size: int) -> int:
        """An unsigned integer of 2, 4 or 8 bytes."""
        code = {2: "H", 4: "I", 8: "Q"}[size]
        return struct.unpack(self.endian + code, self.take(size))[0]

    def cstr(self) -> str:
        """A NUL-terminated string."""
        rest = self.data[self.pos :]
        end = bytes(rest).find(b"\0") if len(rest) < 4096 else _find_nul(rest)
        if end < 0:
            raise Truncated(f"unterminated string at offset {self.offset}")
        text = bytes(rest[:end]).decode("utf-8", "replace")
        self.pos += end + 1
        return text

    def text(self, size: int) -> str:
        """size bytes of text (trailing NULs removed)."""
        return bytes(self.take(size)).rstrip(b"\0").decode("utf-8", "replace")


def _find_nul(view: memoryview) -> int:
    """Position of the first NUL in a large view, scanning in blocks."""
    for start in range(0, len(view), 4096):
        i = bytes(view[start : start + 4096]).find(b"\0")
        if i >= 0:
            return start + i
    return -1


@dataclass
class _Buffer:
    """One instance's flyrecord data as the options describe it."""

    name: str
    clock: str = ""
    page_size: int = 0
    cpus: list[tuple[int, int, int]] = field(default_factory=list)  # (cpu, offset, size)
    stats: dict[int, dict[str, str]] = field(default_factory=dict)


class TraceDat:
    """A parsed trace.dat: metadata from the header/sections, per-instance CPU data."""

    def __init__(self, path: Path, data: bytes | mmap.mmap) -> None:
        self.path = path
        self.raw = memoryview(data)
        self.whole = np.frombuffer(self.raw, dtype=np.uint8)
        self.version = 0
        self.endian = "<"
        self.long_size = 8
        self.page_size = 4096
        self.compression = "none"
        self.formats = FormatSet()
        self.kallsyms = ""
        self.printk: dict[int, str] = {}
        self.cmdlines: dict[int, str] = {}
        self.buffers: list[_Buffer] = [_Buffer("")]
        self.meta: dict[str, object] = {}
        self.ts_offset = 0
        self.n_cpus = 0
        self._zstd: object | None = None  # one decompression context for every chunk

    @property
    def reader(self) -> str:
        """Name used in messages, e.g. 'trace.dat v7 (zstd)'."""
        comp = "" if self.compression == "none" else f" ({self.compression})"
        return f"trace.dat v{self.version}{comp}"

    # -- initial format ------------------------------------------------------------
    def parse(self) -> None:
        """Read everything but the ring-buffer pages."""
        if bytes(self.raw[:10]) != MAGIC:
            raise TracekitError(f"{self.path}: not a trace.dat file (no tracing magic)")
        cur = Cursor(self.raw, "<")
        cur.take(10)
        self.version = int(cur.cstr() or 0)
        if self.version not in (6, 7):
            raise TracekitError(
                f"{self.path}: trace.dat version {self.version} is not supported (6 and 7 "
                "are); convert it with `trace-cmd convert --file-version 7`"
            )
        endian_flag, self.long_size = bytes(cur.take(2))
        self.endian = cur.endian = ">" if endian_flag == 1 else "<"
        self.page_size = cur.uint(4)
        if self.version == 6:
            self._parse_v6(cur)
        else:
            self._parse_v7(cur)

    # -- version 6 -------------------------------------------------------------------
    def _parse_v6(self, cur: Cursor) -> None:
        """The fixed v6 sequence, then options and the flyrecord CPU table."""
        self._headers(cur)
        self._ftrace_formats(cur)
        self._event_formats(cur)
        self.kallsyms = cur.text(cur.uint(4))
        self.printk = parse_printk(cur.text(cur.uint(4)))
        self.cmdlines = parse_cmdlines(cur.text(cur.uint(8)))
        self.n_cpus = cur.uint(4)
        tag = bytes(cur.take(10))
        if tag == b"options  \0":
            while (opt := cur.uint(2)) != OPT_DONE:
                size = cur.uint(4)  # the body's file offset is where it starts, as in v7
                self._option(opt, Cursor(cur.take(size), self.endian, cur.offset - size))
            tag = bytes(cur.take(10))
        if tag == b"latency  \0":
            raise TracekitError(
                f"{self.path}: a latency-tracer trace.dat (text inside); run `trace-cmd "
                "report` on it and ingest that text instead"
            )
        if tag != b"flyrecord\0":
            raise Truncated(f"expected 'flyrecord' at offset {cur.offset - 10}")
        top = self.buffers[0]
        top.cpus = [(i, cur.uint(8), cur.uint(8)) for i in range(self.n_cpus)]
        for buf in self.buffers[1:]:
            at = Cursor(self.raw, self.endian)
            at.pos = buf.cpus[0][1] if buf.cpus else 0
            if bytes(at.data[at.pos : at.pos + 10]) == b"flyrecord\0":
                at.pos += 10  # each instance's CPU table repeats the tag
            buf.cpus = [(i, at.uint(8), at.uint(8)) for i in range(self.n_cpus)]

    def _headers(self, cur: Cursor) -> None:
        """header_page and header_event blocks."""
        if cur.cstr() != "header_page":
            raise Truncated(f"expected 'header_page' before offset {cur.offset}")
        hp = cur.text(cur.uint(8))
        if cur.cstr() != "header_event":
            raise Truncated(f"expected 'header_event' before offset {cur.offset}")
        he = cur.text(cur.uint(8))
        try:
            self.formats.header_page = parse_header_page(hp)
        except ValueError as err:
            raise Truncated(f"bad header_page before offset {cur.offset}: {err}") from None
        self.formats.header_event = parse_header_event(he)

    def _ftrace_formats(self, cur: Cursor) -> None:
        """The ftrace/* event formats."""
        for _ in range(cur.uint(4)):
            where = f"{self.path} at offset {cur.offset}"
            self.formats.add_text(cur.text(cur.uint(8)), "ftrace", where, self.long_size)

    def _event_formats(self, cur: Cursor) -> None:
        """All other systems' event formats."""
        for _ in range(cur.uint(4)):
            system = cur.cstr()
            for _ in range(cur.uint(4)):
                where = f"{self.path} at offset {cur.offset}"
                text = cur.text(cur.uint(8))
                self.formats.add_text(text, system, where, self.long_size)

    # -- version 7 -------------------------------------------------------------------
    def _parse_v7(self, cur: Cursor) -> None:
        """Compression header, then the chain of options sections."""
        self.compression = cur.cstr()
        self.meta["compression_version"] = cur.cstr()
        if self.compression not in ("none", "zstd", "zlib"):
            raise TracekitError(
                f"{self.path}: trace.dat compressed with {self.compression!r}, which tracekit "
                "cannot read (zstd and zlib are supported); convert it with `trace-cmd "
                "convert --compression zstd`"
            )
        nxt = cur.uint(8)
        seen: set[int] = set()
        while nxt and nxt not in seen:
            seen.add(nxt)
            nxt = self._options_section(nxt)

    def _section(self, offset: int, want: int | None = None) -> Cursor:
        """A section's (decompressed) body as a Cursor."""
        head = Cursor(self.raw, self.endian)
        head.pos = offset
        sec_id, flags, _desc, size = head.uint(2), head.uint(2), head.uint(4), head.uint(8)
        if want is not None and sec_id != want:
            raise Truncated(f"section at offset {offset} has id {sec_id}, expected {want}")
        body_at = head.pos
        body = head.take(size)
        if flags & 1:
            return Cursor(self._decompress_block(Cursor(body, self.endian, body_at)), self.endian)
        return Cursor(body, self.endian, body_at)

    def _decompress_block(self, cur: Cursor) -> bytes:
        """One compressed block: u32 compressed size, u32 uncompressed size, data."""
        csize, usize = cur.uint(4), cur.uint(4)
        at = cur.offset
        out = self._decompress(cur.take(csize), at)
        if len(out) != usize:
            raise Truncated(f"block at offset {at} gave {len(out)} bytes, header says {usize}")
        return out

    def _decompress(self, data: bytes | memoryview, at: int) -> bytes:
        """Decompress with the file's algorithm, naming the offset on failure."""
        try:
            if self.compression == "zlib":
                return zlib.decompress(data)
            if self._zstd is None:
                import zstandard

                self._zstd = zstandard.ZstdDecompressor()
            return self._zstd.decompressobj().decompress(data)  # type: ignore[attr-defined]
        except Exception as err:  # the libraries raise their own error types
            raise Truncated(f"{self.compression} data at offset {at} is corrupt: {err}") from None

    def _options_section(self, offset: int) -> int:
        """Read one options section; returns the next options section's offset (0: none)."""
        cur = self._section(offset, want=0)
        while True:
            opt, size = cur.uint(2), cur.uint(4)
            body = Cursor(cur.take(size), self.endian, cur.offset - size)
            if opt == OPT_DONE:
                return body.uint(8)
            self._option(opt, body)

    def _option(self, opt: int, body: Cursor) -> None:
        """Apply one option (both versions)."""
        if opt == OPT_CPUSTAT:
            self._cpustat(body.text(len(body.data)))
        elif opt == OPT_BUFFER:
            self._buffer_option(body)
        elif opt == OPT_TRACECLOCK:
            self.meta["trace_clock_file"] = body.text(len(body.data))
        elif opt == OPT_UNAME:
            self.meta["uname"] = body.text(len(body.data))
        elif opt == OPT_VERSION:
            self.meta["tracecmd_version"] = body.text(len(body.data))
        elif opt == OPT_CPUCOUNT:
            self.n_cpus = body.uint(4)
        elif opt == OPT_OFFSET:
            at = body.offset
            self.ts_offset = _offset_option(body.text(len(body.data)), at)
        elif opt == OPT_DATE:
            self.meta["date_offset"] = body.text(len(body.data))
        elif opt == OPT_TSC2NSEC:
            self.meta["tsc2nsec"] = (body.uint(4), body.uint(4), body.uint(8))
        elif opt == OPT_BUFFER_TEXT:
            self.meta["_latency_text"] = True
        elif OPT_HEADERS <= opt <= OPT_CMDLINES and self.version == 7:
            self._section_option(opt, body.uint(8))
        elif opt > OPT_BUFFER_TEXT:  # 6, 10-13, 15 are known and not needed here
            unknown = self.meta.setdefault("_unknown_options", [])
            unknown.append(f"{opt} ({len(body.data)} bytes)")  # type: ignore[union-attr]

    def _section_option(self, opt: int, offset: int) -> None:
        """v7 options that point at metadata sections."""
        cur = self._section(offset, want=opt)
        if opt == OPT_HEADERS:
            self._headers(cur)
        elif opt == OPT_FTRACE:
            self._ftrace_formats(cur)
        elif opt == OPT_EVENTS:
            self._event_formats(cur)
        elif opt == OPT_KALLSYMS:
            self.kallsyms = cur.text(cur.uint(4))
        elif opt == OPT_PRINTK:
            self.printk = parse_printk(cur.text(cur.uint(4)))
        elif opt == OPT_CMDLINES:
            self.cmdlines = parse_cmdlines(cur.text(cur.uint(8)))

    def _cpustat(self, text: str) -> None:
        """CPUSTAT: one CPU's stats, or a "Buffer: name" line opening an instance's stats."""
        stripped = text.strip()
        if stripped.startswith("Buffer:"):
            name = stripped.split(":", 1)[1].strip()
            self._buffer_named(name)
            self.meta["_stats_target"] = name
            return
        stats = parse_stats(text)
        if "CPU" in stats and stats["CPU"].isdigit():
            target = self._buffer_named(str(self.meta.get("_stats_target", "")))
            target.stats[int(stats["CPU"])] = stats

    def _buffer_named(self, name: str) -> _Buffer:
        """The buffer with this instance name, created on first mention."""
        for buf in self.buffers:
            if buf.name == name:
                return buf
        self.buffers.append(_Buffer(name))
        return self.buffers[-1]

    def _buffer_option(self, body: Cursor) -> None:
        """BUFFER: where an instance's data is (v6: offset of its CPU table)."""
        offset = body.uint(8)
        buf = self._buffer_named(body.cstr())
        if self.version == 6:
            buf.cpus = [(0, offset, 0)]  # resolved after the CPU count is known
            return
        buf.clock = body.cstr()
        rest = len(body.data) - body.pos
        first = struct.unpack(self.endian + "I", body.data[body.pos : body.pos + 4])[0]
        if rest != 4 + 20 * first:
            buf.page_size = body.uint(4)  # newer trace-cmd writes the page size here
        count = body.uint(4)
        buf.cpus = [(body.uint(4), body.uint(8), body.uint(8)) for _ in range(count)]

    # -- CPU data ------------------------------------------------------------------------
    def cpu_data(self, buf: _Buffer, salvage: bool, skipped: list[str]) -> list[CpuData]:
        """The (decompressed) pages of every CPU of one buffer."""
        out: list[CpuData] = []
        if self.compression != "none" and not salvage:
            return self._decompress_cpus(buf)
        for cpu, offset, size in buf.cpus:
            if size == 0:
                continue
            where = f"{self.path} (instance {buf.name or 'top'}, CPU {cpu} data)"
            try:
                data = self._cpu_bytes(offset, size)
            except Truncated as err:
                if not salvage:
                    raise
                skipped.append(f"CPU {cpu} of instance {buf.name or 'top'}: {err}")
                data = self._cpu_bytes_salvaged(offset, size)
            out.append(CpuData(cpu, data, offset if self.compression == "none" else 0, where))
        return out

    def _decompress_cpus(self, buf: _Buffer) -> list[CpuData]:
        """All CPUs' chunks decompressed into one releasable array (see membuf).

        Chunks are small (trace-cmd writes about ten pages each), so each is inflated
        to bytes and copied in place: one chunk of transient memory, no joins. The CPUs
        are inflated in parallel (the libraries release the GIL while they work).
        """
        plan = [(cpu, offset, self._chunk_plan(offset)) for cpu, offset, size in buf.cpus if size]
        sizes = [sum(usize for _, _, usize in chunks) for *_, chunks in plan]
        out = membuf.alloc(sum(sizes), populate=True)  # every byte is written next
        starts = list(itertools.accumulate(sizes, initial=0))[:-1]
        pieces = [out[at : at + n] for at, n in zip(starts, sizes, strict=True)]
        map_threads(lambda i: self._inflate_into(plan[i][2], pieces[i]), range(len(plan)))
        return [
            CpuData(cpu, piece, 0,
                    f"{self.path} (instance {buf.name or 'top'}, CPU {cpu} data at {offset})")
            for (cpu, offset, _), piece in zip(plan, pieces, strict=True)
        ]  # fmt: skip

    def _inflate_into(self, chunks: list[tuple[int, int, int]], out: np.ndarray) -> None:
        """Decompress one CPU's chunks back to back into `out` (with its own context)."""
        view = memoryview(out)
        inflate = self._inflater()
        pos = 0
        for at, csize, usize in chunks:
            try:
                data = inflate(self.raw[at : at + csize], usize)
            except Exception as err:  # the libraries raise their own error types
                raise Truncated(
                    f"{self.compression} data at offset {at} is corrupt: {err}"
                ) from None
            if len(data) != usize:
                raise Truncated(f"block at offset {at} gave {len(data)} bytes, not {usize}")
            view[pos : pos + usize] = data
            pos += usize

    def _chunk_plan(self, offset: int) -> list[tuple[int, int, int]]:
        """(file offset, compressed size, size) of each chunk of one CPU's data."""
        head = struct.Struct(self.endian + "II")
        if offset + 4 > len(self.raw):
            raise Truncated(f"need 4 bytes at offset {offset}")
        (count,) = struct.unpack_from(self.endian + "I", self.raw, offset)
        at = offset + 4
        chunks = []
        for _ in range(count):
            if at + 8 > len(self.raw):
                raise Truncated(f"need 8 bytes at offset {at}")
            csize, usize = head.unpack_from(self.raw, at)
            if at + 8 + csize > len(self.raw):
                raise Truncated(f"need {csize} bytes at offset {at + 8}")
            chunks.append((at + 8, csize, usize))
            at += 8 + csize
        return chunks

    def _inflater(self) -> Callable[[memoryview, int], bytes]:
        """The file's decompression as f(chunk, expected size), with one reused context."""
        if self.compression == "zlib":
            return lambda data, _size: zlib.decompress(data)
        import zstandard

        dctx = zstandard.ZstdDecompressor()
        return lambda data, size: dctx.decompress(data, max_output_size=size)

    def _cpu_bytes(self, offset: int, size: int) -> np.ndarray:
        """One CPU's pages: a zero-copy view, or the decompressed chunks."""
        if self.compression == "none":
            if offset + size > len(self.raw):
                raise Truncated(
                    f"CPU data at offset {offset} needs {size} bytes, file ends at {len(self.raw)}"
                )
            return self.whole[offset : offset + size]  # slices of one array: merged for free
        return np.frombuffer(b"".join(self._chunks(offset, size, [])), dtype=np.uint8)

    def _chunks(self, offset: int, size: int, done: list[bytes]) -> list[bytes]:
        """Decompress a CPU's chunks, appending to `done` as it goes."""
        # The recorded size does not count the chunk-count word, so bound by the file.
        cur = Cursor(self.raw[offset:], self.endian, offset)
        for _ in range(cur.uint(4)):
            done.append(self._decompress_block(cur))
        return done

    def _cpu_bytes_salvaged(self, offset: int, size: int) -> np.ndarray:
        """The whole pages that can be read before the damage."""
        if self.compression == "none":
            if offset >= len(self.raw):  # the file ends before this CPU's data
                return np.zeros(0, dtype=np.uint8)
            avail = max(0, min(size, len(self.raw) - offset))
            avail -= avail % self.page_size
            return np.frombuffer(self.raw, dtype=np.uint8, count=avail, offset=offset)
        done: list[bytes] = []
        with contextlib.suppress(Truncated):
            self._chunks(offset, size, done)
        data = b"".join(done)
        return np.frombuffer(data[: len(data) - len(data) % self.page_size], dtype=np.uint8)


def read_tracedat(path: Path, salvage: bool = False, instance: str | None = None) -> BinaryTrace:
    """Open a trace.dat and return its chosen instance as a BinaryTrace.

    The instance is the one named, else the only one with data (top first).
    """
    with open(path, "rb") as f:
        try:
            data: bytes | mmap.mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty file
            data = b""
    dat = TraceDat(path, data)
    try:
        dat.parse()
    except (Truncated, struct.error, KeyError, IndexError) as err:
        raise TracekitError(
            f"trace.dat reader: {path}: {err}; the file is truncated or corrupt"
        ) from None
    if dat.meta.get("_latency_text") and not any(size for b in dat.buffers for *_, size in b.cpus):
        raise TracekitError(
            f"{path}: a latency-tracer trace.dat (text inside, no ring-buffer pages); run "
            "`trace-cmd report` on it and ingest that text instead"
        )
    buf = _choose_buffer(dat, instance)
    skipped: list[str] = []
    if dat.meta.get("_unknown_options"):
        ids = ", ".join(dat.meta["_unknown_options"])  # type: ignore[arg-type]
        skipped.append(f"trace.dat options tracekit does not know, ignored: {ids}")
    try:
        cpus = dat.cpu_data(buf, salvage, skipped)
    except Truncated as err:
        raise TracekitError(
            f"{dat.reader} reader: {path}: {err}; the file is truncated or corrupt (use "
            "--salvage to read up to the damage)"
        ) from None
    return _to_binary(dat, buf, cpus, skipped)


def _choose_buffer(dat: TraceDat, instance: str | None) -> _Buffer:
    """Pick the instance to read (named, else the first with data)."""
    with_data = [b for b in dat.buffers if any(size for _, _, size in b.cpus)]
    if instance is not None:
        for b in dat.buffers:
            if b.name == instance:
                return b
        names = ", ".join(repr(b.name or "top") for b in dat.buffers)
        raise TracekitError(f"{dat.path}: no instance {instance!r} (it has {names})")
    if with_data:
        return with_data[0]
    # No pages anywhere: the instance whose stats say what it read (a damaged BUFFER
    # option), so its read events count as lost, not as a quiet empty trace.
    return max(dat.buffers, key=_read_events)  # the first of equals: top when none read


def _read_events(buf: _Buffer) -> int:
    """The events a buffer's CPUSTAT options say were read out of its ring buffer."""
    return sum(int(v) for s in buf.stats.values() if (v := s.get("read events", "")).isdigit())


def _to_binary(dat: TraceDat, buf: _Buffer, cpus: list[CpuData], skipped: list[str]) -> BinaryTrace:
    """Wrap the parsed file and one buffer as a BinaryTrace."""
    clock = buf.clock or _selected_clock(str(dat.meta.get("trace_clock_file", "")))
    meta = {k: v for k, v in dat.meta.items() if not k.startswith("_")}
    meta.update(
        format=f"trace.dat v{dat.version}", compression=dat.compression,
        instances=[b.name or "top" for b in dat.buffers],
    )  # fmt: skip
    return BinaryTrace(
        path=str(dat.path), reader=dat.reader, formats=dat.formats, cpus=cpus,
        page_size=buf.page_size or dat.page_size, endian=dat.endian,
        long_size=dat.formats.header_page.commit_size, cmdlines=dat.cmdlines,
        printk=dat.printk, kallsyms=dat.kallsyms, stats=buf.stats,
        stats_origin="trace.dat CPUSTAT option", clock=clock, instance=buf.name,
        ts_offset=dat.ts_offset, meta=meta, skipped=skipped,
    )  # fmt: skip


def _selected_clock(text: str) -> str:
    """The [bracketed] clock of a trace_clock file's content."""
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else text.strip()
