"""The raw capture directory (docs/raw-capture.md) -> a BinaryTrace.

`tracekit collect` copies one tracefs instance's per-CPU trace_pipe_raw pages and the
files needed to decode them. Nothing here runs on the host; this only reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tracekit.errors import TracekitError
from tracekit.ingest import membuf
from tracekit.ingest.formats import FormatSet, checked_format, parse_header_event, parse_header_page
from tracekit.ingest.tables import (
    BinaryTrace,
    CpuData,
    parse_cmdlines,
    parse_printk,
    parse_stats,
    parse_tgids,
)

FORMAT_NAME = "tracekit-raw-capture"
READER = "raw capture"


def is_raw_capture(path: Path) -> bool:
    """True when path is a directory holding a raw capture's capture.json."""
    return path.is_dir() and (path / "capture.json").is_file()


def _meta(path: Path) -> dict[str, object]:
    """capture.json, checked for the format name and version."""
    try:
        meta = json.loads(_text(path / "capture.json"))
    except (OSError, json.JSONDecodeError) as err:
        raise TracekitError(f"{READER} reader: {path}/capture.json: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise TracekitError(
            f"{READER} reader: {path}/capture.json is not a {FORMAT_NAME} manifest "
            "(see docs/raw-capture.md)"
        )
    if meta.get("version") != 1:
        raise TracekitError(
            f"{READER} reader: {path}: capture version {meta.get('version')!r} is newer "
            "than this tracekit understands (1); upgrade tracekit"
        )
    return meta


def _formats(path: Path, long_size_hint: int = 8) -> FormatSet:
    """header_page, header_event and every events/<system>/<event>/format."""
    fs = FormatSet()
    try:
        fs.header_page = parse_header_page(_text(path / "header_page"))
        fs.header_event = parse_header_event(_text(path / "header_event"))
    except (OSError, ValueError) as err:
        raise TracekitError(f"{READER} reader: {path}: header_page/header_event: {err}") from None
    long_size = fs.header_page.commit_size or long_size_hint
    for fmt in sorted((path / "events").glob("*/*/format")):
        system = fmt.parent.parent.name
        fs.add(checked_format(_text(fmt), system, str(fmt), long_size))
    return fs


def _text(path: Path) -> str:
    """A file the kernel wrote as text; bytes that are not UTF-8 mean it was damaged."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TracekitError(
            f"{READER} reader: {path}: byte {err.start} is not UTF-8 text: the file is "
            "damaged; copy it again from the host or record the capture again"
        ) from None


def _optional(path: Path) -> str:
    """A file's text, or "" when the capture does not have it."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _read_back_to_back(files: list[Path]) -> list[np.ndarray]:
    """Each file's bytes, laid back to back in one releasable array (no merge copy later)."""
    sizes = [f.stat().st_size for f in files]
    whole = membuf.alloc(sum(sizes), populate=True)  # every byte is read into next
    out, pos = [], 0
    for f, size in zip(files, sizes, strict=True):
        with open(f, "rb") as fh:
            got = fh.readinto(memoryview(whole[pos : pos + size]))
        out.append(whole[pos : pos + got])
        pos += size
    return out


def _page_size(meta: dict[str, object], fs: FormatSet, path: Path) -> int:
    """capture.json's page_size: a positive whole number of bytes that holds a page header."""
    size = meta.get("page_size", fs.header_page.page_size)
    if type(size) is not int or size <= fs.header_page.data_offset or size > 1 << 24:
        raise TracekitError(
            f"{READER} reader: {path}/capture.json: page_size {size!r} is not a ring-buffer "
            f"page size (the kernel's sub-buffer size in bytes, e.g. "
            f"{fs.header_page.page_size}); the file is damaged: record the capture again"
        )
    return size


def _cpus(meta: dict[str, object], path: Path, skipped: list[str]) -> list[int]:
    """The CPUs to read: those capture.json lists, plus any per_cpu/cpuN directory it does
    not list (its pages would be lost otherwise; said in skipped)."""
    listed = meta.get("cpus", [])
    if not isinstance(listed, list) or any(type(c) is not int or c < 0 for c in listed):
        raise TracekitError(
            f"{READER} reader: {path}/capture.json: cpus {listed!r} is not a list of CPU "
            "numbers; the file is damaged: record the capture again"
        )
    found = {int(d.name[3:]) for d in (path / "per_cpu").glob("cpu*") if d.name[3:].isdigit()}
    unlisted = sorted(found - set(listed))
    if unlisted:
        skipped.append(
            f"capture.json does not list CPU(s) {unlisted} that have per_cpu directories; "
            "read them too"
        )
    return sorted(set(listed) | found)


def read_raw_capture(path: Path, salvage: bool = False) -> BinaryTrace:
    """Read a raw capture directory into a BinaryTrace."""
    meta = _meta(path)
    fs = _formats(path)
    page_size = _page_size(meta, fs, path)
    cpus: list[CpuData] = []
    stats: dict[int, dict[str, str]] = {}
    skipped: list[str] = []
    listed = _cpus(meta, path, skipped)
    raws = {c: path / "per_cpu" / f"cpu{c}" / "trace_pipe_raw" for c in listed}
    present = [c for c in listed if raws[c].exists()]
    datas = dict(zip(present, _read_back_to_back([raws[c] for c in present]), strict=True))
    for cpu in listed:
        cdir = path / "per_cpu" / f"cpu{cpu}"
        raw = raws[cpu]
        if cpu in datas:
            data = datas[cpu]
            if len(data) % page_size:
                if not salvage:
                    raise TracekitError(
                        f"{READER} reader: {raw}: byte offset {len(data) - len(data) % page_size}:"
                        f" {len(data)} bytes is not a whole number of {page_size}-byte pages "
                        "(truncated; use --salvage to read the whole pages)"
                    )
                skipped.append(f"CPU {cpu}: {len(data) % page_size} bytes of a partial last page")
                data = data[: len(data) - len(data) % page_size]
            cpus.append(CpuData(int(cpu), data, 0, str(raw)))
        if (cdir / "stats").exists():
            stats[int(cpu)] = parse_stats(_text(cdir / "stats"))
    if meta.get("complete") is False:
        skipped.append("capture.json says the capture is not complete")
    return BinaryTrace(
        path=str(path), reader=READER, formats=fs, cpus=cpus, page_size=page_size,
        long_size=fs.header_page.commit_size,
        cmdlines=parse_cmdlines(_optional(path / "saved_cmdlines")),
        tgids=parse_tgids(_optional(path / "saved_tgids")),
        printk=parse_printk(_optional(path / "printk_formats")),
        kallsyms=_optional(path / "kallsyms"), stats=stats,
        stats_origin="per_cpu/cpu<N>/stats", clock=str(meta.get("trace_clock", "")),
        instance=str(meta.get("instance", "")),
        meta={"format": FORMAT_NAME, "kernel_release": meta.get("kernel_release"),
              "events_enabled": meta.get("events", [])},
        skipped=skipped,
    )  # fmt: skip
