"""Conditions from manifests, the decision rules, and the injected effect found end to end.

Bundles come from tests/bundlegen.py: real emulated cyclictest and probe samples,
resampled, with latencies and probe costs raised by a set factor after the guest only
when the guest's variant turns its MMU on (and no after-guest action clears it).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from bundlegen import Spec, generate
from report_bundles import edit_manifest

from tracekit.analysis.beforeafter import latency_comparisons
from tracekit.analysis.compare import ABSENT, INCONCLUSIVE, PRESENT, Comparison, runs_to_decide
from tracekit.analysis.conditions import (
    VARIANT_FACTS,
    Condition,
    bundle_condition,
    varying_fields,
)
from tracekit.analysis.decision import RULES, ConditionEffect, conclusions
from tracekit.analysis.gtsignatures import packaged_signatures
from tracekit.bundle import Manifest
from tracekit.host import afterguest
from tracekit.ingest.bundle import BundleData, load_bundle
from tracekit.report.sections.decision import _where, section

BUILT_GUESTS = Path(__file__).parent.parent / "reproducer" / "build" / "guests"
INJECTED = 3.0
RUNS = 10
# A generated bundle's condition with its guest on CPU 2 (the rt CPU's cluster).
GENERATED = Condition(
    "mmu-on", "none", "nvhe", "same", "6.1.0-50-arm64",
    guest_revision="1", backing="4k", knobs="none", scenario="main", cpu_model="Cortex-A76",
    rt_core="Cortex-A76", guest_core="Cortex-A76", placement="rt3/stress0-2/guest2",
    stress_cluster="mixed", isolation="isolcpus+nohz_full+rcu_nocbs", host="qemu-virt",
    freshness="fresh", tlbirange="no", fwb="no", repeat_tlbi="yes", thp="always",
    protocol="3s@1000us", enable_virt_at_load="absent", groundtruth_plugin="no", probe="page",
)  # fmt: skip


def _bundle(tmp_path: Path, name: str, spec: Spec, interval_us: int | None = None) -> BundleData:
    """Generate and load one bundle; `interval_us`: cyclictest's interval as recorded
    (the generated latencies are a real emulated run's: saturated at the recorded 1000 us,
    not at 10 ms)."""
    root = generate(tmp_path / name, spec)
    if interval_us is not None:
        edit_manifest(root, lambda m: m["options"].update(interval_us=interval_us))
    return load_bundle(root)


def _primary(data: BundleData) -> Comparison:
    """The bundle's primary comparison (cyclictest p99.9, quiet runs)."""
    return next(c for c in latency_comparisons(data.latencies) if c.role == "primary")


def test_condition_comes_from_the_manifest(tmp_path: Path) -> None:
    """Variant from the guest file (not the scenario default), cluster from host facts."""
    other = _bundle(tmp_path, "a", Spec(variant="mmu-off", runs=1, guest_cpu=1))
    same = _bundle(tmp_path, "b", Spec(after_guest="hotplug", kvm_mode="vhe", guest_cpu=2))
    assert bundle_condition(other.manifest) == replace(
        GENERATED, variant="mmu-off", guest_cluster="other", placement="rt3/stress0-2/guest1"
    )
    c = bundle_condition(same.manifest)
    assert (c.after_guest, c.kvm_mode, c.guest_cluster) == ("hotplug", "vhe", "same")


@pytest.mark.skipif(not BUILT_GUESTS.is_dir(), reason="reproducer not built (make -C reproducer)")
def test_variant_facts_agree_with_the_guests_notes() -> None:
    """conditions.VARIANT_FACTS says what each built guest's ELF note says."""
    from tracekit.guests import list_guests

    notes = {g.variant: (g.stage1, g.tlbi) for g in list_guests(BUILT_GUESTS)}
    assert notes == VARIANT_FACTS


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_injected_effect_is_present_and_measured(tmp_path: Path, seed: int) -> None:
    """MMU-on: present, x3 inside the interval; MMU-off: never present."""
    on = _primary(_bundle(tmp_path, "on", Spec(factor=INJECTED, runs=RUNS, seed=seed)))
    assert on.verdict == PRESENT
    assert on.ci_low <= INJECTED <= on.ci_high
    off_spec = Spec(variant="mmu-off", factor=INJECTED, runs=RUNS, seed=seed + 100)
    off = _primary(_bundle(tmp_path, "off", off_spec))
    assert off.verdict in (ABSENT, INCONCLUSIVE)
    assert off.ci_low < 1.5 < INJECTED  # far from the injected factor


def test_decision_table_names_the_injected_condition(tmp_path: Path) -> None:
    """Rows per condition; the MMU rule is stated; hotplug (which clears it) not present."""
    specs = {
        "on": Spec(factor=INJECTED, runs=RUNS, seed=0),
        "off": Spec(variant="mmu-off", factor=INJECTED, runs=RUNS, seed=1),
        "hot": Spec(after_guest="hotplug", factor=INJECTED, runs=RUNS, seed=2),
    }
    s = section([_bundle(tmp_path, name, spec) for name, spec in specs.items()])
    assert s is not None
    rows = {r["condition"]: r["verdict"] for r in s.tables[0].frame.iter_rows(named=True)}
    assert rows["mmu-on none"] == PRESENT
    assert rows["mmu-off none"] != PRESENT and rows["mmu-on hotplug"] != PRESENT
    text = "\n".join(s.findings)
    assert s.findings[0].startswith(
        "Effect on cyclictest p99.9 by condition: present: mmu-on none;"
    )
    assert "created by what an MMU-on guest does and an MMU-off guest does not" in text
    assert "present for mmu-on, absent for mmu-off" in text  # the rule, stated
    assert "not cleared by hotplugging" not in text  # hotplug did clear it


def test_too_few_runs_is_inconclusive_and_says_how_many(tmp_path: Path) -> None:
    """2+2 runs with a large effect: inconclusive, and the section names 4+4."""
    short = _bundle(tmp_path, "short", Spec(factor=INJECTED, runs=2), interval_us=10_000)
    assert _primary(short).verdict == INCONCLUSIVE
    other = _bundle(tmp_path, "off", Spec(variant="mmu-off", runs=2), interval_us=10_000)
    s = section([short, other])
    assert s is not None
    assert any("inconclusive with 2+2 runs; the rule needs 4+4" in f for f in s.findings)


def test_a_saturated_rt_cpu_gets_no_run_count(tmp_path: Path) -> None:
    """Review of 17, point 17: at the recorded 1000 us interval the same bundles' rt CPU
    is saturated, so no run count is asked for: more runs would measure its backlog."""
    short = _bundle(tmp_path, "short", Spec(factor=INJECTED, runs=2))
    other = _bundle(tmp_path, "off", Spec(variant="mmu-off", runs=2))
    s = section([short, other])
    assert s is not None
    said = "\n".join(s.findings)
    assert "inconclusive with 2+2 runs; no run count makes this a verdict" in said
    assert "the rule needs" not in said and "would decide it" not in said
    assert all(c.needed_runs is None and c.no_verdict for c in s.comparisons)


def test_bundles_of_one_condition_are_pooled_and_one_bundle_gives_none(tmp_path: Path) -> None:
    """Two bundles (boots) of one condition: one row whose unit is the boot."""
    a = _bundle(tmp_path, "a", Spec(runs=3, seed=1), interval_us=10_000)
    b = _bundle(tmp_path, "b", Spec(runs=3, seed=2), interval_us=10_000)
    assert section([a]) is None
    s = section([a, b])
    assert s is not None
    rows = s.tables[0].frame.select("condition", "n").rows()
    assert rows == [("mmu-on none nvhe other 6.1.0-50-arm64", "2+2 boots")]  # none vary
    assert "inconclusive with 2+2 boots; the rule needs 4+4" in "\n".join(s.findings)
    assert any("no two conditions differ" in u for u in s.unknowns)


def _effect(condition: Condition, verdict: str, needed: int | None = None) -> ConditionEffect:
    """A condition with a comparison whose verdict is given (the rules read only that)."""
    c = Comparison("cyclictest p99.9", 8, 8, 2.0, 1.5, 2.5, 0.01, 0.01, "exact", verdict, needed)
    return ConditionEffect(condition, ("x",), c)


BASE = replace(GENERATED, kernel="6.1")


def test_rules_need_exactly_one_difference_and_their_verdicts() -> None:
    """Settled for the rule's verdicts; nothing when two fields differ or verdicts disagree."""
    off = replace(BASE, variant="mmu-off")
    vmalle1 = replace(BASE, variant="mmu-on-vmalle1")
    on_off = replace(BASE, variant="mmu-on-off")
    effects = [_effect(BASE, PRESENT), _effect(off, ABSENT), _effect(vmalle1, PRESENT)]
    found = conclusions([*effects, _effect(on_off, PRESENT)])
    texts = {c.text for c in found if c.settled}
    assert texts == {
        "created by what an MMU-on guest does and an MMU-off guest does not",
        "created even when the guest turns its MMU off again",
        "not cleared by the guest's own TLBI VMALLE1 (executed as broadcast: KVM sets HCR_EL2.FB)",
    }
    # mmu-on is not the TLBI presets' control (another dose, MMU left on): no TLBI rule.
    assert not any("VMALLE1" in c.text for c in conclusions(effects))
    two_apart = replace(BASE, variant="mmu-off", after_guest="hotplug")
    assert conclusions([_effect(BASE, PRESENT), _effect(two_apart, ABSENT)]) == []
    assert conclusions([_effect(BASE, ABSENT), _effect(off, PRESENT)]) == []


def test_one_inconclusive_side_is_an_open_question_with_runs_needed() -> None:
    """Present vs inconclusive (short): an open question that says 4+4 runs are needed."""
    hot = replace(BASE, after_guest="hotplug")
    found = conclusions([_effect(BASE, PRESENT), _effect(hot, INCONCLUSIVE, needed=4)])
    assert len(found) == 1 and not found[0].settled
    assert found[0].runs_needed == 4
    both = conclusions([_effect(BASE, INCONCLUSIVE), _effect(hot, INCONCLUSIVE)])
    assert both == []  # no side shows anything: not even a question


def test_kernel_rule_fires_between_6_1_and_6_12_despite_enable_virt_at_load() -> None:
    """Review of 17, point 14: 6.1 records kvm.enable_virt_at_load "absent", 6.12 "yes",
    so the two kernels always differ in both fields; the rule entails the parameter (and
    its implication names it), while a third field differing still blocks it."""
    old = replace(BASE, kernel="6.1.0-50-arm64", enable_virt_at_load="absent")
    new = replace(old, kernel="6.12.48+deb13-arm64", enable_virt_at_load="yes")
    assert set(old.differing(new)) == {"kernel", "enable_virt_at_load"}
    [found] = [c for c in conclusions([_effect(old, PRESENT), _effect(new, ABSENT)]) if c.settled]
    assert found.text == (
        "depends on the kernel: present with 6.1.0-50-arm64, absent with 6.12.48+deb13-arm64"
    )
    assert "kvm.enable_virt_at_load" in found.implies
    other = replace(new, kvm_mode="vhe")
    assert conclusions([_effect(old, PRESENT), _effect(other, ABSENT)]) == []
    # Both kernels have the parameter, booted yes and no: that is kvm.enable_virt_at_load=0
    # on the command line, not the kernel (review 17b).
    newer = replace(new, kernel="6.12.57+deb13-arm64", enable_virt_at_load="no")
    assert conclusions([_effect(new, PRESENT), _effect(newer, ABSENT)]) == []


def test_kernel_rule_names_both_kernels() -> None:
    """The wildcard rule fills in the kernels it compared."""
    patched = replace(BASE, kernel="6.1-fix")
    found = conclusions([_effect(BASE, PRESENT), _effect(patched, ABSENT)])
    assert [c.text for c in found] == [
        "depends on the kernel: present with 6.1, absent with 6.1-fix"
    ]


def test_runs_to_decide_scales_the_measured_spread() -> None:
    """Half-width on a log scale shrinks as 1/sqrt(runs): the estimate follows from that."""
    near_one = Comparison("m", 8, 8, 1.05, 0.9, 1.2, 0.5, 0.5, "exact", INCONCLUSIVE, None)
    assert runs_to_decide(near_one) == 77  # 8 * (0.1438 / 0.0465)^2, towards "absent"
    large = Comparison("m", 8, 8, 2.0, 1.0, 4.0, 0.1, 0.1, "exact", INCONCLUSIVE, None)
    assert runs_to_decide(large) == 11  # 8 * (0.693 / 0.598)^2, towards "present"
    on_edge = Comparison("m", 8, 8, 1.1, 0.9, 1.3, 0.5, 0.5, "exact", INCONCLUSIVE, None)
    assert runs_to_decide(on_edge) is None


def _manifest(cores: str, kvm_mode: str, **scenario: str) -> Manifest:
    """A manifest of a 4-CPU host of one core type, rt CPU 3, guest on CPU 1."""
    cpus = [{"cpu": n, "cluster": n // 2, "name": cores} for n in range(4)]
    host = {"cpus": cpus, "kvm": {"mode": kvm_mode}, "kernel_release": "6.12.48+deb13-arm64"}
    # QEMU's max has FEAT_TLBIRANGE and FEAT_FWB, Cortex-A76 neither (its boot log says).
    has = cores.startswith("0x")
    host |= {"features": {k: {"present": has} for k in ("tlbirange", "fwb")}}
    # 6.1.176's REPEAT_TLBI workaround covers Cortex-A76 (4118414), not max.
    host["features"]["repeat_tlbi"] = {"present": not has}
    host |= {"thp": {"enabled": "always"}}
    host |= {"emulation": {"emulated": True, "kind": "qemu-virt"}}
    host |= {"isolation": [{"cpu": 3, "isolcpus": True}], "freshness": {"state": "fresh"}}
    host |= {"kvm_params": {"enable_virt_at_load": "yes"}, "groundtruth_plugin": "no"}
    options = {"rt_cpu": 3, "stress_cpus": [0, 1, 2], "guest_cpus": [1], "scenario": "main"}
    options |= {"after_guest": "none", "duration_s": 20, "interval_us": 1000, "knobs": []}
    scenario |= {"name": "main", "guest": "/g/mmu-on.elf", "probe_modes": ["page"]}
    return Manifest(host=host, options=options, scenario=scenario)


def test_other_cores_are_another_condition_not_only_another_kvm_mode() -> None:
    """nVHE on Cortex-A76 vs VHE on QEMU's max: two fields differ, so no KVM-mode rule."""
    known = {"guest_revision": "2", "backing": "thp"}
    a76 = bundle_condition(_manifest("Cortex-A76", "nvhe", **known))
    qmax = bundle_condition(_manifest("0x00:0x051", "vhe", **known))
    assert set(a76.differing(qmax)) == {
        "kvm_mode", "cpu_model", "rt_core", "guest_core", "tlbirange", "fwb", "repeat_tlbi"
    }  # fmt: skip
    assert conclusions([_effect(a76, PRESENT), _effect(qmax, ABSENT)]) == []
    same_cores = bundle_condition(_manifest("Cortex-A76", "vhe", **known))
    found = conclusions([_effect(a76, PRESENT), _effect(same_cores, ABSENT)])
    assert [c.text for c in found] == ["specific to nVHE: absent with VHE"]


def test_a_field_an_old_bundle_lacks_is_unknown_and_pools_with_nothing(tmp_path: Path) -> None:
    """No backing or guest revision recorded: two such bundles are two rows, no rule fires."""
    old = [Spec(runs=3, seed=n, guest_revision=None, backing=None) for n in (1, 2)]
    a, b = (_bundle(tmp_path, f"old{n}", spec) for n, spec in enumerate(old))
    ca, cb = bundle_condition(a.manifest), bundle_condition(b.manifest)
    assert (str(ca.backing), str(ca.guest_revision)) == ("unknown", "unknown")
    assert ca != cb and set(ca.differing(cb)) == {"guest_revision", "backing", "knobs"}
    s = section([a, b])
    assert s is not None
    assert s.tables[0].frame.height == 2  # not pooled into one condition of 2 boots
    assert varying_fields([ca, cb]) == ("guest_revision", "backing", "knobs")
    off = bundle_condition(_manifest("Cortex-A76", "nvhe"))
    assert (
        conclusions([_effect(ca, PRESENT), _effect(replace(ca, variant="mmu-off"), ABSENT)]) == []
    )
    assert str(off.backing) == "unknown"


def test_cluster_rule_allows_the_guest_cpu_it_moves_and_nothing_else() -> None:
    """Same vs other cluster moves the guest CPU (placement); another core type too: no rule."""
    other = replace(BASE, guest_cluster="other", placement="rt3/stress0-2/guest1")
    found = conclusions([_effect(BASE, PRESENT), _effect(other, PRESENT)])
    assert [c.text for c in found] == ["also when the guest ran in another cluster"]
    big_little = replace(other, guest_core="Cortex-A55", cpu_model="Cortex-A55+Cortex-A76")
    assert conclusions([_effect(BASE, PRESENT), _effect(big_little, PRESENT)]) == []


def test_implications_claim_only_what_their_contrast_shows() -> None:
    """No guest TLBI is local (HCR_EL2.FB); hotplug, rollover, cluster, MMU say no more."""
    # Keyed without A's value, the first rule of each (field, B, verdict): against none.
    said: dict[tuple[str, str | None, str], str] = {}
    for r in RULES:
        said.setdefault((r.field, r.b, r.b_verdict), f"{r.conclusion} -> {r.implies}")
    everything = " ".join(said.values())
    # Only the host's own TLBIs (boot path, EL2 init) may be called local.
    host_local = ("local TLBI ALLE2", "local TLBI VMALLE1", "local TLBI ALLE1 ")
    for phrase in host_local:
        everything = everything.replace(phrase, "")
    assert "local" not in everything
    for overreach in ("tagged with a VMID", "re-initialising EL2", "table walks leave"):
        assert overreach not in everything
    hotplug = said[("after_guest", "hotplug", ABSENT)]
    assert "power cycle" in hotplug and "6.12" in hotplug and "6.1 " in hotplug
    assert "ALLE2 and ALLE1" in hotplug
    rollover = said[("after_guest", "rollover", ABSENT)]
    assert "does not separate" in rollover and "throwaway VMs" in rollover
    cluster = said[("guest_cluster", "other", ABSENT)]
    assert "does not say where the state is" in cluster
    control = said[("after_guest", "rollover-minus-one", ABSENT)]
    assert "no TLBI ALLE1IS" in control and "does not point at its ALLE1IS" in control
    found = conclusions([_effect(BASE, PRESENT), _effect(replace(BASE, variant="mmu-off"), ABSENT)])
    assert _where(found)[0].startswith("What the settled rules above imply, each no more: ")
    mmu = said[("variant", "mmu-off", ABSENT)]
    assert "VM-register writes" in mmu and "stage-2 flush" in mmu


def _init_operations(kernel: str, step: str) -> str:
    """The signatures' ___kvm_hyp_init operations for (kernel, nVHE, step), joined by 'and'."""
    sig = next(
        s
        for s in packaged_signatures().entries
        if (s.kernel, s.kvm_mode, s.step) == (kernel, "nvhe", step)
    )
    ops = [e.operation.removeprefix("TLBI ") for e in sig.expect if e.function == "___kvm_hyp_init"]
    return " and ".join(ops)


def test_el2_init_texts_agree_with_the_signatures_per_kernel() -> None:
    """Review of 20, #25: 6.1's VM creation runs ALLE2 + VMALLS12E1, 6.12's replug ALLE2 + ALLE1."""
    said = {(r.field, r.a, r.b, r.b_verdict): r.implies for r in RULES}
    assert _init_operations("6.1", "create") == "ALLE2 and VMALLS12E1"
    assert _init_operations("6.12", "hotplug") == "ALLE2 and ALLE1"
    rollover = said[("after_guest", "none", "rollover", ABSENT)]
    assert "on 6.1 (nVHE) the local TLBI ALLE2 and VMALLS12E1 of VMID 0" in rollover
    assert "ALLE2 and ALLE1" not in rollover
    hotplug = said[("after_guest", "none", "hotplug", ABSENT)]
    assert "on 6.12 the EL2 init's local TLBI ALLE2 and ALLE1" in hotplug
    doc = afterguest.__doc__ or ""
    assert doc.count("ALLE2 and VMALLS12E1 of VMID 0") == 2 and doc.count(" ALLE1)") == 0


def test_rules_name_the_kernel_paths_the_review_found() -> None:
    """Review of 17, points 1, 2, 7, 12-15: each confound is named, each overclaim gone."""
    # Keyed without A's value, the first rule of each (field, B, verdict): against none.
    said: dict[tuple[str, str | None, str], str] = {}
    for r in RULES:
        said.setdefault((r.field, r.b, r.b_verdict), f"{r.conclusion} -> {r.implies}")
    everything = " ".join(said.values())
    assert "thousands" not in everything and "power cycle alone" not in everything
    for verdict in (PRESENT, ABSENT):
        rollover = said[("after_guest", "rollover", verdict)]
        assert "255 with 8-bit" in rollover and "65535 with 16-bit" in rollover
        assert "every VM creation with none alive" in rollover and "6.1" in rollover
        hotplug = said[("after_guest", "hotplug", verdict)]
        assert "__cpu_setup's local TLBI VMALLE1" in hotplug and "___kvm_hyp_init" in hotplug
    assert "idle" in said[("after_guest", "hotplug", ABSENT)]
    # Review 1517 finding 7: idle exits happen in none and hotplug runs alike.
    idle = said[("after_guest", "hotplug", ABSENT)]
    assert "confounded with the guest CPU's idle" not in idle
    assert "differ between the two" in idle and "did not clear it" in idle
    assert "power-off" in said[("variant", "mmu-on-off", PRESENT)]
    assert "among others" in said[("variant", "mmu-off", ABSENT)]
    for verdict in (PRESENT, ABSENT):
        cluster = said[("guest_cluster", "other", verdict)]
        assert "DynamIQ" in cluster and "never fires" in cluster


def test_freshness_and_perf_stat_are_condition_fields() -> None:
    """A dirty host (a VM ran before 'before') and perf stat beside the runs are conditions."""
    fresh = _manifest("Cortex-A76", "nvhe", guest_revision="2", backing="thp")
    dirty = _manifest("Cortex-A76", "nvhe", guest_revision="2", backing="thp")
    dirty.host["freshness"] = {"state": "dirty"}
    dirty.options["perf_counters"] = True
    assert set(bundle_condition(fresh).differing(bundle_condition(dirty))) == {
        "freshness",
        "protocol",
    }


def test_pre_enable_tlbi_is_a_factor_of_its_own() -> None:
    """mmu-on vs the report's guest (pre-enable TLBI VMALLE1): the one difference is named."""
    report = replace(BASE, variant="mmu-on-report")
    found = conclusions([_effect(BASE, ABSENT), _effect(report, PRESENT)])
    assert [c.text for c in found] == [
        "created only with the report's TLBI VMALLE1 before the MMU goes on"
        " (executed as broadcast: KVM sets HCR_EL2.FB)"
    ]
    both = conclusions([_effect(BASE, PRESENT), _effect(report, PRESENT)])
    assert [c.text for c in both] == [
        "created with or without the report's TLBI VMALLE1 before the MMU goes on"
    ]


def test_variant_rules_compare_presets_without_knob_overrides() -> None:
    """Review of 17, point 3: mmu-on vs mmu-on-report both with pre_tlbi=1 are one guest."""
    knobbed = replace(BASE, knobs="pre_tlbi=1")
    report = replace(knobbed, variant="mmu-on-report")
    assert conclusions([_effect(knobbed, PRESENT), _effect(report, PRESENT)]) == []
    plain = conclusions(
        [_effect(BASE, PRESENT), _effect(replace(BASE, variant="mmu-on-report"), PRESENT)]
    )
    assert [c.text for c in plain] == [
        "created with or without the report's TLBI VMALLE1 before the MMU goes on"
    ]


def test_both_guest_tlbi_names_have_a_cleared_by_rule() -> None:
    """Review of 17, point 11: VMALLE1IS clears as VMALLE1 does (one experiment under FB)."""
    on_off = replace(BASE, variant="mmu-on-off")
    for name in ("mmu-on-vmalle1", "mmu-on-vmalle1is"):
        tlbi = replace(BASE, variant=name)
        found = conclusions([_effect(on_off, PRESENT), _effect(tlbi, ABSENT)])
        assert [c.text.split(" (")[0] for c in found] == [
            f"cleared by the guest's own TLBI {name.removeprefix('mmu-on-').upper()}"
        ]


def test_hotplug_has_its_negative_control() -> None:
    """Review of 17, point 9: a CPU that did not run the guest, hotplugged, is the control."""
    none, hotplug = replace(BASE, after_guest="none"), replace(BASE, after_guest="hotplug")
    other = replace(BASE, after_guest="hotplug-other")
    found = conclusions([_effect(none, PRESENT), _effect(hotplug, ABSENT), _effect(other, PRESENT)])
    texts = {c.text for c in found}
    assert "cleared by hotplugging the CPU that ran the guest, not another one" in texts
    assert "not cleared by hotplugging a CPU that did not run the guest" in texts
    found = conclusions([_effect(none, PRESENT), _effect(other, ABSENT)])
    assert [c.text for c in found] == ["cleared by hotplugging a CPU that did not run the guest"]


def test_one_bundles_action_says_what_it_runs_on_its_kernel(tmp_path: Path) -> None:
    """Point 12: a hotplug is a power cycle and a boot path first; what EL2 then runs is
    per kernel (6.1 nVHE nothing with no VM alive, 6.12 nVHE ALLE2 + ALLE1, VHE no EL2
    init, elsewhere not known); a rollover is many VMs and one ALLE1IS. A hotplug
    bundle's before/after section says it."""
    from tracekit.analysis.decision import action_meaning
    from tracekit.report.sections import beforeafter

    assert action_meaning("none", "6.1", "nvhe") is None
    on61 = str(action_meaning("hotplug", "6.1", "nvhe"))
    assert "power cycle" in on61 and "no EL2 invalidation" in on61
    assert "TLBI ALLE2 and ALLE1" in str(action_meaning("hotplug", "6.12", "nvhe"))
    assert "no EL2 init (VHE)" in str(action_meaning("hotplug-other", "6.12", "vhe"))
    assert "not known" in str(action_meaning("hotplug", "7.1", "protected"))
    rollover = str(action_meaning("rollover", "6.1", "nvhe"))
    assert "one TLBI ALLE1IS" in rollover and "not separated" in rollover
    bundle = load_bundle(generate(tmp_path / "h", Spec(after_guest="hotplug", seed=3)))
    found = beforeafter.section([bundle])
    assert found is not None
    assert any(f.startswith("after-guest hotplug: PSCI CPU_OFF") for f in found.findings)


def test_el2_invalidation_actions_point_at_the_guest_cpu() -> None:
    """kpatch's actions: ALLE1 on the guest CPU clears, on another not: the guest CPU holds it."""
    guest = replace(BASE, after_guest="tlbi:alle1@guest-cpu")
    other = replace(BASE, after_guest="tlbi:alle1@other-cpu")
    vmid = replace(BASE, after_guest="tlbi:vmalls12e1is@vmid")
    effects = [
        _effect(BASE, PRESENT),
        _effect(guest, ABSENT),
        _effect(other, PRESENT),
        _effect(vmid, PRESENT),
    ]
    texts = [c.text for c in conclusions(effects)]
    assert "cleared by a local TLBI ALLE1 at EL2 on the CPU that ran the guest" in texts
    assert "cleared by a local TLBI ALLE1 on the CPU that ran the guest, not on another" in texts
    assert "not cleared by TLBI VMALLS12E1IS of the dead guest's VMID (stage 2 disabled)" in texts
    said = {(r.field, r.b, r.b_verdict): r.implies for r in RULES}
    assert "___kvm_hyp_init" in said[("after_guest", "tlbi:alle1@guest-cpu", ABSENT)]


def test_rollover_control_separates_the_alle1is_from_the_vms() -> None:
    """rollover-minus-one: the same VMs without the rollover; each pair says what it shows."""
    control = replace(BASE, after_guest="rollover-minus-one")
    rolled = replace(BASE, after_guest="rollover")
    only_rollover = conclusions([_effect(control, PRESENT), _effect(rolled, ABSENT)])
    assert [c.text for c in only_rollover] == [
        "cleared by the VMID rollover itself, not by the VMs before it"
    ]
    by_vms = conclusions([_effect(BASE, PRESENT), _effect(control, ABSENT)])
    assert [c.text for c in by_vms] == [
        "cleared by the throwaway VMs of a rollover, without the rollover"
    ]


def test_cpu_features_and_thp_are_condition_fields_unknown_in_old_bundles() -> None:
    """FEAT_TLBIRANGE, FEAT_FWB and THP from host facts; a bundle lacking them pools with none."""
    new = bundle_condition(_manifest("Cortex-A76", "nvhe", guest_revision="2", backing="thp"))
    assert (new.tlbirange, new.fwb, new.repeat_tlbi, new.thp) == ("no", "no", "yes", "always")
    madvise = _manifest("Cortex-A76", "nvhe", guest_revision="2", backing="thp")
    madvise.host["thp"] = {"enabled": "madvise"}
    assert bundle_condition(madvise).differs_only_in(new) == "thp"
    old = _manifest("Cortex-A76", "nvhe", guest_revision="2", backing="thp")
    del old.host["features"], old.host["thp"]
    rotated = _manifest("Cortex-A76", "nvhe", guest_revision="2", backing="thp")
    rotated.host["features"] = {k: {"present": None} for k in ("tlbirange", "fwb")}
    for lacking in (bundle_condition(old), bundle_condition(rotated)):
        assert str(lacking.tlbirange) == "unknown" and lacking.differs_only_in(new) is None
        assert str(lacking.repeat_tlbi) == "unknown"


def test_plugin_virt_at_load_and_probe_slots_are_condition_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of 15/17 #11 and #6: the ground-truth plugin, kvm.enable_virt_at_load and
    the probe's modes and page counts are condition fields; where a bundle does not
    record them they are unknown (a board: no plugin), and the readers behind them say
    what the host said."""
    from tracekit.host.facts import groundtruth_plugin
    from tracekit.host.kvmstate import read_enable_virt_at_load

    base = _manifest("Cortex-A76", "nvhe")
    c = bundle_condition(base)
    assert (c.enable_virt_at_load, c.groundtruth_plugin, c.probe) == ("yes", "no", "page")
    old = _manifest("Cortex-A76", "nvhe")
    for key in ("kvm_params", "groundtruth_plugin"):
        old.host.pop(key)
    old.scenario.pop("probe_modes")
    unknown = bundle_condition(old)
    assert {"enable_virt_at_load", "groundtruth_plugin", "probe"} <= set(unknown.differing(c))
    # Ground truth added to the bundle says the plugin ran, whatever was recorded.
    old.files["groundtruth/vhost-groundtruth.tkgt"] = {"sha256": "0", "size": 1}
    assert bundle_condition(old).groundtruth_plugin == "yes"
    ranged = _manifest("Cortex-A76", "nvhe")
    ranged.scenario |= {
        "probe_modes": ["range", "munmap"],
        "parameters": {"probe_pages": [16, 1024]},
    }
    assert bundle_condition(ranged).probe == "range,munmap x 16,1024 pages"
    param = tmp_path / "enable_virt_at_load"
    assert read_enable_virt_at_load(param) == "absent"  # 6.1: no such parameter
    param.write_text("Y\n")
    assert read_enable_virt_at_load(param) == "yes"
    param.write_text("N\n")
    assert read_enable_virt_at_load(param) == "no"
    monkeypatch.setenv("TRACEKIT_VHOST", "1")
    monkeypatch.setenv("TRACEKIT_VHOST_GROUND_TRUTH", "1")
    assert groundtruth_plugin(True) == "yes" and groundtruth_plugin(False) == "no"
    monkeypatch.delenv("TRACEKIT_VHOST_GROUND_TRUTH")
    assert groundtruth_plugin(True) == "no"
