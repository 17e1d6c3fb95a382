"""A simulated mechanism: the TOML model, its validation and the plugin's form of it.

The model is read and checked here, every mistake one line; the plugin gets a flat
text form (`plugin_form`) of only what it applies, written by this module. Standard
library only (tomllib): the emulated host's collector imports it.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.errors import TracekitError

if TYPE_CHECKING:
    from tracekit.vhost.qemu import ImageLoad

FORMAT = 1
PLUGIN_FORMAT = 6  # reproducer/groundtruth/tksim.h, TKSIM_FORMAT
# The guest image's range (tracekit.guests.RAM_BASE .. LOAD_LIMIT): the SCTLR trigger
# fires only for code there, so the host kernel's own SCTLR_EL1 writes never count.
GUEST_WINDOW = (0x40000000, 0x40100000)

# What every output made under a model says beside the emulated-host warning.
SIMULATED_NOTE = (
    "SIMULATED EFFECT: a modelled mechanism was injected into the emulated machine by "
    "the TCG plugin; what it shows tests tracekit's inference, never the hardware"
)

# Trigger -> (what the plugin sees, instruction or marker).
TRIGGERS = {
    "sctlr-write": (
        "instruction",
        "MSR SCTLR_EL1 executed at the guest image's addresses (0x40000000-0x400fffff): "
        "any write, the plugin cannot read the value (QEMU 7.2), so MMU off again "
        "(mmu_off) writes too; the MMU-off guests write none",
    ),
    "mmu-on-marker": (
        "marker",
        "HINT #0x76, which the parametric guest (revision >= 3) runs right after its "
        "SCTLR_EL1 write turned the MMU on: tracekit's own marker, not the machine's act",
    ),
    "none": ("nothing", "nothing creates the state (a null model)"),
}
# Clearing action -> what the plugin sees.
CLEARS = {
    "alle1-local": "TLBI ALLE1 (local, EL2-only) executed on the holding CPU clears that CPU",
    "alle1is": "TLBI ALLE1IS/OS executed on any CPU clears every CPU",
    "vmid-rollover": (
        "KVM's rollover flush, __kvm_flush_vm_context: TLBI ALLE1IS at EL2; the plugin "
        "sees the instruction, so this is alle1is under another name"
    ),
    "cpu-on": (
        "a power cycle: the kernel's CPU entry after PSCI CPU_ON (secondary_entry, run with "
        "the MMU off, so seen at its physical address) executed on a CPU clears that CPU"
    ),
}
# Where a CPU powered on by PSCI CPU_ON enters the kernel: arch/arm64/kernel/psci.c
# cpu_psci_cpu_boot passes __pa_symbol(secondary_entry) (6.1.176 and 6.12.117, :41-42).
# The plugin finds it at the Image's load address + (secondary_entry - _text), both
# from the boot's kallsyms, so it needs that file and the load address (`plugin_form`).
CPU_ENTRY_SYMBOL = "secondary_entry"
WHERE = ("every", "holder")
# Who pays for a broadcast completion: the CPU that issued it (at its DSB), the other
# CPUs (responders, at their next IRQ entry), or both.
ON = ("issuer", "responders", "all")
# Where responders pay: the host kernel's IRQ handlers, entered on every wake-up path
# (arch/arm64/kernel/entry-common.c; the vectors themselves differ with Spectre-BHB and
# KPTI trampolines, the C handlers do not). Their addresses come from the boot's
# kallsyms (KASLR), which the plugin reads at the first clock marker.
IRQ_ENTRY_SYMBOLS = ("el1h_64_irq_handler", "el0t_64_irq_handler")
# When a responder pays: only at an IRQ entry that wakes it from WFI (the completions that
# came while it slept), or at every IRQ entry (a busy CPU's ticks and IPIs too).
PAY_WHEN = ("wake", "irq")
# Which CPUs pay as responders: every CPU but the issuer, the CPUs the emulated host's
# kernel command line isolates (isolcpus=: the rt CPU whose wake-ups the brief measures),
# or a list of CPU numbers (vCPU index = Linux CPU on the emulated host).
RESPONDERS = ("others", "isolated")
_RESPONDER_KEYS = ("responder_ns", "window_ns", "cap_ns")
KVM_MODES = ("nvhe", "vhe", "protected")
_KEYS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "": {"format": int, "name": str, "summary": str, "create": dict, "clear": dict, "cost": dict},
    "create": {"trigger": str, "kvm_modes": list, "dose_max": int},
    "clear": {"by": list},
    "cost": {
        "where": str,
        "fixed_ns": int,
        "per_dose_ns": int,
        "on": str,
        "responder_ns": int,
        "window_ns": int,
        "cap_ns": int,
        "pay_when": str,
        "responders": (str, list),
    },
}
_REQUIRED = {
    "": ("format", "name", "summary", "create", "clear", "cost"),
    "create": ("trigger",),
    "clear": ("by",),
    "cost": ("where", "fixed_ns"),
}
# Bounds that keep a model runnable: a delay on every broadcast above 10 ms stalls boots.
MAX_COST_NS = 10_000_000
# A responder's payment is one busy wait at an IRQ entry: at most 1 s, however much it owes.
MAX_RESPONDER_NS = 1_000_000_000
MAX_DOSE = 1 << 20
MAX_VCPUS = 256  # tksim.h, TKSIM_MAX_VCPUS


@dataclass(frozen=True)
class Model:
    """A validated simulated mechanism."""

    name: str
    summary: str
    trigger: str
    kvm_modes: tuple[str, ...]  # where the mechanism exists; elsewhere nothing is created
    dose_max: int  # each trigger on a CPU adds one dose, up to this
    clears: tuple[str, ...]  # () : nothing clears it
    where: str  # every CPU's broadcasts pay, or the holding CPU's only
    fixed_ns: int
    per_dose_ns: int
    digest: str  # sha256 of the model's canonical JSON, first 16 hex digits
    on: str = "issuer"  # issuer, responders or all: who pays for a completion
    responder_ns: int = 0  # each responder, per completion it owes, at its IRQ entry
    window_ns: int = 0  # only completions this recent are owed
    cap_ns: int = 0  # at most this per IRQ entry
    pay_when: str = "irq"  # wake: only IRQ entries after a WFI pay; irq: every IRQ entry
    responders: str | tuple[int, ...] = "others"  # others, isolated, or these CPUs pay

    @property
    def label(self) -> str:
        """name@hash: what manifests, conditions and reports carry."""
        return f"{self.name}@{self.digest}"

    @property
    def trigger_kind(self) -> str:
        """instruction, marker or nothing: how real the creating event is."""
        return TRIGGERS[self.trigger][0]

    def clears_by(self, action: str) -> bool:
        """Whether this plugin-level action (alle1-local, alle1is) clears the state."""
        if action == "alle1is":
            return "alle1is" in self.clears or "vmid-rollover" in self.clears
        return action in self.clears

    def cost_ns(self, dose: int) -> int:
        """Extra ns the issuer pays on one broadcast's completion for a dose (its CPU's,
        or the sum); 0 when only responders pay."""
        if not dose or self.on == "responders":
            return 0
        return self.fixed_ns + self.per_dose_ns * min(dose, self.dose_max)

    def responder_cost_ns(self, owed: int) -> int:
        """What one IRQ entry of another CPU pays for `owed` recent completions (capped)."""
        return min(owed * self.responder_ns, self.cap_ns) if self.on != "issuer" else 0

    @property
    def costs_anything(self) -> bool:
        """Whether holding the state costs any CPU time at all."""
        return self.cost_ns(1) > 0 or self.responder_cost_ns(1) > 0


def _type_name(kind: type | tuple[type, ...]) -> str:
    """'integer', 'string', ... as TOML says it."""
    names = {int: "an integer", str: "a string", list: "a list", dict: "a table"}
    return names[kind] if isinstance(kind, type) else " or ".join(names[k] for k in kind)


def _shape_mistakes(raw: dict[str, Any]) -> list[str]:
    """Unknown keys, missing keys and wrong types, one line each."""
    mistakes = []
    for table, keys in _KEYS.items():
        data = raw if not table else raw.get(table)
        if not isinstance(data, dict):
            continue
        where = f"[{table}] " if table else ""
        for key in data:
            if key not in keys:
                mistakes.append(f"{where}{key}: unknown key (known: {', '.join(keys)})")
        for key in _REQUIRED[table]:
            if key not in data:
                mistakes.append(f"{where}{key}: missing")
        for key, kind in keys.items():
            value = data.get(key)
            # bool is an int in Python; a TOML true is never a count.
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                mistakes.append(f"{where}{key}: must be {_type_name(kind)}, not {value!r}")
    return mistakes


def _value_mistakes(raw: dict[str, Any]) -> list[str]:
    """Values outside what the plugin can apply, one line each."""
    mistakes = []
    create, clear, cost = raw["create"], raw["clear"], raw["cost"]
    if raw["format"] != FORMAT:
        mistakes.append(f"format: {raw['format']} is not {FORMAT}, the only model format")
    if not raw["name"] or not all(c.isalnum() or c in "-_." for c in raw["name"]):
        mistakes.append(f"name: {raw['name']!r} must be letters, digits, '-', '_' or '.'")
    if create["trigger"] not in TRIGGERS:
        mistakes.append(
            f"[create] trigger: {create['trigger']!r}; use one of: {', '.join(TRIGGERS)}"
        )
    for mode in create.get("kvm_modes", []):
        if mode not in KVM_MODES:
            mistakes.append(f"[create] kvm_modes: {mode!r}; use any of: {', '.join(KVM_MODES)}")
    if not 1 <= create.get("dose_max", 1) <= MAX_DOSE:
        mistakes.append(f"[create] dose_max: must be 1..{MAX_DOSE}")
    for action in clear["by"]:
        if action not in CLEARS and action != "nothing":
            mistakes.append(
                f"[clear] by: {action!r}; use any of: {', '.join(CLEARS)}, or ['nothing']"
            )
    if "nothing" in clear["by"] and len(clear["by"]) > 1:
        mistakes.append("[clear] by: 'nothing' cannot go with a clearing action")
    if cost["where"] not in WHERE:
        mistakes.append(f"[cost] where: {cost['where']!r}; use one of: {', '.join(WHERE)}")
    for key in ("fixed_ns", "per_dose_ns"):
        if not 0 <= cost.get(key, 0) <= MAX_COST_NS:
            mistakes.append(f"[cost] {key}: must be 0..{MAX_COST_NS} ns")
    return mistakes + _responder_mistakes(cost)


def _responder_mistakes(cost: dict[str, Any]) -> list[str]:
    """The responders' keys: all three with on = responders/all, none with issuer."""
    on = cost.get("on", "issuer")
    if on not in ON:
        return [f"[cost] on: {on!r}; use one of: {', '.join(ON)}"]
    given = [k for k in _RESPONDER_KEYS if k in cost]
    if on == "issuer":
        given += [k for k in ("pay_when", "responders") if k in cost]
        return [f"[cost] {k}: only with on = 'responders' or 'all'" for k in given]
    mistakes = [f"[cost] {k}: missing (on = {on!r})" for k in _RESPONDER_KEYS if k not in given]
    if cost.get("pay_when", "irq") not in PAY_WHEN:
        mistakes.append(f"[cost] pay_when: {cost['pay_when']!r}; use one of: {', '.join(PAY_WHEN)}")
    mistakes += _responders_mistakes(cost.get("responders", "others"))
    for key in given:
        if not 0 <= cost[key] <= MAX_RESPONDER_NS:
            mistakes.append(f"[cost] {key}: must be 0..{MAX_RESPONDER_NS} ns")
    if not mistakes and cost["cap_ns"] < cost["responder_ns"]:
        mistakes.append("[cost] cap_ns: below responder_ns, so no completion is paid in full")
    return mistakes


def _responders_mistakes(responders: str | list[Any]) -> list[str]:
    """[cost] responders: a known word, or a non-empty list of distinct CPU numbers."""
    if isinstance(responders, str):
        if responders in RESPONDERS:
            return []
        return [f"[cost] responders: {responders!r}; use {' or '.join(RESPONDERS)}, or CPUs"]
    good = all(isinstance(c, int) and not isinstance(c, bool) for c in responders)
    if not responders or not good or len(set(responders)) < len(responders):
        return ["[cost] responders: a list must hold distinct CPU numbers, e.g. [3]"]
    if not all(0 <= c < MAX_VCPUS for c in responders):
        return [f"[cost] responders: CPU numbers must be 0..{MAX_VCPUS - 1}"]
    return []


def parse_model(text: str, origin: str) -> Model:
    """A model from TOML text; every mistake is one line of the error."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TracekitError(f"{origin}: not TOML: {exc}") from None
    mistakes = _shape_mistakes(raw)
    if not mistakes:
        mistakes = _value_mistakes(raw)
    if mistakes:
        lines = "\n".join(f"{origin}: {m}" for m in mistakes)
        raise TracekitError(f"{lines}\n(docs/simulate.md says how a model is written)")
    create, cost = raw["create"], raw["cost"]
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    return Model(
        name=raw["name"],
        summary=raw["summary"],
        trigger=create["trigger"],
        kvm_modes=tuple(create.get("kvm_modes", KVM_MODES)),
        dose_max=create.get("dose_max", 1),
        clears=tuple(a for a in raw["clear"]["by"] if a != "nothing"),
        where=cost["where"],
        fixed_ns=cost["fixed_ns"],
        per_dose_ns=cost.get("per_dose_ns", 0),
        digest=hashlib.sha256(canonical.encode()).hexdigest()[:16],
        on=cost.get("on", "issuer"),
        pay_when=cost.get("pay_when", "irq"),
        responders=_responders_of(cost.get("responders", "others")),
        **{key: cost.get(key, 0) for key in _RESPONDER_KEYS},
    )


def _responders_of(value: str | list[int]) -> str | tuple[int, ...]:
    """The model's responders: the word, or the CPUs in order."""
    return value if isinstance(value, str) else tuple(sorted(value))


def shipped_models() -> list[str]:
    """The names of the models in the package (tracekit/simulate/models/)."""
    folder = resources.files("tracekit.simulate") / "models"
    return sorted(
        p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")
    )


def model_source(spec: str) -> str:
    """The TOML text of a shipped model by name, or of a model file by path."""
    path = Path(spec)
    if spec.endswith(".toml") or path.is_file():
        try:
            return path.read_text()
        except OSError as exc:
            raise TracekitError(f"cannot read the model {path}: {exc.strerror}") from None
    if spec not in shipped_models():
        raise TracekitError(
            f"no model {spec!r}: give a .toml file or a shipped model "
            f"({', '.join(shipped_models())})"
        )
    return (resources.files("tracekit.simulate") / "models" / f"{spec}.toml").read_text()


def load_model(spec: str) -> Model:
    """A shipped model by name, or a model file by path."""
    origin = spec if spec.endswith(".toml") or Path(spec).is_file() else f"{spec}.toml"
    return parse_model(model_source(spec), origin)


def plugin_form(
    model: Model,
    kvm_mode: str,
    kallsyms: Path | None = None,
    isolated: Sequence[int] = (),
    load: ImageLoad | None = None,
) -> str:
    """The flat form the plugin reads (tksim.c): only what it applies, for this boot's mode.

    `kallsyms`: where the boot's kallsyms will be (responders pay at the IRQ entries
    named there); a model whose responders pay needs it. `isolated`: the CPUs the boot's
    command line isolates (isolcpus=), the responders of `responders = "isolated"`.
    `load`: where QEMU loaded the kernel Image (tracekit.vhost.qemu.image_load);
    with `kallsyms`, the plugin logs every CPU's entry after CPU_ON for a model cleared by
    `cpu-on` (which needs both) or whose responders pay (_cpu_entry_lines)."""
    lines = [f"tksim {PLUGIN_FORMAT}", f"model {model.name} {model.digest}"]
    if model.trigger == "sctlr-write" and kvm_mode in model.kvm_modes:
        lines.append(f"create sctlr {GUEST_WINDOW[0]:#x} {GUEST_WINDOW[1]:#x}")
    elif model.trigger == "mmu-on-marker" and kvm_mode in model.kvm_modes:
        lines.append("create mark")
    else:
        lines.append(f"# nothing creates the state ({model.trigger}, KVM {kvm_mode})")
        lines.append("create none")
    if model.clears_by("alle1-local"):
        lines.append("clear alle1-local")
    if model.clears_by("alle1is"):
        lines.append("clear alle1is")
    lines += _cpu_entry_lines(model, kallsyms, load)
    lines += [
        f"scope {model.where}",
        f"pay {model.on}",
        f"fixed_ns {model.fixed_ns}",
        f"per_dose_ns {model.per_dose_ns}",
        f"dose_max {model.dose_max}",
    ]
    if model.on != "issuer":
        if not _usable(kallsyms):
            raise TracekitError(
                f"model {model.label}: its responders pay at the kernel's IRQ entry, which "
                "needs the boot's kallsyms: run it under `tracekit vhost run`"
            )
        lines += [f"{key} {getattr(model, key)}" for key in _RESPONDER_KEYS]
        lines.append(f"pay-when {model.pay_when}")
        lines += _responder_cpus_line(model, isolated)
        lines.append(f"irq-entry {kallsyms} {' '.join(IRQ_ENTRY_SYMBOLS)}")
    return "\n".join(lines) + "\n"


def _usable(kallsyms: Path | None) -> bool:
    """Whether the plugin can be given this kallsyms path (one word of its form)."""
    return kallsyms is not None and not any(c.isspace() for c in str(kallsyms))


def _cpu_entry_lines(model: Model, kallsyms: Path | None, load: ImageLoad | None) -> list[str]:
    """`clear cpu-on` and `cpu-entry KALLSYMS TEXT_PA STEXT_PA SYMBOL`, where the boot says."""
    clears = model.clears_by("cpu-on")
    # Only where the plugin reads the boot's kallsyms anyway (responders pay at the IRQ
    # entries) or needs the entry: resolving it reads the whole kallsyms inside a clock
    # marker's callback, and a null or issuer-only boot's markers stay as they were (CI's
    # nvhe-a53 null boot lost its clock fit to those reads in session 14).
    if not clears and model.on == "issuer":
        return []
    if load is None or not _usable(kallsyms):
        if clears:
            raise TracekitError(
                f"model {model.label}: a power cycle clears it, seen at the kernel's CPU "
                "entry, which needs the boot's kallsyms and the Image's load address: run "
                "it under `tracekit vhost run`"
            )
        return []
    entry = f"cpu-entry {kallsyms} {load.text_pa:#x} {load.stext_pa:#x} {CPU_ENTRY_SYMBOL}"
    return ["clear cpu-on", entry] if clears else [entry]


def _responder_cpus_line(model: Model, isolated: Sequence[int]) -> list[str]:
    """`responder-cpus N...` when only some CPUs pay (none: every CPU but the issuer)."""
    if model.responders == "others":
        return []
    cpus = tuple(isolated) if model.responders == "isolated" else model.responders
    if not cpus:
        raise TracekitError(
            f"model {model.label}: its responders are the isolated CPUs, and the emulated "
            "host's command line isolates none: add e.g. --append 'isolcpus=3'"
        )
    return [f"responder-cpus {' '.join(str(c) for c in cpus)}"]
