"""The plugin's simulation log (tksim.c): what the model did, and where its delays landed.

Lines: `tksim-log 6` (1: before responders paid; 2: before pay-when; 3: before
responder-cpus; 4: before the CPU entry; 5: before its _stext anchor), `model NAME HASH`,
`clock ID`, `responder-cpus N...` (format 4, when only those vCPUs pay as responders),
then events (`create TS VCPU DOSE VADDR`, `clear-local TS VCPU 1 VADDR`, `clear-all TS
VCPU CLEARED VADDR`, `cpu-on TS VCPU CLEARED PA`: the vCPU entered the kernel after
CPU_ON, CLEARED 1 if that cleared it; TS the QEMU host's CLOCK_MONOTONIC in ns), `pay-at
SYMBOL ADDR` where responders pay (`pay-at unresolved 0x0`: nowhere), `cpu-entry-at
SYMBOL PA TEXT_PA STEXT_PA ANCHOR` where a powered-on CPU enters, found from ANCHOR's PA
(`_text` or `_stext`; format 5: `SYMBOL PA TEXT_PA`, anchored on _text; `unresolved 0x0
...`: never seen), then at QEMU's exit one `vcpu V key value...` line per vCPU and
`complete 1`. Standard library only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.simulate.model import CPU_ENTRY_SYMBOL
from tracekit.vhost.qemu import (
    BOOTED_SECONDARY,
    BOOTING_LINUX,
    FAILED_TO_COME_ONLINE,
    qemu_mpidr,
    qemu_vcpu,
)

SIM_LOG = "vhost-simulate.txt"  # in vhost run's --out, beside the ground-truth log
SIM_MODEL = "vhost-simulate-model.txt"  # the plugin form the plugin read
EVENTS = ("create", "clear-local", "clear-all", "cpu-on")
VCPU_KEYS = (
    "creates",
    "clears",
    "delayed",
    "injected_ns",
    "actual_ns",
    "spans",
    "span_ns",
    "waited_spans",
    "waited_ns",
    "dose",
)
# Format 2's responder keys (0 in a format 1 log): completions this vCPU put in the ring
# for the others, IRQ entries at which it paid, the completions it paid for, what they
# asked (responder_ns each), what was injected (capped) and what the waits really took.
RESPONDER_KEYS = ("bcasts", "pays", "owed", "asked_ns", "paid_ns", "paid_actual_ns")
# Format 3's (0 before): IRQ entries that woke it from WFI, and completions of the window
# its entries did not charge because they came while it was awake (pay-when wake).
WAKE_KEYS = ("wakes", "spared")
# Format 5's (0 before): executions of the kernel's CPU entry, i.e. power-ons (CPU_ON).
ENTRY_KEYS = ("entries",)
FORMATS = ("1", "2", "3", "4", "5", "6")
# /proc/iomem's "Kernel code" starts at __pa_symbol(_stext) on 6.1 (6.1.176
# arch/arm64/kernel/setup.c:224) and at __pa_symbol(_text) on 6.12 (6.12.117 :216).
CODE_START_SYMBOLS = ("_text", "_stext")
# Its end is __pa_symbol(__init_begin - 1) on both (6.1 :225, 6.12 :217), and kallsyms
# lists __init_begin without CONFIG_KALLSYMS_ALL (it is _sinittext, a kept range's start).
INIT_BEGIN = "__init_begin"


@dataclass(frozen=True)
class CpuEntry:
    """Where the plugin watched for a powered-on CPU's entry, and from which anchor."""

    symbol: str  # the entry's symbol; "unresolved" when the plugin never found it
    pa: int
    text_pa: int  # the Image's load address: _text's PA
    stext_pa: int  # _stext's PA (the Image's BaseOfCode above _text); 0 in format 5
    anchor: str  # the kallsyms symbol the PA was computed from: _text, _stext, or none

    def anchor_pa(self) -> int:
        """The PA the anchor symbol was placed at (TEXT_PA for `none`: nothing was)."""
        return self.stext_pa if self.anchor == "_stext" else self.text_pa


@dataclass(frozen=True)
class EntryCheck:
    """Whether the plugin watched where the boot's kernel enters after CPU_ON."""

    cpu_on: bool  # the model clears by cpu-on: a wrong entry means it never cleared
    mistakes: list[str]  # the watched entry is wrong, or was never found ([]: right)
    warnings: list[str]  # disagreements that leave the watched entry right
    # The bring-ups the kernel logged during the command, each seen at the entry (None:
    # not counted, or a mistake).
    power_ons: int | None = None

    def lines(self) -> list[str]:
        """What the check found, one line each, worded for the model's use of it."""
        if not self.mistakes:
            seen = "" if self.power_ons is None else (
                f"; the plugin saw there each of the {self.power_ons} power-on(s) the kernel logged"
                " during the command")  # fmt: skip
            head = ["the CPU entry the plugin watched is where this boot's /proc/iomem and "
                    f"kallsyms put secondary_entry{seen}"]  # fmt: skip
        elif self.cpu_on:
            head = ["NOT AS MODELLED: the model clears by cpu-on, and the plugin did not see "
                    "this boot's power-ons where its kernel enters, so it did not clear as "
                    "modelled: " + "; ".join(self.mistakes)]  # fmt: skip
        else:
            head = ["power-ons were not watched (the model does not clear by them): "
                    + "; ".join(self.mistakes)]  # fmt: skip
        return head + self.warnings


@dataclass(frozen=True)
class SimEvent:
    """A state change: created (value: the CPU's dose after it) or cleared (CPUs cleared)."""

    kind: str
    ts_ns: int
    vcpu: int
    value: int
    vaddr: int


@dataclass
class SimLog:
    """The whole log: the model it ran, its events and the per-vCPU totals."""

    model: str  # name@hash
    events: list[SimEvent] = field(default_factory=list)
    vcpus: dict[int, dict[str, int]] = field(default_factory=dict)
    complete: bool = False
    pay_at: dict[str, int] = field(default_factory=dict)  # IRQ entry symbol -> address
    responder_cpus: tuple[int, ...] = ()  # the only vCPUs that pay as responders (): all
    cpu_entry: CpuEntry | None = None  # None: not asked for

    def power_ons(self, vcpu: int | None = None) -> list[SimEvent]:
        """The `cpu-on` events (of one vCPU, or all): CPUs entering after CPU_ON."""
        return [e for e in self.events if e.kind == "cpu-on" and vcpu in (None, e.vcpu)]

    def total(self, key: str) -> int:
        """A per-vCPU total summed over every vCPU."""
        return sum(v[key] for v in self.vcpus.values())

    def summary(self) -> str:
        """One line: what was created, cleared, injected, and where it landed."""
        if not self.complete:
            return f"simulation {self.model}: log NOT complete (QEMU did not exit normally)"
        landed = ", ".join(
            f"vCPU {v}: {c['delayed']} delays, {c['actual_ns'] / 1e6:.1f} ms"
            f" (asked {c['injected_ns'] / 1e6:.1f}), waited {c['waited_ns'] / 1e6:.1f} ms"
            + _responder_text(c)
            for v, c in sorted(self.vcpus.items())
        )
        only = ",".join(str(v) for v in self.responder_cpus)
        return (
            f"simulation {self.model}: {self.total('creates')} creates,"
            f" {self.total('clears')} clears"
            + (f"; responders: CPU {only} only" if only else "")
            + self._entry_text()
            + f"; {landed}"
        )

    def _entry_text(self) -> str:
        """The power-ons seen, and where, or that the entry was never found."""
        if self.cpu_entry is None:
            return ""
        entry = self.cpu_entry
        if entry.symbol == "unresolved":
            return f"; CPU entry NOT found (Image at {entry.text_pa:#x}): power-ons unseen"
        ons = self.power_ons()
        cleared = sum(e.value for e in ons)
        return (
            f"; {len(ons)} power-ons seen at {entry.symbol} {entry.pa:#x} ({cleared} cleared;"
            f" from {entry.anchor} at {entry.anchor_pa():#x})"
        )


def _responder_text(c: dict[str, int]) -> str:
    """A vCPU's payments as a responder, or nothing when it made none."""
    spared = f", {c['spared']} completions spared while awake" if c["spared"] else ""
    if not c["pays"]:
        return f"; as responder nothing paid{spared}" if spared else ""
    return (
        f"; as responder {c['pays']} IRQ entries paid for {c['owed']} completions"
        f" ({c['wakes']} wake-ups from WFI{spared}):"
        f" asked {c['asked_ns'] / 1e6:.1f} ms, capped to {c['paid_ns'] / 1e6:.1f},"
        f" took {c['paid_actual_ns'] / 1e6:.1f}"
    )


def _event(words: list[str], origin: str) -> SimEvent:
    """One event line."""
    try:
        return SimEvent(words[0], int(words[1]), int(words[2]), int(words[3]), int(words[4], 16))
    except (IndexError, ValueError):
        raise TracekitError(f"{origin}: bad event line {' '.join(words)!r}") from None


def _cpus(words: list[str], origin: str) -> tuple[int, ...]:
    """The vCPUs of a `responder-cpus N...` line."""
    try:
        return tuple(int(w) for w in words[1:])
    except ValueError:
        raise TracekitError(f"{origin}: bad line {' '.join(words)!r}") from None


def _cpu_entry(words: list[str], version: int, origin: str) -> CpuEntry:
    """A `cpu-entry-at SYMBOL PA TEXT_PA STEXT_PA ANCHOR` line (format 5: the first three)."""
    try:
        if version == 5 and len(words) == 4:
            anchor = "none" if words[1] == "unresolved" else "_text"
            return CpuEntry(words[1], int(words[2], 16), int(words[3], 16), 0, anchor)
        if version > 5 and len(words) == 6 and words[5] in ("_text", "_stext", "none"):
            pa, text_pa, stext_pa = (int(w, 16) for w in words[2:5])
            return CpuEntry(words[1], pa, text_pa, stext_pa, words[5])
    except ValueError:
        pass
    raise TracekitError(f"{origin}: bad line {' '.join(words)!r}")


def cpu_entry_mistakes(log: SimLog, iomem: str, symbols: dict[str, int]) -> list[str]:
    """Why the CPU entry the plugin watched is not where the boot's kernel enters, one line
    each ([]: it is).

    `iomem`: the boot's /proc/iomem (read as root); `symbols`: its kallsyms, name ->
    address (the first of each name, as the plugin takes it). From the anchor the plugin
    used (_text at the Image's load address, or _stext at the load address + the Image's
    BaseOfCode), "Kernel code" must end where __init_begin puts it (setup.c:
    `__pa_symbol(__init_begin - 1)` on 6.1 and 6.12, exact on both), start where a code
    start symbol does (on 6.1 only _stext is listed: exact), and hold the entry, which
    must lie as far above the anchor as secondary_entry does."""
    if log.cpu_entry is None:
        return ["the log has no cpu-entry-at line: the plugin never watched a CPU entry"]
    entry = log.cpu_entry
    if entry.symbol == "unresolved":
        return [_unresolved_reason(entry, symbols, log.pay_at)]
    code = _kernel_code(iomem)
    if code is None:
        return ["/proc/iomem has no Kernel code line with an address (read it as root)"]
    anchor = symbols.get(entry.anchor)
    if anchor is None:
        return [f"the boot's kallsyms has no {entry.anchor}, the plugin's anchor"]
    base = entry.anchor_pa()
    start, end = code
    where = {s: base + symbols[s] - anchor for s in CODE_START_SYMBOLS if s in symbols}
    mistakes = []
    if start not in where.values():
        mistakes.append(
            f"Kernel code starts at {start:#x}, not where {entry.anchor} at {base:#x} "
            f"puts {'/'.join(where)}"
        )
    if INIT_BEGIN in symbols and end + 1 != base + symbols[INIT_BEGIN] - anchor:
        mistakes.append(
            f"Kernel code ends at {end:#x}, not below where {entry.anchor} at {base:#x} "
            f"puts {INIT_BEGIN}"
        )
    if entry.symbol in symbols and entry.pa != base + symbols[entry.symbol] - anchor:
        mistakes.append(
            f"{entry.symbol} at {entry.pa:#x} is not {entry.anchor}'s PA + "
            f"({entry.symbol} - {entry.anchor})"
        )
    if not start <= entry.pa <= end:
        mistakes.append(f"{entry.symbol} at {entry.pa:#x} is outside Kernel code")
    return mistakes


def power_on_mistakes(log: SimLog, boot_dmesg: str | None, dmesg: str | None) -> list[str]:
    """Where the power-ons the plugin saw at the CPU entry are not the kernel's, one line
    per vCPU ([]: each one seen; or nothing to count, which power_on_warnings says).

    `boot_dmesg`: the kernel log before the command (/init's, vhost-boot-dmesg.txt);
    `dmesg`: after it (vhost-dmesg.txt). Each "Booted secondary processor" line of the
    second beyond the first is one bring-up during the command, after its entry through
    secondary_entry; the plugin watches from the first clock marker on, after /init,
    so the boot's own secondaries are in both logs and in neither count."""
    entry = log.cpu_entry
    if entry is None or entry.symbol == "unresolved" or boot_dmesg is None or dmesg is None:
        return []  # never watched (a mistake of its own), or nothing to count by
    if power_on_warnings(log, boot_dmesg, dmesg):
        return []
    booted = _booted(dmesg) - _booted(boot_dmesg)
    seen = Counter(qemu_mpidr(e.vcpu) for e in log.power_ons())
    failed = len(FAILED_TO_COME_ONLINE.findall(dmesg)) - len(
        FAILED_TO_COME_ONLINE.findall(boot_dmesg)
    )
    why = f"; dmesg has {failed} 'failed to come online'" if failed else ""
    return [
        f"the kernel brought vCPU {qemu_vcpu(mpidr)} (MPIDR {mpidr:#x}) up {booted[mpidr]}"
        f" time(s) during the command (its 'Booted secondary processor' lines), the plugin"
        f" saw {seen[mpidr]} entries at {entry.symbol}{why}"
        for mpidr in sorted(set(booted) | set(seen))
        if booted[mpidr] != seen[mpidr]
    ]


def kernel_power_ons(boot_dmesg: str, dmesg: str) -> int:
    """How many times the kernel brought a secondary up during the command (the
    "Booted secondary processor" lines of `dmesg` beyond `boot_dmesg`'s)."""
    return (_booted(dmesg) - _booted(boot_dmesg)).total()


def power_on_warnings(log: SimLog, boot_dmesg: str | None, dmesg: str | None) -> list[str]:
    """Why the power-ons seen could not be counted against the kernel's log, or nothing
    (nothing either where the entry was never found: that is a mistake of its own)."""
    if log.cpu_entry is None or log.cpu_entry.symbol == "unresolved":
        return []
    head = "power-ons not counted against the kernel's log"
    missing = [when for when, text in (("before", boot_dmesg), ("after", dmesg)) if text is None]
    if missing:
        return [f"{head}: it has none from {' or '.join(missing)} the command (a bundle from "
                "before it was kept)"]  # fmt: skip
    if not _whole(boot_dmesg or "") or not _whole(dmesg or ""):
        return [f"{head}: its dmesg does not start with 'Booting Linux' (the buffer wrapped)"]
    return []


def _whole(dmesg: str) -> bool:
    """Whether a dmesg copy holds the whole boot: its first line is the boot CPU's."""
    return BOOTING_LINUX.search(dmesg.lstrip().partition("\n")[0]) is not None


def _booted(dmesg: str) -> Counter[int]:
    """MPIDR (Aff3-0) -> how many "Booted secondary processor" lines name it."""
    return Counter(int(m, 16) & 0xFF_00FF_FFFF for _, m in BOOTED_SECONDARY.findall(dmesg))


def cpu_entry_warnings(log: SimLog, symbols: dict[str, int]) -> list[str]:
    """What disagrees without making the watched entry wrong, or a check that could not
    run: the end check without __init_begin in kallsyms (6.12's start check alone leaves a
    64 KiB blind spot); the anchor the plugin did not use (STEXT_PA where it anchored on
    _text) against kallsyms' _stext - _text."""
    entry = log.cpu_entry
    if entry is None or entry.symbol == "unresolved":
        return []
    unchecked = [] if INIT_BEGIN in symbols else [
        f"kallsyms has no {INIT_BEGIN}: Kernel code's end was not checked, only its start"
    ]  # fmt: skip
    if entry.anchor != "_text" or not entry.stext_pa:
        return unchecked
    if "_text" not in symbols or "_stext" not in symbols:
        return unchecked
    if entry.stext_pa - entry.text_pa == symbols["_stext"] - symbols["_text"]:
        return unchecked
    return [
        *unchecked,
        f"the Image's BaseOfCode puts _stext at {entry.stext_pa:#x}, not _text's PA + "
        "(_stext - _text): a kernel without _text in kallsyms would be watched in the wrong "
        "place",
    ]


def _unresolved_reason(entry: CpuEntry, symbols: dict[str, int], pay_at: dict[str, int]) -> str:
    """Why the plugin found no entry, as far as its log and the boot's kallsyms tell: the
    plugin watches nothing until the IRQ entries resolve too (tksim.c), so an IRQ entry
    never found, or no clock marker at all, leaves it unresolved whatever kallsyms holds."""
    where = f"(Image at {entry.text_pa:#x})"
    if "unresolved" in pay_at:
        return (
            f"no clock marker ran, so the plugin read no kallsyms and watched no CPU entry {where}"
        )
    if missing := [name for name, address in pay_at.items() if not address]:
        return (
            f"the plugin never found the IRQ entries {', '.join(missing)} in kallsyms, so it "
            f"watched nothing, no CPU entry either {where}"
        )
    if symbols and not any(s in symbols for s in CODE_START_SYMBOLS):
        return f"the plugin never found the CPU entry {where}: kallsyms has neither anchor"
    if symbols and CPU_ENTRY_SYMBOL not in symbols:
        return (
            f"the plugin never found the CPU entry {where}: kallsyms does not list "
            f"{CPU_ENTRY_SYMBOL} (a kernel without CONFIG_KALLSYMS_ALL whose idmap text lies "
            "outside _stext.._etext, in 6.12's .rodata.text: e.g. tracekit's trixie:tk-ci); "
            "cpu-on cannot be watched on this kernel"
        )
    return f"the plugin never found the CPU entry {where}"


def _kernel_code(iomem: str) -> tuple[int, int] | None:
    """The first "Kernel code" range of /proc/iomem (None: none, or zeros without root)."""
    for line in iomem.splitlines():
        span, _, name = line.strip().partition(" : ")
        if name.strip() == "Kernel code":
            lo, _, hi = span.partition("-")
            try:
                start, end = int(lo, 16), int(hi, 16)
            except ValueError:
                return None
            return (start, end) if start else None
    return None


def parse_sim_log(text: str, origin: str = SIM_LOG) -> SimLog:
    """A SimLog from the log's text; one clear line if it is not one."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if (
        len(lines) < 2
        or lines[0] not in [["tksim-log", f] for f in FORMATS]
        or (lines[1][0] != "model")
    ):
        raise TracekitError(
            f"{origin}: not a simulation log of format 1 to {FORMATS[-1]} (tksim.c)"
        )
    version = int(lines[0][1])
    keys = set(VCPU_KEYS) | (set(RESPONDER_KEYS) if version >= 2 else set())
    keys |= set(WAKE_KEYS) if version >= 3 else set()
    keys |= set(ENTRY_KEYS) if version >= 5 else set()
    log = SimLog(model="@".join(lines[1][1:3]))
    for words in lines[2:]:
        if words[0] in EVENTS:
            log.events.append(_event(words, origin))
        elif words[0] == "vcpu":
            pairs = dict(zip(words[2::2], words[3::2], strict=False))
            if set(pairs) != keys:
                raise TracekitError(f"{origin}: bad vcpu line {' '.join(words)!r}")
            totals = dict.fromkeys(RESPONDER_KEYS + WAKE_KEYS + ENTRY_KEYS, 0)
            log.vcpus[int(words[1])] = totals | {k: int(v) for k, v in pairs.items()}
        elif words[0] == "pay-at" and len(words) == 3:
            log.pay_at[words[1]] = int(words[2], 16)
        elif words[0] == "cpu-entry-at" and version >= 5:
            log.cpu_entry = _cpu_entry(words, version, origin)
        elif words[0] == "responder-cpus" and version >= 4:
            log.responder_cpus = _cpus(words, origin)
        elif words == ["complete", "1"]:
            log.complete = True
        elif words[0] != "clock":
            raise TracekitError(f"{origin}: unknown line {' '.join(words)!r}")
    return log


def read_sim_log(path: Path) -> SimLog:
    """The simulation log at `path`."""
    try:
        return parse_sim_log(path.read_text(), str(path))
    except OSError as exc:
        raise TracekitError(f"cannot read {path}: {exc.strerror}") from None
