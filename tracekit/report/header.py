"""Who and where a report is about: host facts, protocol and condition of each bundle.

Every string here comes from a manifest; renderers escape it as their format needs.
"""

from __future__ import annotations

from collections.abc import Callable

from tracekit.analysis.conditions import (
    Condition,
    Unknown,
    bundle_condition,
    fact_slots,
    guest_knobs,
    guest_variant,
    host_facts,
    simulated_label,
)
from tracekit.bundle import EMULATED_LINE
from tracekit.ingest.bundle import BundleData


def is_emulated(data: BundleData) -> bool:
    """True when the bundle's preflight found an emulated host."""
    return bool(data.manifest.host.get("emulated"))


# Directory names too common to tell bundles apart (`collect -o bundle`): the parent's
# name is put in front of them.
GENERIC_NAMES = ("bundle", "out", "output")


def bundle_condition_of(data: BundleData) -> Condition:
    """The bundle's condition (analysis.conditions.bundle_condition), marked NOT AS
    MODELLED where it was: its groundtruth/ files show that, not its manifest. What every
    table that pools bundles by condition groups by."""
    return bundle_condition(data.manifest, as_modelled=not data.not_as_modelled())


def bundle_label(data: BundleData) -> str:
    """A short name for a bundle in multi-bundle reports: its directory's name (a campaign's
    cell id), with the parent's in front when the name alone says nothing."""
    path = data.path
    if path.name in GENERIC_NAMES and path.parent.name:
        return f"{path.parent.name}/{path.name}"
    return path.name or str(path)


def host_line(data: BundleData) -> str:
    """Kernel release, cores (with how many), KVM mode, emulated or not."""
    host = data.manifest.host
    where = "emulated" if is_emulated(data) else "hardware"
    line = f"host: {host.get('kernel_release', '?')}, {cores(data)}, KVM {kvm_mode(data)}, {where}"
    return line + kpatch_note(data)


def kpatch_note(data: BundleData) -> str:
    """The debug series' state preflight found (reproducer/kpatch), or nothing."""
    found = data.manifest.host.get("kpatch")
    if not isinstance(found, dict):
        return ""
    return f"; debug series (reproducer/kpatch) on, teardown_flush {found.get('teardown_flush')}"


def cores(data: BundleData) -> str:
    """The host's cores as "4 x Cortex-A76" (several kinds joined by '/')."""
    cpus = data.manifest.host.get("cpus", [])
    names = sorted({str(c.get("name", "?")) for c in cpus})
    return f"{len(cpus)} x {'/'.join(names)}" if cpus else "cores unknown"


def kvm_mode(data: BundleData) -> str:
    """nvhe, vhe, protected... as preflight found it."""
    return str(data.manifest.host.get("kvm", {}).get("mode", "unknown"))


def condition(data: BundleData) -> str:
    """What this bundle varied: scenario, guest variant, knobs and CPU, after-guest action."""
    options, scenario = data.manifest.options, data.manifest.scenario
    name = scenario.get("name") or options.get("scenario") or "?"
    guest = guest_variant(data.manifest)  # as the decision table names it
    knobs = f" ({_knobs_fact(data)})" if _knobs_fact(data) else ""
    cpus = ",".join(str(c) for c in options.get("guest_cpus") or []) or "?"
    after = options.get("after_guest", "none")
    return f"{name}: guest {guest}{knobs} on CPU {cpus}, after-guest {after}"


def _knobs_fact(data: BundleData) -> str:
    """The guest knobs set over its preset ("knobs mmu=1,ng=0"), or "" when none or unrecorded."""
    knobs = guest_knobs(data.manifest.options)
    return "" if isinstance(knobs, Unknown) or knobs == "none" else f"knobs {knobs}"


def protocol_line(data: BundleData) -> str:
    """CPU roles and how many runs of how long."""
    o = data.manifest.options
    stress = ",".join(str(c) for c in o.get("stress_cpus") or []) or "?"
    return (
        f"protocol: rt CPU {o.get('rt_cpu')}, stress CPUs {stress}, {condition(data)};"
        f" {o.get('runs')} quiet + {o.get('traced_runs')} traced runs of"
        f" {o.get('duration_s')} s per phase"
    )


def isolation(data: BundleData) -> str:
    """How the rt CPU was isolated, as preflight read it from the kernel command line."""
    rt = data.manifest.options.get("rt_cpu")
    for entry in data.manifest.host.get("isolation", []):
        if entry.get("cpu") == rt:
            flags = [k for k in ("isolcpus", "nohz_full", "rcu_nocbs") if entry.get(k)]
            return (
                f"rt CPU {rt} isolated ({', '.join(flags)})"
                if flags
                else f"rt CPU {rt} not isolated"
            )
    return f"rt CPU {rt}: isolation not recorded"


def controls_line(bundles: list[BundleData]) -> str:
    """The protocol's controls: baseline, untraced headline runs, isolation, conditions;
    a vm-churn's are its own (churn_controls), and a mix says whose is whose."""
    kinds = {isolation(b) for b in bundles}
    if len(kinds) == 1:
        isolated = kinds.pop()
    else:  # they differ: say whose is whose
        isolated = "; ".join(f"{bundle_label(b)}: {isolation(b)}" for b in bundles)
    churns = [b for b in bundles if is_churn(b)]
    phased = (
        "the before phase on the same boot is the baseline; quiet (untraced)"
        " runs give the verdicts, traced runs the attribution and the observer effect;"
        " probe slots run apart from latency runs"
    )
    if not churns:
        line = phased
    elif len(churns) == len(bundles):
        line = churn_controls()
    else:
        line = f"vm-churn bundles: {churn_controls()}; the others: {phased}"
    line += f"; {isolated}"
    if len(bundles) > 1:
        line += "; one condition per bundle"
    return line


def is_churn(data: BundleData) -> bool:
    """A vm-churn bundle (its scenario, as recorded)."""
    scenario = data.manifest.scenario.get("name") or data.manifest.options.get("scenario")
    return scenario == "vm-churn"


def churn_controls() -> str:
    """A vm-churn's controls: no before phase, no probe slots, no traced runs."""
    return (
        "baseline: teardown_flush off on other, fresh boots of the same kernel (and the "
        "twin, the same config without the series); one untraced churn per boot, the boot "
        "the unit of every interval; boots in a seeded random order per round "
        "(benchmarks/vm_churn_boots.py)"
    )


def simulated_warnings(bundles: list[BundleData]) -> list[str]:
    """SIMULATED EFFECT with the models, when any bundle ran under one (beside EMULATED)."""
    labels = sorted({simulated_label(b.manifest) for b in bundles} - {"none"})
    if not labels:
        return []
    real = sum(simulated_label(b.manifest) == "none" for b in bundles)
    mixed = f"; {real} bundle(s) not simulated, never pooled with them" if real else ""
    return [
        f"SIMULATED EFFECT ({', '.join(labels)}): an injected mechanism, not a measured "
        f"one; it tests tracekit's inference, never the hardware{mixed}{_unapplied(bundles)}."
    ]


def _unapplied(bundles: list[BundleData]) -> str:
    """ "; NOT AS MODELLED: ..." per model some bundles ran without its cpu-on clearing
    (BundleData.not_as_modelled), or nothing: the lead says it, not only its section."""
    counts: dict[str, int] = {}
    for data in bundles:
        if simulated_label(data.manifest) != "none" and data.not_as_modelled():
            label = simulated_label(data.manifest)
            counts[label] = counts.get(label, 0) + 1
    return "".join(
        f"; NOT AS MODELLED: {label} in {n} bundle(s) (the plugin did not see their power-ons"
        " where the kernel enters, so the model's cpu-on clearing did not run as it says: a"
        " condition of their own, in no model prediction)"
        for label, n in sorted(counts.items())
    )


def header_lines(bundles: list[BundleData]) -> list[str]:
    """The setup: the bundle, host and protocol (several bundles: one line each), controls."""
    if len(bundles) == 1:
        data = bundles[0]
        # The bundle's name leads its host line (one line where it fits), as several
        # bundles' lines do.
        return [f"{data.path.name}; {host_line(data)}", facts_line(data), protocol_line(data)]
    facts = [setup_facts(data) for data in bundles]
    # A fact every bundle shares is said once; each bundle's line says what is its own.
    shared = [i for i, fact in enumerate(facts[0]) if fact and all(f[i] == fact for f in facts)]
    lines = [f"{len(bundles)} bundles; in all: {', '.join(facts[0][i] for i in shared)}"]
    if not shared:
        lines = [f"{len(bundles)} bundles:"]
    # Bundles with the same own facts (boots of one condition) share one line.
    groups: dict[str, list[str]] = {}
    for data, own in zip(bundles, facts, strict=True):
        rest = ", ".join(fact for i, fact in enumerate(own) if fact and i not in shared)
        groups.setdefault(rest, []).append(bundle_label(data))
    for rest, labels in groups.items():
        lines.append(f"{', '.join(labels)}: {rest}" if rest else ", ".join(labels))
    return lines


def facts_line(data: BundleData) -> str:
    """The facts a comparison depends on: CPU features, THP, guest backing (conditions)."""
    return "facts: " + ", ".join(host_facts(data.manifest))


def setup_facts(data: BundleData) -> list[str]:
    """What a bundle's setup line says, one fact per slot ("" where it has none), in the
    same slots for every bundle so several bundles' facts can be compared slot by slot."""
    options, scenario = data.manifest.options, data.manifest.scenario
    return [
        str(data.manifest.host.get("kernel_release", "?")),
        cores(data),
        f"KVM {kvm_mode(data)}",
        kpatch_note(data).removeprefix("; "),
        f"scenario {scenario.get('name') or options.get('scenario') or '?'}",
        f"guest {guest_variant(data.manifest)}",
        _knobs_fact(data),
        f"guest CPU {','.join(str(c) for c in options.get('guest_cpus') or []) or '?'}",
        f"after-guest {options.get('after_guest', 'none')}",
        "emulated" if is_emulated(data) else "hardware",
        *fact_slots(data.manifest),
        "" if data.manifest.complete else "INCOMPLETE",
    ]


# What each scenario was collected to answer ({guest}: the guest and its CPU).
QUESTIONS = {
    "main": (
        "after one guest ({guest}) has run, are the rt CPU's wake-ups (cyclictest p99.9,"
        " quiet runs) and stress-ng's throughput different from before, on the same boot?"
    ),
    "teardown": "how does stage-2 teardown time grow with the VM's IPA size?",
    "cache-toggle": (
        "how many full-VM stage-2 flushes, and how long, when each vCPU turns its caches on?"
    ),
    "guest-broadcast": (
        "what does a guest ({guest}) issuing broadcast TLBIs in a loop cost the rt CPU and"
        " the TLBI probe?"
    ),
}


def question_line(bundles: list[BundleData]) -> str:
    """The question the bundles' scenarios ask, each once; several bundles compare them."""
    many = len(bundles) > 1
    text = " ".join(dict.fromkeys(_question(b, many) for b in bundles))
    if many:
        text += f" Over {len(bundles)} bundles: which of the conditions they vary changes it?"
    return text


def _question(data: BundleData, many: bool) -> str:
    """One bundle's question, from its scenario (an unknown scenario is named as such)."""
    options, scenario = data.manifest.options, data.manifest.scenario
    name = scenario.get("name") or options.get("scenario") or "main"
    asked = QUESTIONS.get(name)
    if asked is None:
        return f"what does scenario {name!r} show?"
    if many:  # each bundle's guest is in its setup line
        return asked.replace(" ({guest})", "").format(guest="each bundle's guest")
    guest = guest_variant(data.manifest)
    cpus = options.get("guest_cpus") or []
    where = "CPUs" if len(cpus) > 1 else "CPU"
    return asked.format(guest=f"{guest} on {where} {','.join(map(str, cpus)) or '?'}")


def emulated_warnings(bundles: list[BundleData]) -> list[str]:
    """EMULATED HOST when any bundle's host is emulated: its timings are not hardware's."""
    return [EMULATED_LINE] if any(is_emulated(b) for b in bundles) else []


def incomplete_warnings(bundles: list[BundleData]) -> list[str]:
    """INCOMPLETE for each bundle whose collection was interrupted, with the reason."""
    many = len(bundles) > 1
    return [
        f"INCOMPLETE bundle: {bundle_label(b) + ': ' if many else ''}"
        f"{b.manifest.incomplete_reason}."
        for b in bundles
        if not b.manifest.complete
    ]


def damage_warnings(bundles: list[BundleData]) -> list[str]:
    """DAMAGED for each bundle with missing or changed files."""
    return [damage_line(b, len(bundles) > 1) + "." for b in bundles if _damage(b)]


# The warnings of a report's first line, in this order. Adding one (e.g. SIMULATED EFFECT
# with its model, right after EMULATED HOST) is one function and one entry here.
WARNINGS: list[Callable[[list[BundleData]], list[str]]] = [
    emulated_warnings,
    simulated_warnings,
    incomplete_warnings,
    damage_warnings,
]


def warning_lines(bundles: list[BundleData]) -> list[str]:
    """Every warning that applies to the bundles, one sentence each, in WARNINGS order."""
    return [line for warn in WARNINGS for line in warn(bundles)]


# Problems a damage line lists before pointing at `tracekit verify` for the rest.
SHOWN_PROBLEMS = 3


def _damage(data: BundleData) -> list[str]:
    """The bundle's missing or changed files (its incompleteness has a line of its own)."""
    return [p for p in data.problems if not p.startswith("INCOMPLETE")]


def damage_line(data: BundleData, many: bool) -> str:
    """DAMAGED: what is missing, changed or cut, so no number is trusted without saying so."""
    problems = _damage(data)
    where = f"{bundle_label(data)}: " if many else ""
    shown = "; ".join(problems[:SHOWN_PROBLEMS])
    more = len(problems) - SHOWN_PROBLEMS
    rest = f"; {more} more (`tracekit verify` lists them)" if more > 0 else ""
    return f"DAMAGED bundle: {where}{len(problems)} file(s) missing, changed or cut: {shown}{rest}"
