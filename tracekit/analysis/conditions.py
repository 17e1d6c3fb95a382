"""What condition a bundle represents, read from its manifest (pure, no I/O).

A decision table compares bundles that differ in one thing: the guest's variant, what was
done after the guest, the KVM mode, whether the guest ran in the rt CPU's cluster, the
kernel. This module names those five things for one manifest, so the table can pair
bundles that differ in exactly one of them.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields
from pathlib import PurePosixPath

from tracekit.bundle import Manifest

UNKNOWN = "unknown"
# What each reproducer variant does (reproducer/README.md, "The guests"): stage 1 and the
# guest's own TLBI. The manifest keeps only the variant's name; tests check this table
# against the built guests' ELF notes.
VARIANT_FACTS: dict[str, tuple[str, str]] = {
    "mmu-off": ("off", "none"),
    "mmu-on": ("on", "none"),
    "mmu-on-nocache": ("on", "none"),
    "mmu-on-off": ("on-then-off", "none"),
    "mmu-on-asid": ("on", "none"),
    # Since guest revision 2: MMU on, pages read, MMU off, then the TLBI (issue 17).
    "mmu-on-vmalle1": ("on-then-off", "vmalle1"),
    "mmu-on-vmalle1is": ("on-then-off", "vmalle1is"),
    "tlbi-loop": ("off", "loop-vmalle1is"),
    "cache-toggle": ("on", "none"),
    "setway-after-on": ("on", "none"),
    "mmu-on-report": ("on", "none"),  # its TLBI comes before the MMU: the pre_tlbi knob
}
# Condition fields as the decision table names them.
FIELD_LABELS = {
    "variant": "guest",
    "after_guest": "after-guest",
    "kvm_mode": "KVM",
    "guest_cluster": "guest cluster",
    "kernel": "kernel",
}


@dataclass(frozen=True, order=True)
class Condition:
    """The experimental condition of one bundle: the five things a decision table varies."""

    variant: str  # guest variant, e.g. mmu-on
    after_guest: str  # none, hotplug, rollover
    kvm_mode: str  # nvhe, vhe, protected
    guest_cluster: str  # "same" as the rt CPU, "other", or unknown
    kernel: str  # kernel release

    @property
    def stage1(self) -> str:
        """on, off, on-then-off (the variant's stage 1), or unknown."""
        return VARIANT_FACTS.get(self.variant, (UNKNOWN, UNKNOWN))[0]

    def differs_only_in(self, other: Condition) -> str | None:
        """The one field in which two conditions differ, or None (none or several)."""
        names = [f.name for f in fields(self)]
        diff = [n for n, a, b in zip(names, astuple(self), astuple(other), strict=True) if a != b]
        return diff[0] if len(diff) == 1 else None

    def label(self, varying: tuple[str, ...] | None = None) -> str:
        """Short label: the fields that vary across the compared bundles (all when none do)."""
        shown = varying or tuple(FIELD_LABELS)
        return " ".join(f"{getattr(self, name)}" for name in shown)


def bundle_condition(manifest: Manifest) -> Condition:
    """The condition a bundle's manifest records."""
    return Condition(
        variant=guest_variant(manifest),
        after_guest=str(manifest.options.get("after_guest") or "none"),
        kvm_mode=str((manifest.host.get("kvm") or {}).get("mode") or UNKNOWN),
        guest_cluster=guest_cluster(manifest),
        kernel=str(manifest.host.get("kernel_release") or UNKNOWN),
    )


def guest_variant(manifest: Manifest) -> str:
    """The variant that ran: the guest file's name (the reproducer names files by variant)."""
    guest = manifest.scenario.get("guest")
    if guest:
        # Bundles from before collect recorded the variant that ran kept the scenario's
        # default in scenario.guest_variant; the file name is right for old and new ones.
        return PurePosixPath(str(guest)).name.removesuffix(".elf")
    return str(manifest.scenario.get("guest_variant") or UNKNOWN)


def guest_cluster(manifest: Manifest) -> str:
    """ "same" when every guest CPU is in the rt CPU's cluster, "other" when none is."""
    clusters = {c["cpu"]: c.get("cluster") for c in manifest.host.get("cpus", []) if "cpu" in c}
    rt = clusters.get(manifest.options.get("rt_cpu"))
    guests = [clusters.get(cpu) for cpu in manifest.options.get("guest_cpus") or []]
    if rt is None or not guests or None in guests:
        return UNKNOWN
    if all(g == rt for g in guests):
        return "same"
    if all(g != rt for g in guests):
        return "other"
    return "mixed"


def varying_fields(conditions: list[Condition]) -> tuple[str, ...]:
    """The condition fields that take more than one value among these bundles."""
    return tuple(name for name in FIELD_LABELS if len({getattr(c, name) for c in conditions}) > 1)
