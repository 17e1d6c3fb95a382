"""The decision table: the effect per condition, and what follows from pairs of conditions.

Each bundle is one condition (tracekit/analysis/conditions.py) and one boot. Per condition
the primary metric is compared after vs before: over runs for one bundle, over boots when
several bundles share the condition (runs of one boot share its state). Conclusions come
only from `RULES`, stated as data: two conditions that differ in exactly one field, with
the verdicts a rule names, give that rule's conclusion and what it implies about where
the state is. A rule whose pattern fits but where one side is inconclusive becomes an
open question, with the runs needed when that is known.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import polars as pl

from tracekit.analysis.beforeafter import PRIMARY, while_saturated
from tracekit.analysis.compare import (
    ABSENT,
    INCONCLUSIVE,
    PRESENT,
    Comparison,
    Thresholds,
    compare,
)
from tracekit.analysis.conditions import FIELD_LABELS, Condition
from tracekit.analysis.runs import TAIL_METRICS, metric_values, run_metrics
from tracekit.errors import TracekitError

PHASES = ("before", "after")


@dataclass(frozen=True)
class Rule:
    """If condition A shows `a_verdict` and B, differing only in `field`, shows `b_verdict`."""

    field: str  # a Condition field
    a: str | None  # its value in A; None: any value
    a_verdict: str
    b: str | None
    b_verdict: str
    conclusion: str  # may name {a} and {b}
    implies: str  # what it says about where the state is
    # Fields the contrast cannot hold equal (another cluster is another guest CPU).
    entails: tuple[str, ...] = ()
    # Fields that may differ only where one side's kernel lacks them ("absent"): a setting
    # both kernels have, set differently, is a contrast of its own, not the kernel's.
    entails_absent: tuple[str, ...] = ()

    def matches(self, a: Condition, b: Condition) -> bool:
        """Whether A and B differ in this rule's field and nothing else, with its values."""
        diff = set(a.differing(b))
        lacking = {f for f in self.entails_absent if "absent" in (getattr(a, f), getattr(b, f))}
        if self.field not in diff or not diff <= {self.field, *self.entails, *lacking}:
            return False
        # The same --knob overrides on two variants can make them one guest: a variant
        # rule compares presets as they are, so both sides must run without overrides.
        if self.field == "variant" and not a.knobs == b.knobs == "none":
            return False
        return self.a in (None, getattr(a, self.field)) and self.b in (None, getattr(b, self.field))

    def sentence(self, a: Condition, b: Condition) -> str:
        """The rule as applied: 'present for X, absent for Y -> conclusion'."""
        va, vb = getattr(a, self.field), getattr(b, self.field)
        head = f"{self.a_verdict} for {va}, {self.b_verdict} for {vb}"
        return f"{head} -> {self.conclusion.format(a=va, b=vb)}"


def _rule(
    field: str,
    a: str | None,
    av: str,
    b: str | None,
    bv: str,
    c: str,
    i: str,
    entails: tuple[str, ...] = (),
    entails_absent: tuple[str, ...] = (),
) -> Rule:
    """Shorthand for the table below."""
    return Rule(field, a, av, b, bv, c, i, entails, entails_absent)


# The conclusions tracekit may draw, each with its evidence pattern. Order: creation,
# what does not clear it, what clears it, where it reaches, mode and kernel. Each
# implication says what that one contrast shows and no more; the kernel facts behind
# them (read in the kernel source, arch/arm64/kvm):
# - HCR_GUEST_FLAGS (arch/arm64/include/asm/kvm_arm.h) has HCR_FB and HCR_BSU_IS: a
#   guest's TLBI VMALLE1 is executed as if it were VMALLE1IS, so no guest TLBI is local.
# - mmu-on vs mmu-off is more than stage 1: without FEAT_FWB the guest's MAIR/TCR/TTBR/
#   SCTLR writes trap (HCR_EL2.TVM, set only without FWB: 6.1.176 kvm_emulate.h
#   vcpu_reset_hcr, sys_regs.c access_vm_reg) and, when M and C both go on,
#   kvm_toggle_cache (mmu.c) flushes the whole stage 2 (stage2_flush_vm); with FWB only
#   a set/way operation does (kvm_set_way_flush, while TVM is clear).
# - EL2 init (nVHE): ___kvm_hyp_init (nvhe/hyp-init.S), local to the CPU that runs it,
#   differs per kernel (analysis/gtsignatures.toml): 6.1 issues `tlbi alle2; tlbi
#   vmalls12e1; dsb sy` with VTTBR_EL2 = 0 (VMID 0; read in 6.1.176's source, seen in
#   emulation), 6.12 TLBI ALLE2 and ALLE1 (6.12.107 hyp/nvhe/hyp-init.S:143-144 `tlbi
#   alle2; tlbi alle1; dsb sy`; seen in emulation).
#   arm.c's cpu_hyp_reinit runs it; cpu_hyp_reset puts EL2 back to the stub.
# - hotplug is PSCI CPU_OFF then CPU_ON, a power cycle of the core (in QEMU a CPU
#   reset); the secondary boot runs __cpu_setup (arch/arm64/mm/proc.S), which starts
#   with a local `tlbi vmalle1; dsb nsh` (host EL1&0). What EL2 runs afterwards differs
#   per kernel: 6.12 re-initialises EL2 on the re-plugged CPU (___kvm_hyp_init); 6.1
#   runs no EL2 invalidation there while no VM is alive.
# - 6.1 enables virtualisation only while a VM exists (kvm_main.c hardware_enable_all
#   on every online CPU when the first VM is created, kvm_arch_hardware_disable ->
#   cpu_hyp_reset when the last goes, outside protected mode): each VM created with
#   none alive runs ___kvm_hyp_init on every online CPU.
# - CPU_PM: hyp_init_cpu_pm_notifier (arm.c) calls cpu_hyp_reinit on CPU_PM_EXIT
#   whenever hyp was enabled on that CPU: a power-down idle exit re-runs ___kvm_hyp_init.
#   On 6.12 (virtualisation enabled at module load, kvm.enable_virt_at_load) that is
#   every such exit; on 6.1 only while a VM is alive.
# - a rollover is the 2^bits - 1 usable VMIDs (255 with 8-bit, 65535 with 16-bit VMIDs;
#   VMID 0 is reserved) used up by throwaway VMs, the next allocation rolling over with
#   one TLBI ALLE1IS (__kvm_flush_vm_context from vmid.c): eviction by
#   those VMs is not separated from it.
_FB = " (executed as broadcast: KVM sets HCR_EL2.FB)"
# Under FB, VMALLE1 and VMALLE1IS are one experiment: one implication for both.
_NOT_BY_GUEST_TLBI = (
    "an invalidation of the guest VMID's EL1&0 stage-1 entries on every CPU of the"
    " inner-shareable domain, issued by the guest with its MMU off, does not remove it"
)
# What runs on a re-plugged CPU, per kernel (nVHE; with VHE no EL2 init runs).
_REPLUG = (
    "the power cycle and the boot path (firmware CPU_ON, __cpu_setup's local TLBI"
    " VMALLE1), then in nVHE on 6.12 the EL2 init's local TLBI ALLE2 and ALLE1"
    " (___kvm_hyp_init; that ALLE1 is the brief's clearing operation itself), on 6.1"
    " with no VM alive no EL2 invalidation"
)
# What a local TLBI ALLE1 at EL2 discards, and what the debug interface adds around it.
_ALLE1_SCOPE = (
    "EL1&0 entries and cached walks of every VMID on that CPU; on 6.1 in nVHE with no VM"
    " alive the interface also runs the EL2 init there first (___kvm_hyp_init: TLBI"
    " ALLE2, VMALLS12E1 of VMID 0)"
)
_VMIDS = "2^bits - 1 (255 with 8-bit, 65535 with 16-bit VMIDs: every usable one)"
# run_after_guest runs the throwaway VMs one after another: on 6.1 each is created with
# none alive, so each brings EL2 up again on every CPU (the guest's included), and its
# first vCPU load flushes the guest CPU with VMID 0 (6.1.176 arm.c:425, before :929).
_PER_VM_INIT = (
    "on 6.1 (nVHE) the local TLBI ALLE2 and VMALLS12E1 of VMID 0 (___kvm_hyp_init; no"
    " ALLE1) that every VM creation with none alive runs on every CPU, the guest's"
    " included, and the TLBI VMALLE1 of each VM's first vCPU load, its VMID still 0"
    " (__kvm_flush_cpu_context: the host's own tag), on the guest CPU"
)


# What an after-guest action runs, per kernel series and KVM mode, for one bundle's
# result (the facts above; nVHE's EL2 side as emulation counted it).
_HOTPLUG_EL2 = {
    ("6.1", "nvhe"): "then no EL2 invalidation (6.1 with no VM alive)",
    ("6.12", "nvhe"): "then the EL2 init's local TLBI ALLE2 and ALLE1 (___kvm_hyp_init)",
}


def action_meaning(action: str, series: str, kvm_mode: str) -> str | None:
    """What a bundle's after-guest ACTION runs on its kernel series and KVM mode, so what
    a result after it can mean; None: no action, or one this does not describe."""
    if action in ("hotplug", "hotplug-other"):
        cpu = "the guest CPU" if action == "hotplug" else "a CPU that did not run the guest"
        el2 = _HOTPLUG_EL2.get((series, kvm_mode))
        if kvm_mode == "vhe":
            el2 = "then no EL2 init (VHE)"
        return (
            f"after-guest {action}: PSCI CPU_OFF then CPU_ON of {cpu}, a power cycle of that"
            " core and its boot path (__cpu_setup's local TLBI VMALLE1), "
            + (el2 or f"then what EL2 runs on {series} {kvm_mode} is not known")
            + "; a result after it may follow from any of these"
        )
    if action == "rollover":
        extra = f"; also {_PER_VM_INIT}" if (series, kvm_mode) == ("6.1", "nvhe") else ""
        return (
            f"after-guest rollover: {_VMIDS} throwaway VMs, then one TLBI ALLE1IS"
            f" (__kvm_flush_vm_context): eviction by those VMs is not separated from it{extra}"
        )
    if action == "rollover-minus-one":
        return "after-guest rollover-minus-one: the rollover's throwaway VMs but one, no rollover"
    return None


# The cluster is topology/cluster_id (the DT cpu-map); entails covers placement only.
_CLUSTER = (
    "; the cluster is the kernel's topology/cluster_id (DT cpu-map): on DynamIQ SoCs"
    " (RK3588) all cores share one DSU and L3, so another cluster is not across a"
    " coherency or DVM boundary; a pair whose guest core type also differs (guest on"
    " A55 vs A76) never fires this rule"
)
_BY_GUEST_TLBI = (
    "the guest's invalidation of its VMID's EL1&0 stage-1 entries, broadcast to every"
    " CPU, removes it; this does not say on which CPU the state was"
)
RULES: tuple[Rule, ...] = (
    _rule("variant", "mmu-on", PRESENT, "mmu-off", ABSENT,
          "created by what an MMU-on guest does and an MMU-off guest does not",
          "something the MMU-on guest does creates the state, among others: its stage-1"
          " translation, its cacheable accesses and table walks, its I-cache on, its"
          " trapped VM-register writes or the stage-2 flush KVM runs when its MMU and"
          " caches go on (both only without FEAT_FWB: with it nothing traps, and a whole"
          " stage-2 flush comes only from a set/way operation); this contrast does not"
          " tell which, and a VMID that ran is not enough"),
    _rule("variant", "mmu-on", PRESENT, "mmu-on-off", PRESENT,
          "created even when the guest turns its MMU off again",
          "the guest's stage 1 need not be on at its power-off and teardown (it still"
          " exits with the MMU on for its dose pages' stage-2 faults)"),
    _rule("variant", "mmu-on", PRESENT, "mmu-on-nocache", PRESENT,
          "created with the guest's caches off too",
          "the guest's caches need not be on, nor the stage-2 flush KVM runs only when"
          " the guest's MMU and caches are both on (kvm_toggle_cache)"),
    # Guest revision 2: the TLBI presets read pages with the MMU on, turn it off, then
    # invalidate; their control is mmu-on-off, with the same dose (reproducer/README.md).
    _rule("variant", "mmu-on-off", PRESENT, "mmu-on-vmalle1", PRESENT,
          "not cleared by the guest's own TLBI VMALLE1" + _FB,
          _NOT_BY_GUEST_TLBI),
    _rule("variant", "mmu-on-off", PRESENT, "mmu-on-vmalle1is", PRESENT,
          "not cleared by the guest's own TLBI VMALLE1IS",
          _NOT_BY_GUEST_TLBI),
    _rule("variant", "mmu-on-off", PRESENT, "mmu-on-vmalle1", ABSENT,
          "cleared by the guest's own TLBI VMALLE1" + _FB, _BY_GUEST_TLBI),
    _rule("variant", "mmu-on-off", PRESENT, "mmu-on-vmalle1is", ABSENT,
          "cleared by the guest's own TLBI VMALLE1IS", _BY_GUEST_TLBI),
    _rule("variant", "mmu-on", PRESENT, "mmu-on-report", PRESENT,
          "created with or without the report's TLBI VMALLE1 before the MMU goes on",
          "the guest's pre-enable TLBI VMALLE1 (broadcast under FB) is not what creates"
          " it, nor does it prevent it"),
    _rule("variant", "mmu-on", ABSENT, "mmu-on-report", PRESENT,
          "created only with the report's TLBI VMALLE1 before the MMU goes on" + _FB,
          "the report's guest differs from mmu-on by that one broadcast TLBI before"
          " enabling its MMU: the TLBI, or what it does together with the MMU going on,"
          " is needed"),
    _rule("after_guest", "none", PRESENT, "hotplug", ABSENT,
          "cleared by hotplugging the guest CPU (PSCI CPU_OFF, CPU_ON)",
          "a power cycle of the guest CPU (in QEMU a CPU reset) removes it, or what then"
          " runs there: " + _REPLUG + ". On 6.12 a power-down idle exit re-runs that"
          " EL2 init too (CPU_PM, virtualisation enabled with no VM alive; on 6.1 only"
          " while a VM is alive), in a none run as in a hotplug run: a confound only"
          " where the guest CPU's power-down idle entries (not WFI) differ between the"
          " two; and a 6.12 none PRESENT after such entries already shows that an"
          " ALLE2 + ALLE1 on the guest CPU alone did not clear it"),
    _rule("after_guest", "none", PRESENT, "hotplug", PRESENT,
          "not cleared by hotplugging the guest CPU",
          "neither a power cycle of the guest CPU nor what then runs there ("
          + _REPLUG + ") removes it"),
    # hotplug-other is hotplug's negative control: a stress CPU that did not run the guest.
    _rule("after_guest", "none", PRESENT, "hotplug-other", PRESENT,
          "not cleared by hotplugging a CPU that did not run the guest",
          "a hotplug elsewhere (its power cycle, boot path and EL2 init on that CPU only)"
          " does not remove it: the control for the guest-CPU hotplug rules"),
    _rule("after_guest", "none", PRESENT, "hotplug-other", ABSENT,
          "cleared by hotplugging a CPU that did not run the guest",
          "a hotplug removes it even on a CPU the guest never ran on, so a guest-CPU"
          " hotplug result does not point at the guest CPU: what a hotplug does beyond"
          " the re-plugged CPU (or the time it takes) is enough"),
    _rule("after_guest", "hotplug", ABSENT, "hotplug-other", PRESENT,
          "cleared by hotplugging the CPU that ran the guest, not another one",
          "what a hotplug runs on the re-plugged CPU removes it only there: " + _REPLUG),
    _rule("after_guest", "none", PRESENT, "rollover", ABSENT,
          "cleared by a VMID rollover (" + _VMIDS + " VMs, then TLBI ALLE1IS)",
          "a rollover run removes it: the TLBI ALLE1IS that ends it, eviction by the"
          " throwaway VMs before it, or " + _PER_VM_INIT + "; this contrast does not"
          " separate them"),
    _rule("after_guest", "none", PRESENT, "rollover", PRESENT,
          "not cleared by a VMID rollover",
          "neither " + _VMIDS + " VMs, nor TLBI ALLE1IS, nor " + _PER_VM_INIT
          + " removes it: it is not EL1&0 TLB content that ALLE1IS invalidates"),
    # tlbi:OP@TARGET: one EL2 invalidation from reproducer/kpatch's interface (a kernel
    # with the series); alle1@other-cpu is alle1@guest-cpu's negative control.
    _rule("after_guest", "none", PRESENT, "tlbi:alle1@guest-cpu", ABSENT,
          "cleared by a local TLBI ALLE1 at EL2 on the CPU that ran the guest",
          "invalidating that CPU's EL1&0 TLB entries of every VMID, both stages, removes it,"
          " or what that invalidation also discards there (" + _ALLE1_SCOPE + ")"),
    _rule("after_guest", "none", PRESENT, "tlbi:alle1@guest-cpu", PRESENT,
          "not cleared by a local TLBI ALLE1 at EL2 on the CPU that ran the guest",
          "it is not EL1&0 TLB content of the guest CPU that ALLE1 invalidates"),
    _rule("after_guest", "none", PRESENT, "tlbi:alle1@other-cpu", PRESENT,
          "not cleared by a local TLBI ALLE1 at EL2 on a CPU that did not run the guest",
          "the control for the guest-CPU ALLE1 rules: the same invalidation elsewhere"
          " does not remove it"),
    _rule("after_guest", "none", PRESENT, "tlbi:alle1@other-cpu", ABSENT,
          "cleared by a local TLBI ALLE1 at EL2 on a CPU that did not run the guest",
          "an ALLE1 removes it even on a CPU the guest never ran on, so the guest-CPU"
          " ALLE1 result does not point at the guest CPU"),
    _rule("after_guest", "tlbi:alle1@guest-cpu", ABSENT, "tlbi:alle1@other-cpu", PRESENT,
          "cleared by a local TLBI ALLE1 on the CPU that ran the guest, not on another",
          "the state is held by the CPU that ran the guest, in what its ALLE1 discards ("
          + _ALLE1_SCOPE + "), as the brief reports"),
    _rule("after_guest", "none", PRESENT, "tlbi:vmalls12e1is@vmid", PRESENT,
          "not cleared by TLBI VMALLS12E1IS of the dead guest's VMID (stage 2 disabled)",
          "invalidating that VMID's entries the way KVM's own nVHE VMID flush issues it"
          " (HCR_EL2.VM clear) does not remove it; with stage 2 enabled is another run"),
    _rule("after_guest", "none", PRESENT, "tlbi:vmalls12e1is@vmid", ABSENT,
          "cleared by TLBI VMALLS12E1IS of the dead guest's VMID (stage 2 disabled)",
          "invalidating the dead guest VMID's EL1&0 entries on every CPU of the"
          " inner-shareable domain removes it"),
    # rollover-minus-one is rollover's negative control: the same VMs but one, so the
    # allocator never rolls over and no TLBI ALLE1IS is issued.
    _rule("after_guest", "none", PRESENT, "rollover-minus-one", ABSENT,
          "cleared by the throwaway VMs of a rollover, without the rollover",
          "the VMs that use up the VMIDs (a rollover's VMs but one) remove it with no TLBI"
          " ALLE1IS: eviction by those VMs, or "
          + _PER_VM_INIT + "; a rollover result then does not point at its ALLE1IS"),
    _rule("after_guest", "none", PRESENT, "rollover-minus-one", PRESENT,
          "not cleared by the throwaway VMs of a rollover, without the rollover",
          "the VMs that use up the VMIDs (a rollover's VMs but one), and " + _PER_VM_INIT
          + ", do not remove it: the control"
          " for the rollover rules"),
    _rule("after_guest", "rollover-minus-one", PRESENT, "rollover", ABSENT,
          "cleared by the VMID rollover itself, not by the VMs before it",
          "what the rollover adds to its VMs removes it: the allocator's TLBI ALLE1IS"
          " (__kvm_flush_vm_context) and one VM more, which after flush_context takes the"
          " lowest free VMID (vmid.c new_vmid: find_next_zero_bit from 1), often a low one"
          " and possibly the dead guest's own"),
    _rule("guest_cluster", "same", PRESENT, "other", PRESENT,
          "also when the guest ran in another cluster",
          "the guest need not run in the rt CPU's cluster: the effect reaches the rt CPU"
          " across clusters" + _CLUSTER, ("placement",)),
    _rule("guest_cluster", "same", PRESENT, "other", ABSENT,
          "only when the guest ran in the rt CPU's cluster",
          "the guest CPU's cluster matters; this does not say where the state is (the"
          " guest CPU itself or something its cluster shares)" + _CLUSTER, ("placement",)),
    _rule("kvm_mode", "nvhe", PRESENT, "vhe", ABSENT,
          "specific to nVHE: absent with VHE",
          "it depends on KVM's mode: nVHE and VHE differ in where the host runs (EL1 or"
          " EL2), in the world switch and in the invalidations KVM issues; this contrast"
          " does not tell which"),
    _rule("kvm_mode", "nvhe", PRESENT, "protected", ABSENT,
          "no before/after change in protected mode",
          "with pKVM the host runs under stage 2 from boot; compare the before values"),
    # 6.1 has no kvm.enable_virt_at_load ("absent"), 6.12 has it on by default: a kernel
    # change carries it along, so the contrast cannot hold it equal across 6.1 and 6.12;
    # two kernels that both have it, set yes and no, differ by a boot parameter instead.
    _rule("kernel", None, PRESENT, None, ABSENT,
          "depends on the kernel: present with {a}, absent with {b}",
          "something that differs between these kernels removes or hides it (their"
          " kvm.enable_virt_at_load among others: with it EL2 stays initialised while no"
          " VM exists; the contrast does not say which difference)",
          entails_absent=("enable_virt_at_load",)),
)  # fmt: skip


@dataclass(frozen=True)
class ConditionEffect:
    """One condition's before/after comparison of the primary metric."""

    condition: Condition
    bundles: tuple[str, ...]
    comparison: Comparison
    unit: str = "runs"  # "boots" when several bundles of the condition were pooled


@dataclass(frozen=True)
class Conclusion:
    """What a rule concludes from two conditions (or asks, when one side is undecided)."""

    text: str
    rule: str  # the rule as applied, with its verdicts
    implies: str
    evidence: tuple[Condition, Condition]
    settled: bool  # False: an open question, one side inconclusive
    runs_needed: int | None = None


def condition_effects(
    groups: Mapping[Condition, list[tuple[str, pl.DataFrame]]],
    primary: str = PRIMARY,
    kind: str = "quiet",
    thresholds: Thresholds | None = None,
    saturated: Collection[str] = (),
) -> list[ConditionEffect]:
    """Per condition, the primary metric after vs before: over runs, or over boots.

    One bundle of a condition: its runs are the units. Several bundles (boots) of it: each
    boot is one unit, valued at the mean of its runs. A condition with a bundle labelled
    in `saturated` (its rt CPU could not keep up: beforeafter.saturated) gets no verdict
    any run count could reach (beforeafter.while_saturated).
    """
    options = {} if thresholds is None else {"thresholds": thresholds}
    effects = []
    for condition in sorted(groups):
        bundles = groups[condition]
        unit = "runs" if len(bundles) == 1 else "boots"
        values = {phase: _unit_values(bundles, phase, kind, primary) for phase in PHASES}
        comparison = compare(
            values["before"]["value"].to_list(),
            values["after"]["value"].to_list(),
            f"cyclictest {primary}" + ("" if unit == "runs" else " (boot means)"),
            before_runs=values["before"]["unit"].to_list(),
            after_runs=values["after"]["unit"].to_list(),
            **options,
        )
        labels = tuple(label for label, _ in bundles)
        [comparison] = while_saturated([comparison], bool(set(labels) & set(saturated)))
        effects.append(ConditionEffect(condition, labels, comparison, unit))
    return effects


def _unit_values(
    bundles: list[tuple[str, pl.DataFrame]], phase: str, kind: str, primary: str
) -> pl.DataFrame:
    """unit, value: one per run of the one bundle, or one per bundle (its runs' mean)."""
    frames = []
    for label, latencies in bundles:
        runs = latencies.filter((pl.col("kind") == kind) & (pl.col("phase") == phase))
        if runs.height == 0:
            raise TracekitError(
                f"decision table: bundle {label} has no {kind} {phase} runs with cyclictest"
                " samples; record them with `tracekit collect --runs N`"
            )
        per_run = run_metrics(runs, tail=primary in TAIL_METRICS)
        frames.append(
            pl.DataFrame(
                {
                    "bundle": label,
                    "unit": per_run["run_id"],
                    "value": metric_values(per_run, primary),
                }
            )
        )
    if len(frames) == 1:
        return frames[0]
    # Runs of one boot share that boot's state: the boot is the unit of replication.
    return (
        pl.concat(frames)
        .group_by("bundle", maintain_order=True)
        .agg(pl.col("bundle").first().alias("unit"), pl.col("value").mean())
    )


def decision_table(effects: list[ConditionEffect], varying: tuple[str, ...]) -> pl.DataFrame:
    """One row per condition: condition, n (runs or boots), ratio, ci_low, ci_high, verdict."""
    rows = [
        {
            "condition": e.condition.label(varying),
            "n": f"{e.comparison.n_before}+{e.comparison.n_after} {e.unit}",
            "ratio": round(e.comparison.ratio, 2),
            "ci_low": _rounded(e.comparison.ci_low),
            "ci_high": _rounded(e.comparison.ci_high),
            "verdict": e.comparison.verdict,
        }
        for e in effects
    ]
    schema = {"condition": pl.String, "n": pl.String, "ratio": pl.Float64}
    schema |= {"ci_low": pl.Float64, "ci_high": pl.Float64, "verdict": pl.String}
    return pl.DataFrame(rows, schema=schema)


def _rounded(value: float) -> float | None:
    """To two decimals; None (shown as n/a) for an interval a phase of one run cannot give."""
    return round(value, 2) if math.isfinite(value) else None


def conclusions(
    effects: list[ConditionEffect], rules: tuple[Rule, ...] = RULES
) -> list[Conclusion]:
    """Every rule that two conditions satisfy (settled), or nearly do (open), in rule order."""
    out: list[Conclusion] = []
    asked: set[tuple[str, Condition, Condition]] = set()
    for rule in rules:
        for a in effects:
            for b in effects:
                if a is b or not rule.matches(a.condition, b.condition):
                    continue
                found = _apply(rule, a, b, asked)
                if found is not None:
                    out.append(found)
    return out


def _apply(
    rule: Rule,
    a: ConditionEffect,
    b: ConditionEffect,
    asked: set[tuple[str, Condition, Condition]],
) -> Conclusion | None:
    """The rule's conclusion for this pair, an open question, or None."""
    va, vb = a.comparison.verdict, b.comparison.verdict
    evidence = (a.condition, b.condition)
    text = rule.conclusion.format(
        a=getattr(a.condition, rule.field), b=getattr(b.condition, rule.field)
    )
    if (va, vb) == (rule.a_verdict, rule.b_verdict):
        return Conclusion(text, rule.sentence(*evidence), rule.implies, evidence, settled=True)
    key = (rule.field, a.condition, b.condition)
    sides = ((a, va, rule.a_verdict), (b, vb, rule.b_verdict))
    undecided = [e for e, v, _ in sides if v == INCONCLUSIVE]
    decided = [(v, want) for _, v, want in sides if v != INCONCLUSIVE]
    # An open question needs one side that already shows what the rule expects.
    if len(undecided) != 1 or decided[0][0] != decided[0][1] or key in asked:
        return None
    asked.add(key)
    needed = max((c.comparison.needed_runs or 0) for c in undecided) or None
    return Conclusion(text, rule.sentence(*evidence), rule.implies, evidence, False, needed)


def describe_conclusion(c: Conclusion, varying: tuple[str, ...]) -> str:
    """One finding: the conclusion, the rule that produced it and what it implies."""
    pair = f"{c.evidence[0].label(varying)} vs {c.evidence[1].label(varying)}"
    if c.settled:
        return f"{c.text.capitalize()} (rule: {c.rule}; {pair}). Implies: {c.implies}."
    more = f"; needs {c.runs_needed}+{c.runs_needed} runs" if c.runs_needed else ""
    return f"Open: {c.text}? (rule: {c.rule}; {pair}: one side inconclusive{more})."


def field_names(varying: tuple[str, ...]) -> str:
    """The varying fields' display names, for the table's note."""
    return ", ".join(FIELD_LABELS[name] for name in varying) or "none"
