"""tracekit's own tracefs instance: buffers, clock, events, filters, options, markers.

An instance has its own ring buffer, clock, events and trace_marker, so tracekit never
disturbs the top-level buffer or another tool's tracing. Everything set here goes through
`Tracefs.set`, so it is restored (and the instance removed) when the cleanup stack
unwinds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.host.cleanup import open_fd
from tracekit.host.tracefs import Tracefs

# Every recording uses this clock, the one the VMM and probe stamp with (CLOCK_BOOTTIME).
TRACE_CLOCK = "boot"

# Enough pid -> comm slots that a run's short-lived threads keep their names.
SAVED_CMDLINES_SIZE = 8192

# function_graph became usable inside instances in this kernel version.
FUNCTION_GRAPH_IN_INSTANCES = (6, 11)


class Instance:
    """One tracefs instance, configured only through recorded, restorable writes."""

    def __init__(self, tracefs: Tracefs, name: str) -> None:
        self.tracefs = tracefs
        self.name = name
        self.path = tracefs.path(f"instances/{name}")
        self.events: list[str] = []

    @classmethod
    def create(cls, tracefs: Tracefs, name: str | None = None) -> Instance:
        """Make a new instance, stopped, with nothing enabled yet."""
        path = tracefs.create_instance(name)
        instance = cls(tracefs, path.name)
        # A new instance starts with tracing on; nothing is recorded until we say so.
        instance.set("tracing_on", "0")
        return instance

    def rel(self, name: str) -> str:
        """A path in this instance, relative to the tracefs root."""
        return f"instances/{self.name}/{name}"

    def read(self, name: str) -> str:
        """The content of one of the instance's files."""
        return self.tracefs.read(self.rel(name))

    def set(self, name: str, value: str) -> None:
        """Change one of the instance's settings, restorably."""
        self.tracefs.set(self.rel(name), value)

    @property
    def trace_marker(self) -> Path:
        """The instance's own trace_marker: the VMM and the probe write their markers here."""
        return self.path / "trace_marker"

    def write_marker(self, text: str) -> None:
        """Write one marker line into this instance's buffer (an ftrace/print event)."""
        with open_fd(self.trace_marker, os.O_WRONLY) as fd:
            os.write(fd, text.encode())

    def set_buffer_size_kb(self, kb_per_cpu: int) -> None:
        """Size each CPU's ring buffer; the caller sizes it so that a whole run fits."""
        if kb_per_cpu <= 0:
            raise TracekitError(f"buffer size must be positive, not {kb_per_cpu} KB per CPU")
        self.set("buffer_size_kb", str(kb_per_cpu))

    def set_trace_clock(self, clock: str = TRACE_CLOCK) -> None:
        """Choose the clock that timestamps every event of the instance."""
        offered = re.findall(r"[^\s\[\]]+", self.read("trace_clock"))
        if clock not in offered:
            raise TracekitError(
                f"trace clock {clock!r} is not offered by this kernel (it has: "
                f"{' '.join(offered)}); tracekit needs 'boot' (Linux 4.10+)"
            )
        self.set("trace_clock", clock)

    def set_option(self, option: str, enabled: bool) -> None:
        """Turn an instance option on or off (falls back to the top level where global)."""
        value = "1" if enabled else "0"
        if self.tracefs.exists(self.rel(f"options/{option}")):
            self.set(f"options/{option}", value)
        elif self.tracefs.exists(f"options/{option}"):
            self.tracefs.set(f"options/{option}", value)
        else:
            raise TracekitError(f"this kernel has no tracefs option {option!r}")

    def record_task_names(self) -> None:
        """Keep pid -> comm and pid -> tgid maps big enough and on, for saved_* files."""
        if self.tracefs.exists("saved_cmdlines_size"):
            current = int(self.tracefs.read("saved_cmdlines_size").split()[0])
            if current < SAVED_CMDLINES_SIZE:
                self.tracefs.set("saved_cmdlines_size", str(SAVED_CMDLINES_SIZE))
        if self.tracefs.exists(self.rel("options/record-tgid")) or self.tracefs.exists(
            "options/record-tgid"
        ):
            self.set_option("record-tgid", True)

    def event_names(self, spec: str) -> list[str]:
        """Expand "sched/sched_switch", "sched:sched_switch" or a whole system "irq"."""
        system, sep, event = spec.replace(":", "/").partition("/")
        events = self.path / "events"
        if not sep or event in ("", "*"):
            directory = events / system
            if not system or not directory.is_dir():
                raise TracekitError(
                    f"unknown event system {spec!r}; see {events.parent / 'available_events'}"
                )
            return sorted(f"{system}/{p.name}" for p in directory.iterdir() if p.is_dir())
        if not (events / system / event).is_dir():
            raise TracekitError(
                f"unknown event {spec!r} on this kernel; see "
                f"{self.tracefs.path('available_events')} (is its CONFIG_ option set?)"
            )
        return [f"{system}/{event}"]

    def has_event(self, spec: str) -> bool:
        """Whether the kernel offers this event or system (e.g. syscalls need FTRACE_SYSCALLS)."""
        try:
            self.event_names(spec)
        except TracekitError:
            return False
        return True

    def enable_events(self, specs: list[str], filters: dict[str, str] | None = None) -> None:
        """Enable events in this instance only, with optional filters ("sys/event" -> expr)."""
        filters = filters or {}
        names = [name for spec in specs for name in self.event_names(spec)]
        for spec in filters:
            if not any(name == spec.replace(":", "/") for name in names):
                raise TracekitError(f"a filter is given for {spec!r}, which is not enabled")
        for spec, expression in filters.items():
            self.set(f"events/{spec.replace(':', '/')}/filter", expression)
        for name in names:
            self.set(f"events/{name}/enable", "1")
            if name not in self.events:
                self.events.append(name)

    def start(self) -> None:
        """Start recording into the instance's buffer."""
        self.set("tracing_on", "1")

    def stop(self) -> None:
        """Stop recording; what is in the buffer stays there until drained."""
        self.tracefs.write(self.rel("tracing_on"), "0")

    def cpus(self) -> list[int]:
        """The CPUs this instance has a buffer for (per_cpu/cpuN)."""
        per_cpu = self.path / "per_cpu"
        return sorted(int(p.name[3:]) for p in per_cpu.iterdir() if re.fullmatch(r"cpu\d+", p.name))

    def page_size(self) -> int:
        """The ring buffer's sub-buffer size: every trace_pipe_raw read returns one of these."""
        header = self.path / "events" / "header_page"
        match = re.search(r"char data;\s*offset:(\d+);\s*size:(\d+);", header.read_text())
        if match:
            return int(match[1]) + int(match[2])
        subbuf = self.path / "buffer_subbuf_size_kb"
        if subbuf.exists():
            return int(subbuf.read_text()) * 1024
        return os.sysconf("SC_PAGE_SIZE")

    def cpu_stats(self, cpu: int) -> dict[str, float]:
        """per_cpu/cpuN/stats as numbers: entries, overrun, dropped events, ..."""
        return parse_cpu_stats((self.path / "per_cpu" / f"cpu{cpu}" / "stats").read_text())

    def function_graph_unavailable(self) -> str | None:
        """Why function_graph cannot run in this instance, or None when it can."""
        tracers = self.read("available_tracers").split()
        if "function_graph" in tracers:
            return None
        release = self.tracefs.kernel_release()
        version = tuple(int(n) for n in re.findall(r"\d+", release)[:2])
        if version < FUNCTION_GRAPH_IN_INSTANCES:
            need = "Linux 6.11 or later runs function_graph in instances"
        else:
            need = "this kernel is built without CONFIG_FUNCTION_GRAPH_TRACER"
        return (
            f"function_graph is not available in tracefs instances on {release} ({need}); "
            "use entry and return kprobes on the same functions instead"
        )

    def graph_limit_file(self) -> str:
        """set_graph_function (call trees) where the instance has it, else set_ftrace_filter."""
        graph = "set_graph_function"
        return graph if self.tracefs.exists(self.rel(graph)) else "set_ftrace_filter"

    def enable_function_graph(self, functions: list[str]) -> None:
        """Run function_graph in this instance, limited to the given functions' call trees."""
        reason = self.function_graph_unavailable()
        if reason:
            raise TracekitError(reason)
        if not functions:
            raise TracekitError("function_graph needs at least one function to graph")
        # Instances have no set_graph_function (seen on 6.12 and 6.18): there the graph is
        # limited by set_ftrace_filter to the functions themselves (durations, no callees).
        limit = self.graph_limit_file()
        # The kernel takes one function per write to these files.
        self.set(limit, functions[0])
        for function in functions[1:]:
            self.tracefs.append(self.rel(limit), function)
        self.set("current_tracer", "function_graph")
        for event in ("ftrace/funcgraph_entry", "ftrace/funcgraph_exit"):
            if event not in self.events:
                self.events.append(event)


def parse_cpu_stats(text: str) -> dict[str, float]:
    """Parse a per_cpu/cpuN/stats file ("overrun: 3", "now ts:  2604.354441")."""
    stats: dict[str, float] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            try:
                stats[key.strip()] = float(value.strip())
            except ValueError:
                continue
    return stats
