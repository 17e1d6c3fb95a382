"""Dynamic probes (kprobes, kretprobes, uprobes) under tracekit's own event group.

Probe definitions are global (kprobe_events), so tracekit defines its own under the group
`tracekit`, enables them only in its instance, and removes exactly those it defined; the
file is only ever appended to, because opening it for writing without O_APPEND would
delete everybody's probes. A kprobe's symbol is checked against the running kernel
before anything is defined, so a typo is one clear line, not a kernel EINVAL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tracekit.bundle import PROBE_GROUP
from tracekit.errors import TracekitError
from tracekit.host import journal
from tracekit.host.tracefs import Tracefs, unmount_tracefs

KALLSYMS = Path("/proc/kallsyms")

# "p[:[GRP/]EVENT] TARGET [ARGS...]" and "r[MAXACTIVE][:[GRP/]EVENT] TARGET [ARGS...]".
DEFINITION = re.compile(r"^(?P<kind>[pr])(?P<maxactive>\d*)(?::(?P<name>\S+))?\s+(?P<rest>.+)$")

# A kprobe target: [MOD:]SYM[+offs], or a bare address.
KPROBE_TARGET = re.compile(r"^(?:(?P<module>[\w.-]+):)?(?P<symbol>[\w.$]+)(?:\+(?P<offset>\w+))?$")


@dataclass(frozen=True)
class ProbeDefinition:
    """One probe, parsed from the kprobe_events syntax and put in tracekit's group."""

    kind: str  # "p" (entry) or "r" (return)
    maxactive: str
    event: str
    target: str
    args: str

    @property
    def group_event(self) -> str:
        """The probe's "group/event" name, as it appears under events/."""
        return f"{PROBE_GROUP}/{self.event}"

    def line(self) -> str:
        """The definition line written to kprobe_events / uprobe_events."""
        head = f"{self.kind}{self.maxactive}:{self.group_event} {self.target}"
        return f"{head} {self.args}".strip()


def parse_probe(text: str) -> ProbeDefinition:
    """Parse one definition; the group must be ours (or absent, then ours is used)."""
    match = DEFINITION.match(text.strip())
    if not match:
        raise TracekitError(
            f"bad probe definition {text!r}; write it as in kprobe_events, e.g. "
            "'p:tracekit/free_stage2 kvm_free_stage2_pgd' or 'r:tracekit/x_ret SYM $retval'"
        )
    target, _, args = match["rest"].strip().partition(" ")
    group, _, event = (match["name"] or "").rpartition("/")
    if group and group != PROBE_GROUP:
        raise TracekitError(
            f"probe {text!r} is in group {group!r}; tracekit only defines probes in its own "
            f"group {PROBE_GROUP!r} (write {PROBE_GROUP}/{event})"
        )
    if not event:
        # Same spirit as the kernel's automatic names, but stable and in our group.
        event = f"{match['kind']}_" + re.sub(r"\W", "_", target.rsplit("/", 1)[-1])
    if not re.fullmatch(r"[A-Za-z_]\w*", event):
        raise TracekitError(f"bad probe event name {event!r} in {text!r}: use letters, _, digits")
    return ProbeDefinition(match["kind"], match["maxactive"], event, target, args.strip())


class KernelSymbols:
    """The function names the running kernel can probe: ftrace's list and kallsyms."""

    def __init__(self, filter_functions: set[str], kallsyms: set[str]) -> None:
        self.filter_functions = filter_functions
        self.kallsyms = kallsyms

    @classmethod
    def load(cls, tracefs: Tracefs, kallsyms: Path = KALLSYMS) -> KernelSymbols:
        """Read available_filter_functions and the text symbols of /proc/kallsyms."""
        functions: set[str] = set()
        try:
            listing = tracefs.path("available_filter_functions").read_text()
        except OSError:
            # Absent without dynamic ftrace, and refused (EPERM) by some locked-down kernels.
            listing = ""
        functions.update(line.split()[0] for line in listing.splitlines() if line.strip())
        text_symbols: set[str] = set()
        if kallsyms.exists():
            for line in kallsyms.read_text().splitlines():
                fields = line.split()
                if len(fields) >= 3 and fields[1] in "tTwW":
                    text_symbols.add(fields[2])
        return cls(functions, text_symbols)

    def has(self, symbol: str) -> bool:
        """Whether a function of that name exists in the running kernel."""
        return symbol in self.filter_functions or symbol in self.kallsyms


def check_kprobe_target(probe: ProbeDefinition, symbols: KernelSymbols) -> None:
    """Refuse a kprobe whose function does not exist in the running kernel, naming it."""
    if re.fullmatch(r"0x[0-9a-fA-F]+", probe.target):
        return
    match = KPROBE_TARGET.match(probe.target)
    if not match:
        raise TracekitError(
            f"bad kprobe target {probe.target!r} in {probe.line()!r}: write [MOD:]SYMBOL[+offset]"
        )
    if not symbols.has(match["symbol"]):
        raise TracekitError(
            f"kprobe {probe.group_event}: function {match['symbol']!r} does not exist in this "
            "kernel (not in available_filter_functions nor /proc/kallsyms); pick one that "
            "does, e.g. grep it in /proc/kallsyms"
        )


class ProbeSet:
    """tracekit's probes in one control file (kprobe_events or uprobe_events)."""

    def __init__(self, tracefs: Tracefs, control: str = "kprobe_events") -> None:
        self.tracefs = tracefs
        self.control = control
        self.defined: list[ProbeDefinition] = []

    def require_support(self) -> None:
        """Refuse clearly when the kernel was built without this kind of probe."""
        if not self.tracefs.exists(self.control):
            config = f"CONFIG_{self.control.split('_')[0].upper()}_EVENTS"
            raise TracekitError(
                f"this kernel has no {self.control} ({config} is not set); "
                "run without probes or on a kernel that has them"
            )

    def existing(self) -> list[str]:
        """The "group/event" names of every probe currently defined, anybody's."""
        if not self.tracefs.exists(self.control):
            return []
        names = []
        for line in self.tracefs.read(self.control).splitlines():
            match = re.match(r"^[pr]\d*:(\S+)\s", line)
            if match:
                names.append(match[1])
        return names

    def define(self, probe: ProbeDefinition) -> None:
        """Add one probe; it is removed (and only it) when the stack unwinds."""
        self.require_support()
        if probe.group_event in self.existing():
            raise TracekitError(
                f"probe {probe.group_event} is already defined (a killed run's, or a duplicate "
                f"name?); remove it with: echo '-:{probe.group_event}' >> "
                f"{self.tracefs.path(self.control)}"
            )
        self.tracefs.stack.change(
            f"remove probe {probe.group_event}",
            lambda: self.remove(probe.group_event),
            lambda: self._add(probe),
            journal.probe(self.tracefs.path(self.control), probe.group_event),
        )

    def _add(self, probe: ProbeDefinition) -> None:
        """Append the definition; it counts as ours once the kernel took it."""
        self.tracefs.append(self.control, probe.line())
        self.defined.append(probe)

    def remove(self, group_event: str) -> None:
        """Delete one probe by name, never touching the others (a no-op if already gone)."""
        if group_event in self.existing():
            self.tracefs.append(self.control, f"-:{group_event}")

    def remove_stale(self) -> list[str]:
        """Remove tracekit-group probes left by killed runs, unless a live run may own them."""
        if self.tracefs.live_foreign_instances():
            return []
        stale = [name for name in self.existing() if name.startswith(f"{PROBE_GROUP}/")]
        for name in stale:
            self.remove(name)
        return stale


def remove_leftovers(tracefs: Tracefs) -> list[str]:
    """Undo what killed runs left: their journals first, then unjournaled instances and probes.

    Call it right after `Tracefs.open`. A dead run's tracefs mount that this run now
    uses is adopted (unmounted when this run ends). Anything that cannot be undone is
    one TracekitError naming each piece and the command that removes it.
    """
    recovery = journal.recover(keep_mounted=lambda path: path == tracefs.root)
    for path in recovery.adopted:
        tracefs.stack.push(
            f"unmount tracefs from {path}", lambda p=path: unmount_tracefs(p), journal.mount(path)
        )
    if recovery.left:
        raise TracekitError(
            "a killed tracekit run left changes that could not be undone: "
            + "; ".join(recovery.left)
        )
    removed = recovery.undone + [f"adopted the tracefs mount at {p}" for p in recovery.adopted]
    removed += tracefs.remove_stale_instances()
    for control in ("kprobe_events", "uprobe_events"):
        removed += ProbeSet(tracefs, control).remove_stale()
    return removed


def read_misses(tracefs: Tracefs, probes: list[ProbeDefinition]) -> dict[str, int]:
    """Each of these kprobes' missed hits so far ("group/event" -> count), kprobe_profile's
    third column; probes the file does not list (gone, or no kprobe_profile) are left out,
    and so are names it lists twice: it prints no group, so another tool's probe of the
    same event name (perf probe's kprobes/NAME) cannot be told from ours (review of
    15/17 #14): unknown, never the other's count."""
    if not probes or not tracefs.exists("kprobe_profile"):
        return {}
    return profile_misses(tracefs.read("kprobe_profile"), probes)


def profile_misses(text: str, probes: list[ProbeDefinition]) -> dict[str, int]:
    """kprobe_profile's "  EVENT  NHIT  NMISSED" lines (trace_kprobe.c: the event without
    its group) -> each probe's misses, for the names listed exactly once."""
    missed: dict[str, int] = {}
    seen: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[2].isdigit():
            missed[fields[0]] = int(fields[2])
            seen[fields[0]] = seen.get(fields[0], 0) + 1
    return {p.group_event: missed[p.event] for p in probes if seen.get(p.event) == 1}


def define_kprobes(
    tracefs: Tracefs, texts: list[str], symbols: KernelSymbols | None = None
) -> ProbeSet:
    """Parse and check every kprobe first, then define them all (nothing half done).

    `symbols`: the kernel's, when the caller has read them already (reading them again
    took ~4 s of a collect start in the emulated host).
    """
    probes = [parse_probe(text) for text in texts]
    if probes:
        symbols = symbols or KernelSymbols.load(tracefs)
        for probe in probes:
            check_kprobe_target(probe, symbols)
    probe_set = ProbeSet(tracefs, "kprobe_events")
    if probes:
        probe_set.require_support()
    for probe in probes:
        probe_set.define(probe)
    return probe_set
