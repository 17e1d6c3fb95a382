"""The expected invalidation signatures (gtsignatures.toml, package data), parsed and
checked: one error line per mistake, naming the entry and the field.

The file is part of the package, read like a constant (once); parse_signatures is the
pure part, so tests give it text of their own.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from tracekit.errors import TracekitError

SIGNATURE_FILE = "gtsignatures.toml"
# A VM's steps and every after-guest action: tracekit.host.protocol.AFTER_GUEST_ACTIONS
# but none, which analysis/ may not import (tests/test_analysis_groundtruth.py holds the
# two together); the debug series' tlbi: actions are host/afterguest.py TLBI_ACTIONS.
ACTION_STEPS = ("hotplug", "hotplug-other", "rollover", "rollover-minus-one")
TLBI_STEPS = ("tlbi:alle1@guest-cpu", "tlbi:vmalls12e1is@vmid", "tlbi:alle1@other-cpu")
STEPS = ("create", "run", "teardown", *ACTION_STEPS, *TLBI_STEPS)
WATCHES = ("hyp", "kvm")
KVM_MODES = ("nvhe", "vhe", "protected")
CPU_ROLES = ("online", "guest", "target", "any")
# The conditions a signature can require (`requires`): a VM step's own vcpus, else the
# bundle's condition field (tracekit.analysis.conditions.Condition) of that name.
REQUIRE_FIELDS = (
    "vcpus",
    "backing",
    "scenario",
    "variant",
    "after_guest",
    "repeat_tlbi",
    "enable_virt_at_load",
)
# Conditions a kernel series does not have: its bundles record them "absent", so a
# `requires` on one could never be met and the step would silently go unchecked.
SERIES_LACKS = {"6.1": ("enable_virt_at_load",)}
_OPTIONAL = {"cpu_models", "requires"}
_FIELDS = {
    "kernel",
    "kvm_mode",
    "cpu_models",
    "requires",
    "step",
    "watch",
    "exact",
    "when",
    "expect",
    "rests_on",
}
_EXPECT_FIELDS = {"operation", "function", "cpus", "count"}


@dataclass(frozen=True)
class Expect:
    """One invalidation a step must execute: count per CPU of the role (or in total)."""

    operation: str
    function: str
    cpus: str
    count: int


@dataclass(frozen=True)
class Signature:
    """What one step executes on one kernel series, KVM mode and set of CPU models."""

    kernel: str
    kvm_mode: str
    cpu_models: tuple[str, ...]
    step: str
    watch: str
    exact: bool
    when: str
    expect: tuple[Expect, ...]
    rests_on: tuple[str, ...]
    # (condition, allowed values as text): outside them the step is not checked.
    requires: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def summary(self) -> str:
        """One line: the step and what it should execute."""
        if not self.expect:
            said = "no watched invalidation"
        else:
            said = ", ".join(
                f"{e.operation} x{e.count} ({e.function}, {e.cpus})" for e in self.expect
            )
        return f"{self.step}: {said}" + ("" if self.exact else " (others not checked)")


@dataclass(frozen=True)
class Signatures:
    """Every signature, and the host-kernel functions that count as KVM's."""

    entries: tuple[Signature, ...]
    host_functions: tuple[str, ...]
    # kprobe function -> the functions whose invalidations its path stands for.
    probe_paths: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def candidates(self, series: str, kvm_mode: str, cpu_model: str, step: str) -> list[Signature]:
        """The signatures of a step on this kernel series, KVM mode and CPU model, in file
        order (several when they differ in `requires`, e.g. per erratum state)."""
        return [
            entry
            for entry in self.entries
            if (entry.kernel, entry.kvm_mode, entry.step) == (series, kvm_mode, step)
            and (not entry.cpu_models or cpu_model in entry.cpu_models)
        ]

    def find(self, series: str, kvm_mode: str, cpu_model: str, step: str) -> Signature | None:
        """The first signature of a step on this kernel series, KVM mode and CPU model."""
        found = self.candidates(series, kvm_mode, cpu_model, step)
        return found[0] if found else None


def kernel_series(release: str) -> str:
    """'6.1' of '6.1.0-50-arm64', '6.12' of '6.12.117+deb13-arm64'."""
    return ".".join(release.split("-")[0].split("+")[0].split(".")[:2])


def _problems_of(number: int, raw: object) -> list[str]:
    """What is wrong with one [[signature]] table (empty: nothing)."""
    where = f"signature {number}"
    if not isinstance(raw, dict):
        return [f"{where}: not a table"]
    bad = [f"{where}: unknown field {name!r}" for name in sorted(set(raw) - _FIELDS)]
    for name in sorted(_FIELDS - _OPTIONAL - set(raw)):
        bad.append(f"{where}: no {name!r}")
    checks = (
        ("step", STEPS),
        ("watch", WATCHES),
        ("kvm_mode", KVM_MODES),
    )
    for name, allowed in checks:
        if name in raw and raw[name] not in allowed:
            bad.append(f"{where}: {name} {raw[name]!r} is not one of {', '.join(allowed)}")
    bad += _requires_problems(where, raw.get("requires", {}))
    bad += _series_problems(where, raw)
    if "exact" in raw and not isinstance(raw["exact"], bool):
        bad.append(f"{where}: exact must be true or false")
    if "rests_on" in raw and (not isinstance(raw["rests_on"], list) or not raw["rests_on"]):
        bad.append(f"{where}: rests_on must list what the signature rests on")
    for index, item in enumerate(
        raw.get("expect", []) if isinstance(raw.get("expect"), list) else []
    ):
        bad += _expect_problems(f"{where} expect {index}", item)
    if "expect" in raw and not isinstance(raw["expect"], list):
        bad.append(f"{where}: expect must be a list")
    return bad


def _requires_problems(where: str, requires: object) -> list[str]:
    """What is wrong with a signature's `requires` table."""
    if not isinstance(requires, dict):
        return [f"{where}: requires must be a table of condition = [allowed values]"]
    bad = [
        f"{where}: requires {name!r} is not one of {', '.join(REQUIRE_FIELDS)}"
        for name in sorted(set(requires) - set(REQUIRE_FIELDS))
    ]
    bad += [
        f"{where}: requires {name} must list its allowed values"
        for name, allowed in requires.items()
        if not isinstance(allowed, list) or not allowed
    ]
    return bad


def _series_problems(where: str, raw: dict) -> list[str]:
    """A `requires` on a condition the entry's kernel series cannot have."""
    requires = raw.get("requires", {})
    lacks = SERIES_LACKS.get(str(raw.get("kernel")), ())
    if not isinstance(requires, dict):
        return []
    return [
        f"{where}: requires {name}, which {raw['kernel']} does not have (its bundles record"
        " it absent): the step would never be checked; drop the condition"
        for name in sorted(set(requires) & set(lacks))
    ]


def _expect_problems(where: str, item: object) -> list[str]:
    """What is wrong with one expected invalidation."""
    if not isinstance(item, dict):
        return [f"{where}: not a table"]
    bad = [f"{where}: unknown field {name!r}" for name in sorted(set(item) - _EXPECT_FIELDS)]
    bad += [f"{where}: no {name!r}" for name in sorted(_EXPECT_FIELDS - set(item))]
    if "cpus" in item and item["cpus"] not in CPU_ROLES:
        bad.append(f"{where}: cpus {item['cpus']!r} is not one of {', '.join(CPU_ROLES)}")
    count = item.get("count")
    if "count" in item and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        bad.append(f"{where}: count must be a whole number above 0")
    return bad


def parse_signatures(text: str, source: str = SIGNATURE_FILE) -> Signatures:
    """The signatures in `text`, or one TracekitError with a line per mistake."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TracekitError(f"{source}: not TOML: {exc}") from None
    raw = data.get("signature", [])
    problems = [f"{source}: {p}" for n, r in enumerate(raw, 1) for p in _problems_of(n, r)]
    host = data.get("kvm", {}).get("host_functions", [])
    if not isinstance(host, list) or not all(isinstance(n, str) for n in host):
        problems.append(f"{source}: [kvm] host_functions must be a list of function names")
    keys = [
        (
            r.get("kernel"),
            r.get("kvm_mode"),
            tuple(r.get("cpu_models", ())),
            r.get("step"),
            repr(r.get("requires", {})),
        )
        for r in raw
        if isinstance(r, dict)
    ]
    problems += [
        f"{source}: two signatures for {k[0]} {k[1]} {k[3]}"
        for k in sorted({k for k in keys if keys.count(k) > 1}, key=str)
    ]
    paths = data.get("probes", {})
    problems += [
        f"{source}: [probes] {name} must list function names"
        for name, functions in paths.items()
        if not isinstance(functions, list) or not all(isinstance(f, str) for f in functions)
    ]
    if problems:
        raise TracekitError("\n".join(problems))
    probe_paths = {name: tuple(functions) for name, functions in paths.items()}
    return Signatures(tuple(_signature(r) for r in raw), tuple(host), probe_paths)


def _signature(raw: dict) -> Signature:
    """One checked table as a Signature."""
    return Signature(
        kernel=str(raw["kernel"]),
        kvm_mode=raw["kvm_mode"],
        cpu_models=tuple(raw.get("cpu_models", ())),
        step=raw["step"],
        watch=raw["watch"],
        exact=raw["exact"],
        when=raw["when"],
        expect=tuple(Expect(**item) for item in raw["expect"]),
        rests_on=tuple(raw["rests_on"]),
        requires=tuple(
            (name, tuple(str(v) for v in allowed))
            for name, allowed in raw.get("requires", {}).items()
        ),
    )


@cache
def packaged_signatures() -> Signatures:
    """The signatures shipped with tracekit (tracekit/analysis/gtsignatures.toml)."""
    text = resources.files("tracekit.analysis").joinpath(SIGNATURE_FILE).read_text()
    return parse_signatures(text)
