"""tracefs on the host: find or mount it, and change it only through a record of old values.

Every write that changes a setting goes through `Tracefs.set`, which reads the old value
first and pushes its restoration on the cleanup stack (and its journal) before writing,
so the host is left as it was found (see cleanup.py, journal.py). tracekit traces in an
instance of its own, `tracekit-<pid>` (instance.py); `snapshot()` returns every setting
tracekit may touch, so tests and the collector can check that a run left nothing behind.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.host import journal
from tracekit.host.cleanup import CleanupStack, open_fd
from tracekit.host.tracefsio import (
    PROC_MOUNTS,
    mount_tracefs,
    parse_tracefs_mounts,
    unmount_tracefs,
    write_once,
)

DEFAULT_MOUNT_POINT = Path("/sys/kernel/tracing")
KPTR_RESTRICT = Path("/proc/sys/kernel/kptr_restrict")

# Names of tracekit's own instances; the pid says which run owns one.
INSTANCE_PREFIX = "tracekit-"
# tracekit-<pid>, or tracekit-<pid>-<purpose> for a run's helper instances.
INSTANCE_NAME = re.compile(r"^tracekit-(\d+)(?:-\w+)?$")

# Top-level files whose content is a setting someone may rely on; none may change for good.
TOP_LEVEL_SETTINGS = (
    "tracing_on",
    "current_tracer",
    "trace_clock",
    "buffer_size_kb",
    "buffer_subbuf_size_kb",
    "buffer_percent",
    "saved_cmdlines_size",
    "tracing_cpumask",
    "tracing_thresh",
    "set_event",
    "set_event_pid",
    "set_ftrace_pid",
    "set_graph_function",
    "kprobe_events",
    "uprobe_events",
    "dynamic_events",
)

# The same for an instance, which holds fewer files.
INSTANCE_SETTINGS = (
    "tracing_on",
    "current_tracer",
    "trace_clock",
    "buffer_size_kb",
    "buffer_subbuf_size_kb",
    "buffer_percent",
    "tracing_cpumask",
    "set_event",
    "set_graph_function",
)

# Files holding lists, which read back a comment when empty and are emptied by truncation.
LIST_FILES = ("set_graph_function", "set_ftrace_filter", "set_ftrace_notrace", "set_event")


def require_root() -> None:
    """Refuse to go on unless running as root, before anything is changed."""
    if os.geteuid() != 0:
        raise TracekitError(
            "tracing the host needs root (tracefs, kprobes, kallsyms); run tracekit with sudo"
        )


def find_tracefs_mount(mounts_text: str) -> Path | None:
    """Where tracefs is mounted according to /proc/mounts, preferring the standard place."""
    found = parse_tracefs_mounts(mounts_text)
    if DEFAULT_MOUNT_POINT in found:
        return DEFAULT_MOUNT_POINT
    return found[0] if found else None


def restorable_value(rel: str, text: str) -> str:
    """What to write back into a tracefs file so that it reads `text` again."""
    name = rel.rsplit("/", 1)[-1]
    value = text.strip()
    if name == "trace_clock":
        # "[local] global boot" -> the bracketed clock is the current one.
        match = re.search(r"\[(\S+)\]", value)
        return match[1] if match else value
    if name == "filter" and value == "none":
        return "0"
    if name == "enable":
        # "0*"/"1*": soft-(dis)abled by a trigger; the plain value is what was set.
        return value.rstrip("*")
    if name == "buffer_size_kb":
        # "7 (expanded: 1408)": never expanded yet; the expanded size is what it will be.
        match = re.search(r"expanded: (\d+)", value)
        return match[1] if match else value
    if name in LIST_FILES and value.startswith("#"):
        return ""
    return value


def _read_text(path: Path) -> str:
    """Read a small tracefs or procfs file, with a clear error if it cannot be read."""
    try:
        return path.read_text()
    except OSError as err:
        raise TracekitError(
            f"cannot read {path}: {err.strerror}; is this kernel's tracing configured "
            "(CONFIG_FTRACE) and are you root?"
        ) from None


class Tracefs:
    """The mounted tracefs of this host; every change is undone through `stack`."""

    def __init__(self, root: Path, stack: CleanupStack) -> None:
        self.root = root
        self.stack = stack

    @classmethod
    def open(cls, stack: CleanupStack, mount_point: Path = DEFAULT_MOUNT_POINT) -> Tracefs:
        """Check root, then find tracefs or mount it (unmounted again when the stack unwinds)."""
        require_root()
        mounted = find_tracefs_mount(_read_text(PROC_MOUNTS))
        if mounted is not None:
            return cls(mounted, stack)
        stack.change(
            f"unmount tracefs from {mount_point}",
            lambda: unmount_tracefs(mount_point),
            lambda: _mount_tracefs(mount_point),
            journal.mount(mount_point),
        )
        return cls(mount_point, stack)

    def path(self, rel: str) -> Path:
        """The absolute path of a file given relative to the tracefs root."""
        return self.root / rel

    def exists(self, rel: str) -> bool:
        """Whether the kernel offers this file (features come and go with configs)."""
        return self.path(rel).exists()

    def read(self, rel: str) -> str:
        """The content of a tracefs file."""
        return _read_text(self.path(rel))

    def write(self, rel: str, value: str) -> None:
        """Write a value, replacing the old one; errors carry the kernel's own explanation."""
        self._write(self.path(rel), value, append=False)

    def append(self, rel: str, value: str) -> None:
        """Append to a list file such as kprobe_events, leaving other entries alone."""
        self._write(self.path(rel), value, append=True)

    def set(self, rel: str, value: str, stack: CleanupStack | None = None) -> None:
        """Change a setting; its old value is restored when `stack` (ours by default) unwinds."""
        self.set_file(self.path(rel), value, stack)

    def set_file(self, path: Path, value: str, stack: CleanupStack | None = None) -> None:
        """Change any setting file (tracefs or /proc/sys) and record how to put it back."""
        old = restorable_value(path.name, _read_text(path))
        if old == value.strip():
            return
        (stack or self.stack).change(
            f"restore {path} to {old!r}",
            lambda: self._write(path, old, append=False),
            lambda: self._write(path, value, append=False),
            journal.setting(path, old),
        )

    def _write(self, path: Path, value: str, append: bool) -> None:
        """One write(2) of `value`: tracefs parses each write as a whole command."""
        log = self._error_log_for(path)
        log_before = _read_text(log) if log.exists() else ""
        # os.open, not open(): Python's "a" mode seeks, which some tracefs files refuse.
        try:
            write_once(path, value, append, opener=open_fd)
        except OSError as err:
            kernel_says = _new_log_lines(log_before, _read_text(log) if log.exists() else "")
            detail = f" (kernel: {kernel_says})" if kernel_says else ""
            raise TracekitError(
                f"cannot write {value.strip()!r} to {path}: {err.strerror}{detail}; "
                f"check the value against {self.root / 'README'} or the kernel's tracefs docs"
            ) from None

    def _error_log_for(self, path: Path) -> Path:
        """The error_log that explains failed writes to `path` (its instance's, or the top's)."""
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            return self.root / "error_log"
        parts = rel.parts
        if len(parts) > 2 and parts[0] == "instances":
            return self.root / "instances" / parts[1] / "error_log"
        return self.root / "error_log"

    def kernel_release(self) -> str:
        """The running kernel's release string, as `uname -r` prints it."""
        return os.uname().release

    def instance_names(self) -> list[str]:
        """All tracefs instances on this host, ours and anybody else's."""
        instances = self.path("instances")
        if not instances.is_dir():
            return []
        return sorted(entry.name for entry in instances.iterdir() if entry.is_dir())

    def stale_instances(self) -> list[str]:
        """tracekit instances whose owning process no longer exists (a killed run's)."""
        stale = []
        for name in self.instance_names():
            match = INSTANCE_NAME.match(name)
            if match and not _pid_alive(int(match[1])):
                stale.append(name)
        return stale

    def live_foreign_instances(self) -> list[str]:
        """tracekit instances of other runs that are still going."""
        names = []
        for name in self.instance_names():
            match = INSTANCE_NAME.match(name)
            if match and int(match[1]) != os.getpid() and _pid_alive(int(match[1])):
                names.append(name)
        return names

    def remove_instance(self, name: str) -> None:
        """rmdir an instance; the kernel frees its buffers and disables its events."""
        path = self.path(f"instances/{name}")
        try:
            path.rmdir()
        except FileNotFoundError:
            return
        except OSError as err:
            hint = (
                "a process still has one of its files open (trace_pipe?)"
                if err.errno == errno.EBUSY
                else "check tracefs"
            )
            raise TracekitError(
                f"cannot remove tracefs instance {name}: {err.strerror}; {hint}; "
                f"remove it later with: rmdir {path}"
            ) from None

    def remove_stale_instances(self) -> list[str]:
        """Remove the instances of killed tracekit runs; returns their names for the report."""
        removed = []
        for name in self.stale_instances():
            self.remove_instance(name)
            removed.append(name)
        return removed

    def create_instance(self, name: str | None = None) -> Path:
        """mkdir our own instance (`tracekit-<pid>`); it is removed when the stack unwinds."""
        name = name or f"{INSTANCE_PREFIX}{os.getpid()}"
        instances = self.path("instances")
        if not instances.is_dir():
            raise TracekitError(
                f"{self.root} has no instances/ directory; this kernel is too old for "
                "tracefs instances (3.10+ needed)"
            )
        self._keep_top_buffer_size()
        self.stack.change(
            f"remove tracefs instance {name}",
            lambda: self.remove_instance(name),
            lambda: _make_instance(instances / name),
            journal.instance(instances / name),
        )
        return instances / name

    def _keep_top_buffer_size(self) -> None:
        """Make sure a not-yet-allocated top-level buffer still gets its full size later.

        On older kernels (seen on 6.1; newer ones keep the flag per instance), resizing ANY
        instance's buffer sets the kernel's global "expanded" flag, so the top-level buffer,
        still at its tiny boot size ("7 (expanded: 1408)"), would stay tiny for every later
        user. The flag cannot be cleared, so on the way out the top-level buffer is given
        the size it would have had.
        """
        text = self.read("buffer_size_kb")
        if "expanded" not in text:
            return
        full = restorable_value("buffer_size_kb", text)
        self.stack.push(
            f"give the top-level ring buffer its full size ({full} KB per CPU)",
            lambda: self._expand_top_buffer(full),
            journal.expand_buffer(self.path("buffer_size_kb"), full),
        )

    def _expand_top_buffer(self, full: str) -> None:
        """Write the full size if the kernel now shows the boot size as final."""
        text = self.read("buffer_size_kb")
        if "expanded" not in text and restorable_value("buffer_size_kb", text) != full:
            self.write("buffer_size_kb", full)


def _new_log_lines(before: str, after: str) -> str:
    """What the kernel added to error_log, squeezed onto one line."""
    added = after[len(before) :] if after.startswith(before) else after
    lines = [line.strip() for line in added.splitlines() if line.strip()]
    return " | ".join(lines[-3:])


def _pid_alive(pid: int) -> bool:
    """Whether a process exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mount_tracefs(mount_point: Path) -> None:
    """Mount tracefs at its standard place, refused clearly where that is impossible."""
    if not mount_point.is_dir():
        raise TracekitError(
            f"tracefs is not mounted and {mount_point} does not exist; is this kernel "
            "built with CONFIG_FTRACE? (mount it with: mount -t tracefs nodev <dir>)"
        )
    mount_tracefs(mount_point)


def _make_instance(path: Path) -> None:
    """mkdir a tracefs instance; an existing one is somebody else's and is refused."""
    try:
        path.mkdir()
    except FileExistsError:
        raise TracekitError(
            f"tracefs instance {path.name} already exists; another tracekit run with this "
            f"pid? remove it with: rmdir {path}"
        ) from None
    except OSError as err:
        raise TracekitError(f"cannot create tracefs instance {path.name}: {err.strerror}") from None


def snapshot(root: Path, instances: list[str] | None = None) -> dict[str, object]:
    """Every setting tracekit may change, top level and in `instances`, as plain data."""
    result: dict[str, object] = {
        "top": _settings(root, TOP_LEVEL_SETTINGS),
        "instances": sorted(p.name for p in (root / "instances").iterdir() if p.is_dir())
        if (root / "instances").is_dir()
        else [],
    }
    if KPTR_RESTRICT.exists():
        result["kptr_restrict"] = KPTR_RESTRICT.read_text().strip()
    for name in instances or []:
        path = root / "instances" / name
        if path.is_dir():
            settings = _settings(path, INSTANCE_SETTINGS)
            settings["filters"] = _enabled_filters(path)
            result[f"instance:{name}"] = settings
    return result


def _settings(root: Path, names: tuple[str, ...]) -> dict[str, object]:
    """The named settings under one tracefs root (top or instance), with its options."""
    values: dict[str, object] = {}
    for name in names:
        path = root / name
        if path.exists():
            values[name] = restorable_value(name, _read_for_snapshot(path))
    if "buffer_size_kb" in values:
        values["buffer_size_kb"] = _buffer_pages(root, str(values["buffer_size_kb"]))
    options = root / "options"
    if options.is_dir():
        values["options"] = {p.name: _read_for_snapshot(p) for p in sorted(options.iterdir())}
    return values


def _buffer_pages(root: Path, kb_text: str) -> str:
    """A per-CPU buffer size as the pages the kernel gives it, which is what a user gets.

    The kernel rounds sizes up to whole pages and shows the rounded size: 1408 KB asked
    (or "7 (expanded: 1408)" before first use) reads back as 1410, the same 354 pages.
    """
    match = re.search(
        r"char data;\s*offset:\d+;\s*size:(\d+);", _read_for_snapshot(root / "events/header_page")
    )
    if not match or not kb_text.isdigit():
        return kb_text
    data_bytes = int(match[1])
    return f"{-(-int(kb_text) * 1024 // data_bytes)} pages"


def _read_for_snapshot(path: Path) -> str:
    """A setting's text; some kernels refuse to show a few (EPERM), which is recorded too."""
    try:
        return path.read_text().strip()
    except OSError as err:
        return f"<unreadable: {err.strerror}>"


def _enabled_filters(root: Path) -> dict[str, str]:
    """Filters of the events enabled in an instance, by "system/event"."""
    filters = {}
    for line in (root / "set_event").read_text().splitlines():
        system, _, event = line.strip().partition(":")
        path = root / "events" / system / event / "filter"
        if event and path.exists():
            filters[f"{system}/{event}"] = path.read_text().strip()
    return filters
