"""What condition a bundle represents, read from its manifest (pure, no I/O).

A decision table compares bundles that differ in one thing. Every field a bundle can vary
is a condition field: the guest (variant, revision, backing), what was done after it, the
scenario, the KVM mode, the kernel, the cores (model, the rt and guest CPUs' core types),
the placement (which CPUs ran rt, stress and guest, and their clusters relative to the rt
CPU), the rt CPU's isolation, the CPU features a comparison depends on (FEAT_TLBIRANGE,
FEAT_FWB, from the boot log) and the host's THP mode, the emulation, whether the host was
fresh, and the run length, interval and perf stat. A field an
old bundle's manifest lacks reads "unknown", and an unknown equals nothing, not even
another unknown: such a bundle pools with no other and no rule can call it "differs only
in" anything, since nobody knows what it held equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import PurePosixPath
from typing import Any

from tracekit.bundle import WFI_STATE, Manifest
from tracekit.cpus import format_cpu_list


class Unknown(str):
    """A field the manifest does not record: prints "unknown", equals only itself."""

    __slots__ = ()

    def __new__(cls) -> Unknown:
        """A fresh unknown, distinct from every other."""
        return super().__new__(cls, "unknown")

    # Identity, not text: two bundles that both lack a field need not have held it equal.
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __copy__(self) -> Unknown:
        """Itself: a copy of an unknown is the same unknown."""
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Unknown:
        """Itself, as for copy."""
        return self


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
# Condition fields as the decision table names them, in Condition's order.
FIELD_LABELS = {
    "variant": "guest",
    "guest_revision": "guest revision",
    "backing": "guest backing",
    "knobs": "guest knobs",
    "after_guest": "after-guest",
    "scenario": "scenario",
    "kvm_mode": "KVM",
    "kernel": "kernel",
    "cpu_model": "cores",
    "rt_core": "rt core",
    "guest_core": "guest core",
    "placement": "placement",
    "guest_cluster": "guest cluster",
    "stress_cluster": "stress cluster",
    "isolation": "rt isolation",
    "tlbirange": "FEAT_TLBIRANGE",
    "fwb": "FEAT_FWB",
    "repeat_tlbi": "REPEAT_TLBI erratum",
    "enable_virt_at_load": "kvm.enable_virt_at_load",
    "guest_idle": "guest CPU idle states",
    "groundtruth_plugin": "ground-truth plugin",
    "probe": "probe slots",
    "thp": "host THP",
    "host": "host",
    "freshness": "host freshness",
    "protocol": "runs",
    "simulated": "simulated effect",
}

# What a label shows when no field varies (the table's note lists the rest).
HEADLINE = ("variant", "after_guest", "kvm_mode", "guest_cluster", "kernel")


@dataclass(frozen=True, order=True)
class Condition:
    """The experimental condition of one bundle: everything a bundle can vary."""

    variant: str  # guest variant, e.g. mmu-on
    after_guest: str  # none, hotplug, hotplug-other, rollover, rollover-minus-one
    kvm_mode: str  # nvhe, vhe, protected
    guest_cluster: str  # "same" as the rt CPU, "other", "mixed", or unknown
    kernel: str  # kernel release
    # Fields the first bundles did not record; absent, each is its own Unknown.
    guest_revision: str = field(default_factory=Unknown)  # the guest ELF note's revision
    backing: str = field(default_factory=Unknown)  # guest RAM backing: 4k, thp, hugetlb
    knobs: str = field(default_factory=Unknown)  # --knob settings over the preset, or none
    scenario: str = field(default_factory=Unknown)  # main, teardown, ...
    cpu_model: str = field(default_factory=Unknown)  # the host's cores: Cortex-A55+Cortex-A76
    rt_core: str = field(default_factory=Unknown)  # the rt CPU's core
    guest_core: str = field(default_factory=Unknown)  # the guest CPUs' core(s)
    placement: str = field(default_factory=Unknown)  # "rt3/stress0-2/guest1"
    stress_cluster: str = field(default_factory=Unknown)  # stress CPUs vs the rt cluster
    isolation: str = field(default_factory=Unknown)  # the rt CPU's isolcpus/nohz_full/...
    # The host CPU's range TLBIs (range/munmap probes issue them) and stage-2 forced
    # write-back (without it the guest's VM-register writes trap): yes, no, or unknown.
    tlbirange: str = field(default_factory=Unknown)
    fwb: str = field(default_factory=Unknown)
    # The "Broken broadcast TLBI completion" workaround (boot log): yes, no, or unknown.
    # Active, every broadcast TLBI's completion repeats a TLBI VALE1IS/VALE2IS + DSB ISH.
    repeat_tlbi: str = field(default_factory=Unknown)
    # kvm.enable_virt_at_load (6.12+; "absent" on 6.1): with it, EL2 stays initialised
    # with no VM alive, so VM creation and CPU onlining run different EL2 code.
    enable_virt_at_load: str = field(default_factory=Unknown)
    # The guest CPUs' enabled power-down cpuidle states ("wfi-only", or their names): on a
    # 6.12 nVHE host each exit from one re-runs ___kvm_hyp_init (local TLBI ALLE1), so
    # what clears a guest CPU's state depends on it. "not recorded" (not a fresh unknown:
    # bundles from before it was recorded still pool with each other, as they did).
    guest_idle: str = "not recorded"
    # QEMU's ground-truth plugin was loaded ("yes"/"no"): its callbacks sit on every TLBI
    # and DSB of the measured paths, so with and without never pool.
    groundtruth_plugin: str = field(default_factory=Unknown)
    # The probe slots' modes and page counts (issue 17: both sides of MAX_TLBI_OPS).
    probe: str = field(default_factory=Unknown)
    thp: str = field(default_factory=Unknown)  # transparent_hugepage/enabled: always, ...
    host: str = field(default_factory=Unknown)  # "board" or the emulation's kind
    freshness: str = field(default_factory=Unknown)  # fresh or dirty (a VM ran before)
    protocol: str = field(default_factory=Unknown)  # run length @ cyclictest interval
    # The simulated mechanism's name@hash, or "none": a bundle recorded before simulations
    # existed was not simulated, so a missing field is "none", not unknown. Simulated
    # bundles never share a condition, so never pool, with real ones; nor does a bundle
    # whose model was NOT AS MODELLED (its cpu-on clearing never ran) with applied ones.
    simulated: str = "none"

    @property
    def stage1(self) -> str:
        """on, off, on-then-off (the variant's stage 1), or unknown."""
        return VARIANT_FACTS.get(self.variant, (UNKNOWN, UNKNOWN))[0]

    def differing(self, other: Condition) -> tuple[str, ...]:
        """The fields in which two conditions differ (an unknown differs from everything)."""
        pairs = ((f.name, getattr(self, f.name), getattr(other, f.name)) for f in fields(self))
        return tuple(n for n, a, b in pairs if a != b or isinstance(a, Unknown))

    def differs_only_in(self, other: Condition) -> str | None:
        """The one field in which two conditions differ, or None (none or several)."""
        diff = self.differing(other)
        return diff[0] if len(diff) == 1 else None

    def label(self, varying: tuple[str, ...] | None = None) -> str:
        """Short label: the fields that vary across the compared bundles (HEADLINE if none)."""
        shown = varying or HEADLINE
        return " ".join(f"{getattr(self, name)}" for name in shown)


def bundle_condition(manifest: Manifest, as_modelled: bool = True) -> Condition:
    """The condition a bundle's manifest records; what it lacks is unknown.

    `as_modelled`: False for a simulated bundle whose model the plugin did not apply as
    modelled (ingest.bundle.BundleSimulation.not_as_modelled, from its groundtruth/ files,
    which the manifest alone does not show): its simulated field says so, so it pools
    with no bundle whose model was applied."""
    options, scenario = manifest.options, manifest.scenario
    return Condition(
        variant=guest_variant(manifest),
        after_guest=str(options.get("after_guest") or "none"),
        kvm_mode=_known((manifest.host.get("kvm") or {}).get("mode")),
        guest_cluster=guest_cluster(manifest),
        kernel=_known(manifest.host.get("kernel_release")),
        guest_revision=_known(scenario.get("guest_revision")),
        backing=_known(scenario.get("backing") or options.get("backing")),
        knobs=guest_knobs(options),
        scenario=_known(scenario.get("name") or options.get("scenario")),
        cpu_model=_cores(manifest, None),
        rt_core=_cores(manifest, [options.get("rt_cpu")]),
        guest_core=_cores(manifest, options.get("guest_cpus")),
        placement=placement(manifest),
        stress_cluster=_relation(manifest, options.get("stress_cpus")),
        isolation=rt_isolation(manifest),
        tlbirange=cpu_feature(manifest, "tlbirange"),
        fwb=cpu_feature(manifest, "fwb"),
        repeat_tlbi=cpu_feature(manifest, "repeat_tlbi"),
        enable_virt_at_load=_known(
            (manifest.host.get("kvm_params") or {}).get("enable_virt_at_load")
        ),
        guest_idle=guest_idle(manifest),
        groundtruth_plugin=groundtruth_plugin(manifest),
        probe=probe_slots(manifest),
        thp=_known((manifest.host.get("thp") or {}).get("enabled")),
        host=host_kind(manifest),
        freshness=_known((manifest.host.get("freshness") or {}).get("state")),
        protocol=protocol(manifest),
        simulated=simulated_label(manifest) + ("" if as_modelled else f" ({NOT_AS_MODELLED_MARK})"),
    )


# How a simulated condition whose model was not applied as modelled is marked.
NOT_AS_MODELLED_MARK = "NOT AS MODELLED"


def simulated_label(manifest: Manifest) -> str:
    """The model a simulated bundle ran under (name@hash), or "none"."""
    simulated = manifest.host.get("simulated") or {}
    return str(simulated.get("label") or "none")


UNTESTED_BY = (
    "emulated without a simulated mechanism (`vhost run --simulate`): its data shows QEMU's"
    " own behaviour, which none of the models describes, so it tests none of them"
)


def tests_models(emulated: bool, simulated: str) -> bool:
    """Whether a bundle's verdicts can test the models: a board's (the real mechanism,
    whatever it is) or an emulated host's that ran under one ("none": not simulated)."""
    return not emulated or simulated != "none"


def _known(value: Any) -> str:
    """The recorded value as text, or a fresh Unknown when it is absent."""
    return Unknown() if value is None or value == "" else str(value)


def guest_knobs(options: dict[str, Any]) -> str:
    """The knobs set over the guest's preset, sorted ("none"); unknown where not recorded."""
    knobs = options.get("knobs")
    if not isinstance(knobs, list):
        return Unknown()
    return ",".join(sorted(str(k) for k in knobs)) or "none"


def guest_variant(manifest: Manifest) -> str:
    """The variant that ran: the guest file's name (the reproducer names files by variant)."""
    guest = manifest.scenario.get("guest")
    if guest:
        # Bundles from before collect recorded the variant that ran kept the scenario's
        # default in scenario.guest_variant; the file name is right for old and new ones.
        return PurePosixPath(str(guest)).name.removesuffix(".elf")
    return _known(manifest.scenario.get("guest_variant"))


def _cpu_facts(manifest: Manifest, key: str) -> dict[int, Any]:
    """CPU number -> one per-CPU host fact (cluster, name)."""
    return {c["cpu"]: c.get(key) for c in manifest.host.get("cpus", []) if "cpu" in c}


def _cores(manifest: Manifest, cpus: list[Any] | None) -> str:
    """The core names of these CPUs (all when None), joined with "+", or unknown."""
    names = _cpu_facts(manifest, "name")
    chosen = list(names.values()) if cpus is None else [names.get(c) for c in cpus]
    if not chosen or None in chosen:
        return Unknown()
    return "+".join(sorted({str(n) for n in chosen}))


def _relation(manifest: Manifest, cpus: list[Any] | None) -> str:
    """ "same" when every CPU is in the rt CPU's cluster, "other" when none is, else mixed."""
    clusters = _cpu_facts(manifest, "cluster")
    rt = clusters.get(manifest.options.get("rt_cpu"))
    theirs = [clusters.get(cpu) for cpu in cpus or []]
    if rt is None or not theirs or None in theirs:
        return Unknown()
    if all(c == rt for c in theirs):
        return "same"
    if all(c != rt for c in theirs):
        return "other"
    return "mixed"


def guest_idle(manifest: Manifest) -> str:
    """The guest CPUs' enabled power-down idle states, "wfi-only", or "not recorded"."""
    power = manifest.host.get("power")
    guests = manifest.options.get("guest_cpus")
    if not power or not guests:
        return "not recorded"
    names = {
        name
        for entry in power
        if entry.get("cpu") in guests
        for name in entry.get("idle_states") or []
        if name != WFI_STATE and not name.endswith("(disabled)")
    }
    return ",".join(sorted(names)) or "wfi-only"


def guest_cluster(manifest: Manifest) -> str:
    """The guest CPUs relative to the rt CPU's cluster: same, other, mixed or unknown."""
    return _relation(manifest, manifest.options.get("guest_cpus"))


def placement(manifest: Manifest) -> str:
    """Which CPUs had which role: "rt3/stress0-2/guest1"."""
    options = manifest.options
    roles = (
        ("rt", [options.get("rt_cpu")]),
        ("stress", options.get("stress_cpus")),
        ("guest", options.get("guest_cpus")),
    )
    if any(not cpus or None in cpus for _, cpus in roles):
        return Unknown()
    return "/".join(f"{role}{format_cpu_list(list(cpus))}" for role, cpus in roles)


def rt_isolation(manifest: Manifest) -> str:
    """The rt CPU's isolation flags as preflight read them ("none" when it had none)."""
    rt = manifest.options.get("rt_cpu")
    for entry in manifest.host.get("isolation", []):
        if entry.get("cpu") == rt:
            flags = [k for k in ("isolcpus", "nohz_full", "rcu_nocbs") if entry.get(k)]
            return "+".join(flags) or "none"
    return Unknown()


def cpu_feature(manifest: Manifest, key: str) -> str:
    """ "yes" or "no" as the boot log said (host facts' features), else unknown."""
    present = ((manifest.host.get("features") or {}).get(key) or {}).get("present")
    if present is None:
        return Unknown()
    return "yes" if present else "no"


def groundtruth_plugin(manifest: Manifest) -> str:
    """ "yes" when ground truth was added to the bundle (groundtruth/ files: the plugin ran
    in its boot), else as the collector recorded it; unrecorded: a board "no", else unknown."""
    if any(name.startswith("groundtruth/") for name in manifest.files):
        return "yes"
    recorded = manifest.host.get("groundtruth_plugin")
    if recorded is not None:
        return str(recorded)
    return "no" if host_kind(manifest) == "board" else Unknown()


def probe_slots(manifest: Manifest) -> str:
    """The probe's modes and page counts, e.g. "page" or "range,munmap x 512,1024 pages"."""
    modes = manifest.scenario.get("probe_modes")
    if not isinstance(modes, list):
        return Unknown()
    if not modes:
        return "none"
    pages = (manifest.scenario.get("parameters") or {}).get("probe_pages") or []
    if set(modes) == {"page"}:
        return "page"
    counts = ",".join(str(n) for n in pages) or "default"
    return f"{','.join(modes)} x {counts} pages"


def host_kind(manifest: Manifest) -> str:
    """ "board", or the kind of emulation (emulated timings are not hardware timings)."""
    emulation = manifest.host.get("emulation") or {}
    if "emulated" not in emulation:
        return Unknown()
    return str(emulation.get("kind") or "emulated") if emulation["emulated"] else "board"


def protocol(manifest: Manifest) -> str:
    """Run length, cyclictest interval and perf stat beside the runs: metrics depend on them."""
    duration = manifest.options.get("duration_s")
    interval = manifest.options.get("interval_us")
    if duration is None or interval is None:
        return Unknown()
    perf = "+perf" if manifest.options.get("perf_counters") else ""
    return f"{duration}s@{interval}us{perf}"


def varying_fields(conditions: list[Condition]) -> tuple[str, ...]:
    """The condition fields that take more than one value (or are unknown) among these."""
    return tuple(
        name
        for name in FIELD_LABELS
        if len({getattr(c, name) for c in conditions}) > 1
        or any(isinstance(getattr(c, name), Unknown) for c in conditions)
    )


# The setup facts the lead states beside the host line's cores (issue 17, point 13): the CPU
# features, THP and guest backing that decide what a TLBI or a stage-2 mapping is.
SETUP_FIELDS = ("tlbirange", "fwb", "repeat_tlbi", "thp", "backing")


def fact_slots(manifest: Manifest) -> list[str]:
    """One "label value" phrase per SETUP_FIELDS, in that order ("unknown" where absent),
    so several bundles' facts compare slot by slot. FEAT_TLBIRANGE adds whether the
    kernel issues range TLBIs (CONFIG_ARM64_TLB_RANGE); THP's defrag mode stays in the
    manifest (it decides how hard a fault tries for a huge page, not whether it may)."""
    condition = bundle_condition(manifest)
    extra = {"tlbirange": _tlbirange_use(manifest)}
    return [f"{FIELD_LABELS[n]} {getattr(condition, n)}{extra.get(n, '')}" for n in SETUP_FIELDS]


def host_facts(manifest: Manifest) -> list[str]:
    """fact_slots' recorded phrases, then the ones the manifest lacks as one "not recorded:
    ..." phrase (none recorded at all: one short phrase), for one bundle's setup."""
    condition = bundle_condition(manifest)
    slots = zip(SETUP_FIELDS, fact_slots(manifest), strict=True)
    known = [said for n, said in slots if not isinstance(getattr(condition, n), Unknown)]
    missing = [FIELD_LABELS[n] for n in SETUP_FIELDS if isinstance(getattr(condition, n), Unknown)]
    if not known:
        return ["none recorded (CPU features, THP, guest backing)"]
    return known + ([f"not recorded: {', '.join(missing)}"] if missing else [])


def _tlbirange_use(manifest: Manifest) -> str:
    """ " (the kernel issues range TLBIs)" or " (... does not)" where the CPU has it."""
    uses = ((manifest.host.get("features") or {}).get("tlbirange") or {}).get("kernel_uses")
    if uses is None:
        return ""
    return (
        " (the kernel issues range TLBIs)"
        if uses
        else " (the kernel, built without them, does not use them)"
    )
