"""Binary capture of one tracefs instance into a raw capture directory.

The layout is docs/raw-capture.md. Ring-buffer pages are read from each CPU's
trace_pipe_raw, one page per read(2), without blocking: reading a page is what frees it
in the kernel's buffer, so draining between runs keeps the buffers from overflowing
while nothing of tracekit runs during a measurement. The kernel hands out a partly
filled last page too, so nothing recorded is left behind. capture.json says
`"complete": false` until `finish()` has written everything.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.host.cleanup import open_fd
from tracekit.host.instance import Instance
from tracekit.host.tracefs import KPTR_RESTRICT

FORMAT_NAME = "tracekit-raw-capture"
FORMAT_VERSION = 1

# Global files copied at the end so that the capture decodes on any machine.
GLOBAL_COPIES = ("saved_cmdlines", "saved_tgids", "printk_formats")


@dataclass
class DrainResult:
    """What one drain read: whole pages per CPU."""

    pages: dict[int, int] = field(default_factory=dict)

    @property
    def total_pages(self) -> int:
        """Pages read over all CPUs."""
        return sum(self.pages.values())


class RawCapture:
    """Writes an instance's ring-buffer pages and metadata into a capture directory."""

    def __init__(self, instance: Instance, directory: Path, kallsyms: bool = True) -> None:
        self.instance = instance
        self.directory = directory
        self.want_kallsyms = kallsyms
        self.page_size = instance.page_size()
        self.cpus = instance.cpus()
        self.notes: list[str] = []
        self._formats_copied: set[str] = set()

    def start(self) -> None:
        """Create the directory with header and format files, marked incomplete."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TracekitError(f"cannot create {self.directory}: {err.strerror}") from None
        if any(self.directory.iterdir()):
            raise TracekitError(
                f"{self.directory} is not empty; give a new directory for the capture"
            )
        self._write_manifest(complete=False)
        events = self.instance.path / "events"
        for name in ("header_page", "header_event"):
            shutil.copyfile(events / name, self.directory / name)
        self._copy_formats()

    def _copy_formats(self) -> None:
        """Copy the format file of every enabled event, and of every ftrace event.

        Formats already copied are skipped: each file costs several round trips on a
        bundle over 9p or NFS (seconds per run in the emulated host), and an event's
        format does not change while its probe or tracepoint exists.
        """
        events = self.instance.path / "events"
        wanted = set(self.instance.events)
        wanted.update(f"ftrace/{p.name}" for p in (events / "ftrace").iterdir() if p.is_dir())
        systems: set[Path] = set()  # made once each: a mkdir that fails is a round trip too
        for name in sorted(wanted - self._formats_copied):
            source = events / name / "format"
            if source.exists():
                target = self.directory / "events" / name / "format"
                if target.parent.parent not in systems:
                    target.parent.parent.mkdir(parents=True, exist_ok=True)
                    systems.add(target.parent.parent)
                target.parent.mkdir(exist_ok=True)
                target.write_bytes(source.read_bytes())
                self._formats_copied.add(name)

    def drain(self) -> DrainResult:
        """Read every page the kernel has for each CPU now, appending to the capture."""
        result = DrainResult()
        for cpu in self.cpus:
            result.pages[cpu] = self._drain_cpu(cpu)
        return result

    def _drain_cpu(self, cpu: int) -> int:
        """Read one CPU's trace_pipe_raw until it has nothing more, page by page."""
        source = self.instance.path / "per_cpu" / f"cpu{cpu}" / "trace_pipe_raw"
        target = self.directory / "per_cpu" / f"cpu{cpu}" / "trace_pipe_raw"
        pages: list[bytes] = []
        with open_fd(source, os.O_RDONLY | os.O_NONBLOCK) as fd:
            while page := _read_page(fd, self.page_size, source):
                pages.append(page)
        if pages:
            # One write per drain: the capture may sit on a slow share (9p, NFS).
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "ab") as out:
                out.write(b"".join(pages))
        return len(pages)

    def finish(self) -> None:
        """Drain the rest, copy stats and the decoding tables, then mark complete."""
        self.drain()
        # Events enabled after start() (a late kprobe, function_graph) need formats too.
        self._copy_formats()
        for cpu in self.cpus:
            stats = self.instance.path / "per_cpu" / f"cpu{cpu}" / "stats"
            target = self.directory / "per_cpu" / f"cpu{cpu}" / "stats"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(stats.read_bytes())
        tracefs = self.instance.tracefs
        for name in GLOBAL_COPIES:
            if tracefs.exists(name):
                (self.directory / name).write_bytes(tracefs.path(name).read_bytes())
        if self.want_kallsyms:
            self._copy_kallsyms()
        self._write_manifest(complete=True)

    def _copy_kallsyms(self) -> None:
        """Copy /proc/kallsyms with real addresses, lifting kptr_restrict=2 only meanwhile."""
        tracefs = self.instance.tracefs
        with tracefs.stack.scoped() as restore:
            if KPTR_RESTRICT.exists() and KPTR_RESTRICT.read_text().strip() == "2":
                # 2 hides addresses even from root; 1 shows them to CAP_SYSLOG (root).
                tracefs.set_file(KPTR_RESTRICT, "1", restore)
            text = Path("/proc/kallsyms").read_bytes()
        # The first 100 lines only: splitting all of it (2-7 MB) cost ~1 s per traced run
        # in the emulated host.
        if not any(line.split(b" ", 1)[0].strip(b"0") for line in text.split(b"\n", 100)[:100]):
            self.notes.append("kallsyms not copied: the kernel shows no addresses to this user")
            return
        (self.directory / "kallsyms").write_bytes(text)

    def _write_manifest(self, complete: bool) -> None:
        """Write capture.json (atomically, so a reader never sees half of it)."""
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "page_size": self.page_size,
            "cpus": self.cpus,
            "trace_clock": _current_clock(self.instance.read("trace_clock")),
            "kernel_release": self.instance.tracefs.kernel_release(),
            "instance": self.instance.name,
            "events": list(self.instance.events),
            "complete": complete,
        }
        temporary = self.directory / "capture.json.tmp"
        temporary.write_text(json.dumps(manifest, indent=2) + "\n")
        temporary.replace(self.directory / "capture.json")


def _read_page(fd: int, page_size: int, source: Path) -> bytes:
    """One whole ring-buffer page, or b"" when the CPU's buffer has nothing more now."""
    chunks: list[bytes] = []
    wanted = page_size
    while wanted:
        try:
            chunk = os.read(fd, wanted)
        except BlockingIOError:
            chunk = b""
        except OSError as err:
            if err.errno == errno.EINTR:
                continue
            raise TracekitError(f"cannot read {source}: {err.strerror}") from None
        if not chunk:
            break
        chunks.append(chunk)
        wanted -= len(chunk)
    data = b"".join(chunks)
    if data and len(data) != page_size:
        # The kernel always completes a page it started; a short one means a changed ABI.
        raise TracekitError(
            f"{source} returned {len(data)} bytes, not a whole {page_size}-byte page; "
            "this kernel's trace_pipe_raw is not understood, report it with `uname -r`"
        )
    return data


def _current_clock(text: str) -> str:
    """The selected clock in a trace_clock file ("[boot]" among the offered ones)."""
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else text.strip()
