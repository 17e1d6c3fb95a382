"""The ground truth's invalidations counted and checked against the expected signatures
(tracekit/analysis/groundtruth.py, gtsignatures.toml), on the real fixture boot
(tests/fixtures/groundtruth/README.md: one VM in nVHE on bookworm's 6.1, 4 x cortex-a76)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis import groundtruth as g
from tracekit.analysis.gtsignatures import (
    STEPS,
    kernel_series,
    packaged_signatures,
    parse_signatures,
)
from tracekit.errors import TracekitError
from tracekit.host.protocol import AFTER_GUEST_ACTIONS
from tracekit.ingest.groundtruth import load_ground_truth
from tracekit.ingest.vmm import parse_vmm_output

FIXTURE = Path(__file__).parent / "fixtures" / "groundtruth" / "nvhe-a76"
SETUP = ("6.1", "nvhe", "cortex-a76")
CONTEXT = g.StepContext(online=(0, 1, 2, 3), guest=(1,))
# The backing the run signatures require, given so that they are checked: the fixture's
# VMM ran with its default backing (before --backing), which its bundle cannot say. The
# REPEAT_TLBI workaround is active on it (its vhost-boot-dmesg.txt: "CPU features:
# detected: Broken broadcast TLBI completion").
FACTS = {"backing": "4k", "repeat_tlbi": "yes"}


@pytest.fixture(scope="module")
def given() -> pl.DataFrame:
    """The fixture's table, all of it given to one run called guest."""
    table = load_ground_truth(FIXTURE).table
    return table.with_columns(run_id=pl.lit("guest"), phase=pl.lit("guest"))


@pytest.fixture(scope="module")
def steps() -> pl.DataFrame:
    """The fixture VM's create, run and teardown windows from its VMM output."""
    vms = parse_vmm_output((FIXTURE / "vmm.txt").read_text()).vms
    return g.vm_steps(vms, "guest")


def _summary(
    given: pl.DataFrame,
    steps: pl.DataFrame,
    calls: dict[str, pl.DataFrame] | None = None,
    **probes: int,
) -> g.GroundTruthSummary:
    """summarise with the packaged signatures, the fixture's setup and CPUs."""
    return g.summarise(
        given, steps, packaged_signatures(), SETUP, CONTEXT, probes, ["guest"], calls, FACTS
    )


def test_vm_steps_from_the_vmm_output(steps: pl.DataFrame) -> None:
    """create, run and teardown windows, on the VMM's (the trace's) clock."""
    assert steps["step"].to_list() == ["create", "run", "teardown"]
    assert steps.row(0, named=True)["start"] == 14333229296
    assert steps.row(1, named=True)["start"] == 14333229296 + 44612400
    assert steps.row(2, named=True)["end"] == 14491251760


def test_the_fixture_boot_matches_the_6_1_nvhe_signatures(given, steps) -> None:
    """Creation: ALLE2 + VMALLS12E1 on each of the 4 CPUs; the run: VMALLE1 + IC IALLU on
    the guest CPU; teardown: nothing at EL2. No finding."""
    summary = _summary(given, steps)
    assert summary.findings == [] and summary.uncovered == []
    assert summary.checks["ok"].all() and summary.checks.height == 10
    create = summary.by_step.filter(pl.col("step") == "create")
    assert create.group_by("operation").agg(pl.col("cpu").n_unique())["cpu"].to_list() == [4, 4]
    assert summary.by_step.filter(pl.col("step") == "teardown").height == 0


def test_a_missing_flush_and_an_extra_alle1is_are_findings(given, steps) -> None:
    """A run without the first-run flush and a teardown with an ALLE1IS at EL2 (as the
    brief's proposed fix would add) both contradict the 6.1 signature, each named."""
    no_flush = given.filter(~pl.col("symbol").fill_null("").str.contains("flush_cpu_context"))
    teardown = steps.filter(pl.col("step") == "teardown").row(0, named=True)
    extra = (
        given.filter(pl.col("where") == "hyp")
        .head(1)
        .with_columns(
            ts=pl.lit(teardown["start"] + 10, dtype=pl.Int64),
            operation=pl.lit("TLBI ALLE1IS"),
            symbol=pl.lit("__kvm_nvhe___kvm_flush_vm_context+0x10"),
        )
    )
    summary = _summary(pl.concat([no_flush, extra]), steps)
    assert len(summary.findings) == 3
    assert any(
        "guest run: TLBI VMALLE1 (__kvm_flush_cpu_context) on CPU 1: expected 1, executed 0" in f
        for f in summary.findings
    )
    assert any(
        "teardown: TLBI ALLE1IS (__kvm_flush_vm_context)" in f and ": expected 0, executed 1" in f
        for f in summary.findings
    )


def test_counts_per_phase_cpu_and_reach(given, steps) -> None:
    """Every invalidation is counted once; EL2's here are all local."""
    summary = _summary(given, steps)
    total = given.filter(pl.col("kind").is_in(g.INVALIDATION_KINDS)).height
    assert summary.by_phase["count"].sum() == total == summary.by_instruction["count"].sum()
    hyp = summary.by_instruction.filter(pl.col("where") == "hyp")
    assert set(hyp["reach"]) == {"local"}


def test_per_phase_counts_keep_the_workarounds_repeats_apart(given, steps) -> None:
    """The fixture's CPUs run the REPEAT_TLBI workaround (review 15b B1): its repeat
    TLBIs have their own reach per phase and CPU, and no broadcast count holds one."""
    summary = _summary(given, steps)
    labelled = g.by_instruction(given)
    repeats = labelled.filter(pl.col("operation").str.ends_with(", XZR (REPEAT_TLBI)")).height
    apart = summary.by_phase.filter(pl.col("reach") == g.REPEAT_REACH)
    assert repeats > 0 and apart["count"].sum() == repeats
    broadcast = labelled.filter(pl.col("reach") == "broadcast").height - repeats
    plain = summary.by_phase.filter(pl.col("reach") == "broadcast")
    assert plain["count"].sum() == broadcast


def test_a_probe_that_never_fired_on_an_executed_path_is_blind(given, steps) -> None:
    """A probe with 0 hits while its path's invalidation executed is named blind; one that
    fired on a path that executed nothing says so."""
    hyp_row = given.filter(pl.col("where") == "hyp").head(1)
    flush = hyp_row.with_columns(symbol=pl.lit("__kvm_nvhe___kvm_tlb_flush_vmid+0x30"))
    summary = _summary(
        pl.concat([given, flush]), steps, __kvm_tlb_flush_vmid=0, kvm_arm_vmid_update=2
    )
    verdicts = dict(summary.probes.select("probe", "verdict").iter_rows())
    assert verdicts["__kvm_tlb_flush_vmid"].startswith("blind")
    assert verdicts["kvm_arm_vmid_update"].startswith("fired, with no return recorded")


def test_a_flush_counts_for_a_probe_only_inside_its_calls_on_the_same_cpu(given, steps) -> None:
    """6.1 calls __kvm_tlb_flush_vmid from kvm_flush_remote_tlbs and from
    kvm_pgtable_stage2_map's break-before-make: a VMID flush outside every
    kvm_flush_remote_tlbs call (or inside one on another CPU) is not attributable to it,
    never "blind"; one inside a call on its CPU is the probe's."""
    hyp_row = given.filter(pl.col("where") == "hyp").head(1)
    at = int(hyp_row["ts"][0])
    cpu = int(hyp_row["cpu"][0])
    flush = hyp_row.with_columns(symbol=pl.lit("__kvm_nvhe___kvm_tlb_flush_vmid+0x30"))
    window = pl.DataFrame({"cpu": [cpu], "start_ts": [at - 5], "end_ts": [at + 5]})
    other_cpu = window.with_columns(cpu=pl.lit(cpu + 1))
    rows = pl.concat([given, flush])
    unfired = _summary(rows, steps, kvm_flush_remote_tlbs=0)
    verdict = unfired.probes.row(0, named=True)
    assert verdict["not_attributable"] == 1 and "not attributable" in verdict["verdict"]
    assert not verdict["verdict"].startswith("blind")
    elsewhere = _summary(rows, steps, {"kvm_flush_remote_tlbs": other_cpu}, kvm_flush_remote_tlbs=1)
    assert elsewhere.probes.row(0, named=True)["inside"] == 0
    mine = _summary(rows, steps, {"kvm_flush_remote_tlbs": window}, kvm_flush_remote_tlbs=1)
    assert mine.probes.row(0, named=True)["inside"] == 1
    assert "executed 1 invalidation" in mine.probes.row(0, named=True)["verdict"]


def test_a_probe_whose_hits_or_returns_were_missed_is_not_never_fired(given, steps) -> None:
    """No hit recorded, but kprobe_profile counts missed returns (or hits): the function
    ran, so the probe is neither blind nor "never fired"; a fired probe's calls without a
    return that its kretprobe may have missed leave the flushes outside them open."""
    hyp_row = given.filter(pl.col("where") == "hyp").head(1)
    at, cpu = int(hyp_row["ts"][0]), int(hyp_row["cpu"][0])
    flush = hyp_row.with_columns(symbol=pl.lit("__kvm_nvhe___kvm_tlb_flush_vmid+0x30"))
    rows = pl.concat([given, flush])

    def verdict(hits: int, missed: tuple[int | None, int | None], calls=None) -> dict:
        summary = g.summarise(
            rows, steps, packaged_signatures(), SETUP, CONTEXT, {"kvm_flush_remote_tlbs": hits},
            ["guest"], calls, FACTS, None, {"kvm_flush_remote_tlbs": missed},
        )  # fmt: skip
        return summary.probes.row(0, named=True)

    returns_only = verdict(0, (0, 2))
    assert returns_only["verdict"].startswith("fired, though no hit was recorded")
    assert "missed 0 hit(s) and 2 return(s)" in returns_only["verdict"]
    assert (returns_only["entries_missed"], returns_only["returns_missed"]) == (0, 2)
    assert verdict(0, (1, None))["verdict"].startswith("fired, though no hit was recorded")
    assert verdict(0, (0, 0))["verdict"].startswith("never fired")
    # Two calls, one closed away from the flush, one without a return.
    windows = pl.DataFrame(
        {"cpu": [cpu, cpu], "start_ts": [at - 50, at - 5], "end_ts": [at - 40, None]}
    )
    open_call = verdict(2, (0, 1), {"kvm_flush_remote_tlbs": windows})["verdict"]
    assert open_call.startswith("fired, no invalidation of its path inside its calls; the 1")
    assert "up to 1 of its 1 call(s) without a return were missed by its kretprobe" in open_call
    assert "missed" not in verdict(2, (0, 0), {"kvm_flush_remote_tlbs": windows})["verdict"]


def test_the_teardown_probes_stand_for_no_flush() -> None:
    """6.1's stage2_free_walker has no TLBI: the teardown functions are not path probes."""
    paths = packaged_signatures().probe_paths
    assert not {"kvm_free_stage2_pgd", "kvm_pgtable_stage2_destroy"} & set(paths)
    assert paths["kvm_pgtable_stage2_map"] == ("__kvm_tlb_flush_vmid",)


def test_entry_probes_from_definition_lines() -> None:
    """The functions of 'p:' lines; return probes left out."""
    lines = [
        "p:tracekit/kvm_arm_vmid_update kvm_arm_vmid_update vmid=+0(%x0):u64",
        "r:tracekit/x_ret kvm_free_stage2_pgd",
        "p:tracekit/free kvm_free_stage2_pgd",
    ]
    assert g.entry_probes(lines) == ["kvm_arm_vmid_update", "kvm_free_stage2_pgd"]


def test_packaged_signatures_each_rest_on_something() -> None:
    """The shipped file parses, and every entry says what it rests on."""
    signatures = packaged_signatures()
    assert signatures.entries and all(s.rests_on for s in signatures.entries)
    assert signatures.find("6.12", "nvhe", "max", "hotplug").expect[1].operation == "TLBI ALLE1"
    assert signatures.find("6.1", "nvhe", "x", "hotplug").expect == ()
    assert (
        kernel_series("6.12.117+deb13-arm64") == "6.12" and kernel_series("6.1.0-50-arm64") == "6.1"
    )


def test_every_after_guest_action_has_a_6_1_signature() -> None:
    """The signatures' step names cover every after-guest action the collector runs, and
    each has a 6.1 nVHE and VHE signature (and 6.12 nVHE, but the debug series'); the
    debug series' local ALLE1 on the guest CPU (no VM alive: EL2 brought up for it
    first) passes with the three instructions on the target CPU and contradicts without
    its ALLE1 or with it on another CPU."""
    signatures = packaged_signatures()
    actions = [a for a in AFTER_GUEST_ACTIONS if a != "none"]
    assert set(actions) == set(STEPS) - {"create", "run", "teardown"}
    for action in actions:
        for mode in ("nvhe", "vhe"):
            assert signatures.candidates("6.1", mode, "cortex-a76", action), (action, mode)
        # The debug series is written for 6.1 only (reproducer/kpatch/6.1).
        if not action.startswith("tlbi:"):
            assert signatures.candidates("6.12", "nvhe", "max", action), action
    chosen = signatures.find("6.1", "nvhe", "cortex-a76", "tlbi:alle1@guest-cpu")
    assert chosen is not None
    schema = {"ts": pl.Int64, "cpu": pl.Int64, "operation": pl.String, "function": pl.String}
    rows = pl.DataFrame(
        [
            (10, 1, "TLBI ALLE2", "___kvm_hyp_init"),
            (11, 1, "TLBI VMALLS12E1", "___kvm_hyp_init"),
            (20, 1, "TLBI ALLE1", "__kvm_debug_maint"),
        ],
        schema=schema,
        orient="row",
    ).with_columns(where=pl.lit("hyp"))
    step = {"run_id": "after", "vm": None, "step": "tlbi:alle1@guest-cpu", "start": 0, "end": 99}
    context = g.StepContext((0, 1), (1,), (1,))
    host = signatures.host_functions
    assert g.check_step(rows, step, chosen, context, host)["ok"].all()
    moved = rows.with_columns(cpu=pl.when(pl.col("ts") == 20).then(0).otherwise(pl.col("cpu")))
    assert not g.check_step(moved, step, chosen, context, host)["ok"].all()
    assert not g.check_step(rows.head(2), step, chosen, context, host)["ok"].all()


BAD = """
[kvm]
host_functions = ["__kvm_flush_cpu_context"]

[[signature]]
kernel = "6.1"
kvm_mode = "nvhee"
step = "boot"
watch = "hyp"
exact = "yes"
when = "always"
rests_on = []
colour = "red"
expect = [{ operation = "TLBI ALLE2", function = "f", cpus = "all", count = 0 }]
"""


def test_bad_signatures_are_one_line_per_mistake() -> None:
    """Every mistake of a signature file is its own line, naming the entry and field."""
    with pytest.raises(TracekitError) as caught:
        parse_signatures(BAD, "x.toml")
    lines = str(caught.value).splitlines()
    assert len(lines) == 7, lines
    assert all(line.startswith("x.toml: signature 1") for line in lines)
    for part in (
        "'colour'",
        "kvm_mode 'nvhee'",
        "step 'boot'",
        "exact",
        "rests_on",
        "cpus 'all'",
        "count",
    ):
        assert any(part in line for line in lines), part
    with pytest.raises(TracekitError, match="not TOML"):
        parse_signatures("[[signature]\n")


def _alle1is_in_run(
    given: pl.DataFrame, steps: pl.DataFrame, repeat_tlbi: bool = True
) -> pl.DataFrame:
    """The fixture plus one EL2 TLBI ALLE1IS (__kvm_flush_vm_context) on CPU 1 inside the
    VM's run step, where a VMID rollover issues it (kvm_arm_vmid_update in the run loop),
    and, as the REPEAT_TLBI workaround of this cortex-a76 host adds, its TLBI VALE2IS, XZR
    (the words as encoded: SYS #4, C8, C3, #4 / #5, XZR)."""
    run = steps.filter(pl.col("step") == "run").row(0, named=True)
    words = [("TLBI ALLE1IS", 0xD50C839F), ("TLBI VALE2IS", 0xD50C83BF)]
    extra = [
        given.filter(pl.col("where") == "hyp", pl.col("cpu") == 1)
        .head(1)
        .with_columns(
            ts=pl.lit(run["start"] + 10 + n, dtype=pl.Int64),
            operation=pl.lit(op),
            insn=pl.lit(word, dtype=pl.UInt32),
            symbol=pl.lit(f"__kvm_nvhe___kvm_flush_vm_context+0x{16 + 8 * n:x}"),
        )
        for n, (op, word) in enumerate(words[: 2 if repeat_tlbi else 1])
    ]
    return pl.concat([given, *extra])


def test_a_rollover_owns_its_alle1is_not_the_vm_it_ran_in(given, steps) -> None:
    """In a rollover run, the ALLE1IS is the action's (its signature: one on the guest CPU),
    not an unexpected invalidation of the VM step it fell in; outside a rollover run the
    same record contradicts the run step's signature."""
    rows = _alle1is_in_run(given, steps)
    rollover = steps.with_columns(run_id=pl.lit("after-guest-rollover"))
    action = g.action_step(
        "after-guest-rollover", "rollover", int(steps["start"].min()), int(steps["end"].max())
    )
    rows_r = rows.with_columns(run_id=pl.lit("after-guest-rollover"))
    summary = _summary(rows_r, pl.concat([rollover, action]))
    assert summary.findings == []  # the VALE2IS too is the rollover's, not the VM's run
    assert summary.checks.filter(pl.col("step") == "rollover")["seen"].to_list() == [1, 1]
    plain = _summary(rows, steps)
    assert len(plain.findings) == 2 and "guest run: TLBI ALLE1IS" in plain.findings[0]


def test_the_rollover_signature_follows_the_repeat_tlbi_erratum(given, steps) -> None:
    """With the workaround active a rollover without its VALE2IS contradicts the
    signature; without it, the ALLE1IS alone matches; an unrecorded state is not checked."""
    rollover = steps.with_columns(run_id=pl.lit("r"))
    action = g.action_step("r", "rollover", int(steps["start"].min()), int(steps["end"].max()))
    every = pl.concat([rollover, action])
    bare = _alle1is_in_run(given, steps, repeat_tlbi=False).with_columns(run_id=pl.lit("r"))
    signatures = packaged_signatures()

    def summary(facts: dict[str, str]) -> g.GroundTruthSummary:
        """The bare rollover's summary under these facts."""
        return g.summarise(bare, every, signatures, SETUP, CONTEXT, {}, [], None, facts)

    erratum = summary(FACTS)
    assert [f for f in erratum.findings if "TLBI VALE2IS" in f and "expected 1, executed 0" in f]
    assert summary({**FACTS, "repeat_tlbi": "no"}).findings == []
    unknown = summary({"backing": "4k"})
    assert unknown.findings == [] and (
        "rollover (condition not checked: the bundle does not record its repeat_tlbi)"
        in unknown.uncovered
    )


def test_a_step_whose_cpus_are_unknown_is_not_checked(given, steps) -> None:
    """Without the online CPUs the creation signature cannot be checked: named, not failed."""
    context = g.StepContext(online=(), guest=(1,))
    summary = g.summarise(given, steps, packaged_signatures(), SETUP, context, {}, [], None, FACTS)
    assert summary.findings == []
    assert summary.uncovered == ["create (the bundle does not say its online CPUs)"]


def test_a_step_outside_its_signatures_conditions_is_not_checked(given, steps) -> None:
    """A THP-backed run's VMID flush from kvm_pgtable_stage2_map, a two-vCPU VM's second
    first-run flush: correct KVM outside the exact run signature's `requires`, so the run
    is "not checked", never a contradiction; a bundle without its backing likewise."""
    run = steps.filter(pl.col("step") == "run").row(0, named=True)
    hyp_row = given.filter(pl.col("where") == "hyp").head(1)
    bbm = hyp_row.with_columns(
        ts=pl.lit(run["start"] + 10, dtype=pl.Int64),
        operation=pl.lit("TLBI VMALLS12E1IS"),
        symbol=pl.lit("__kvm_nvhe___kvm_tlb_flush_vmid+0x30"),
    )
    rows = pl.concat([given, bbm])
    signatures = packaged_signatures()

    def summary(facts: dict[str, str], vm_steps: pl.DataFrame) -> g.GroundTruthSummary:
        """The fixture's summary with these facts and steps."""
        return g.summarise(rows, vm_steps, signatures, SETUP, CONTEXT, {}, [], None, facts)

    assert summary(FACTS, steps).findings != []  # 4k: the extra flush is a contradiction
    thp = summary({"backing": "thp"}, steps)
    assert thp.findings == []
    assert thp.uncovered == ["run (condition not met: backing thp, the signature holds for 4k)"]
    two = summary(FACTS, steps.with_columns(vcpus=pl.lit(2, dtype=pl.Int64)))
    assert two.findings == [] and "condition not met: vcpus 2" in two.uncovered[-1]
    unsaid = summary({}, steps)
    assert unsaid.findings == []
    assert "run (condition not checked: the bundle does not record its backing)" in (
        unsaid.uncovered
    )


def test_a_requires_naming_an_unknown_condition_is_refused() -> None:
    """requires names only condition fields the analysis can read."""
    text = (packaged_signatures_text()).replace(
        'requires = { vcpus = [1], backing = ["4k"] }', 'requires = { colour = ["red"] }', 1
    )
    with pytest.raises(TracekitError, match="requires 'colour' is not one of vcpus"):
        parse_signatures(text)


def packaged_signatures_text() -> str:
    """The shipped gtsignatures.toml."""
    return (Path(g.__file__).parent / "gtsignatures.toml").read_text()


def test_an_action_runs_rows_are_its_own_phase(given, steps) -> None:
    """The rows of an after-guest run count under 'after-guest ACTION', not 'guest'."""
    rows = given.with_columns(run_id=pl.lit("after-guest-hotplug"))
    action = g.action_step("after-guest-hotplug", "hotplug", 0, 1 << 62)
    summary = _summary(rows, action)
    assert set(summary.by_phase["phase"]) == {"after-guest hotplug"}


def test_a_rollovers_counts_give_each_row_to_one_step(given, steps) -> None:
    """In a rollover run the VM's rows count under its steps, the ALLE1IS under the
    rollover, and the action's own count holds nothing of its VMs."""
    rows = _alle1is_in_run(given, steps).with_columns(run_id=pl.lit("r"))
    action = g.action_step("r", "rollover", int(steps["start"].min()), int(steps["end"].max()))
    summary = _summary(rows, pl.concat([steps.with_columns(run_id=pl.lit("r")), action]))
    rollover = summary.by_step.filter(pl.col("step") == "rollover")
    assert rollover.select("operation", "count").sort("operation").rows() == [
        ("TLBI ALLE1IS", 1),
        ("TLBI VALE2IS, XZR (REPEAT_TLBI)", 1),
    ]
    run = summary.by_step.filter(pl.col("step") == "run")
    assert "TLBI ALLE1IS" not in run["operation"].to_list()


def test_hotplug_other_checks_the_control_cpu_it_recorded(given, steps) -> None:
    """6.12's hotplug-other re-initialises EL2 on the control CPU the manifest records
    (scenario.action_cpus): ALLE2 + ALLE1 there matches; on the guest CPU instead it is
    a finding; an older bundle without the record is not checked."""
    from tracekit.report.sections.groundtruth import target_cpus

    hyp = given.filter(pl.col("where") == "hyp").head(1)
    action = g.action_step("h", "hotplug-other", 0, 1 << 62)

    def replug(cpu: int) -> pl.DataFrame:
        """One 6.12 ___kvm_hyp_init's ALLE2 + ALLE1 on `cpu`, in run h."""
        return pl.concat(
            hyp.with_columns(
                run_id=pl.lit("h"),
                cpu=pl.lit(cpu, dtype=hyp["cpu"].dtype),
                operation=pl.lit(op),
                symbol=pl.lit(f"__kvm_nvhe____kvm_hyp_init+0x{0x74 + 4 * n:x}"),
            )
            for n, op in enumerate(("TLBI ALLE2", "TLBI ALLE1"))
        )

    def findings(
        rows: pl.DataFrame, target: tuple[int, ...], virt_at_load: str = "yes"
    ) -> g.GroundTruthSummary:
        """The 6.12 nVHE summary of run h with this target (kvm.enable_virt_at_load on)."""
        context = g.StepContext((0, 1, 2, 3), (1,), target)
        setup = ("6.12", "nvhe", "max")
        facts = {"enable_virt_at_load": virt_at_load}
        signatures = packaged_signatures()
        return g.summarise(rows, action, signatures, setup, context, {}, [], None, facts)

    control = target_cpus({"action_cpus": [2]}, "hotplug-other", (1,))
    assert control == (2,)
    assert findings(replug(2), control).findings == []
    wrong = findings(replug(1), control).findings  # on the guest CPU, none on CPU 2
    assert len(wrong) == 4 and any("on CPU 1: expected 0, executed 1" in f for f in wrong)
    old = target_cpus({}, "hotplug-other", (1,))
    assert old == () and findings(replug(2), old).uncovered == [
        "hotplug-other (the bundle does not say its target CPUs)"
    ]
    # The signature holds with kvm.enable_virt_at_load on (review of 15/17 #6): off, the
    # step is outside its condition, not checked, never a contradiction.
    off = findings(replug(1), control, "no")
    assert off.findings == [] and off.uncovered == [
        "hotplug-other (condition not met: enable_virt_at_load no, the signature holds for yes)"
    ]


def test_signatures_are_looked_up_by_the_guest_cpus_model() -> None:
    """big.LITTLE (review of 15/17 #15): the guest CPU's core names the signatures, not
    CPU 0's; without a guest CPU in the host's list, the first CPU's."""
    cpus = [{"cpu": 0, "name": "Cortex-A55"}, {"cpu": 4, "name": "Cortex-A76"}]
    assert g.signature_model(cpus, (4,)) == "cortex-a76"
    assert g.signature_model(cpus, (9,)) == "cortex-a55"
    assert g.signature_model(cpus, ()) == "cortex-a55"
    assert g.signature_model([], (1,)) == "?"


def test_the_6_1_hotplug_other_signature_is_chosen_on_6_1(given) -> None:
    """6.1 has no kvm.enable_virt_at_load (bundles record it "absent", review 15b B10):
    its nVHE hotplug-other signature is chosen there and checks the control CPU: nothing
    at EL2 passes, a ___kvm_hyp_init ALLE2 on it is a finding."""
    action = g.action_step("h", "hotplug-other", 0, 1 << 62)
    facts = {"enable_virt_at_load": "absent"}
    signatures = packaged_signatures()
    chosen, why = g.choose(signatures, SETUP, action.row(0, named=True), facts)
    assert why is None and chosen is not None and chosen.kernel == "6.1" and not chosen.expect
    context = g.StepContext((0, 1, 2, 3), (1,), (2,))
    host = given.filter(pl.col("where") != "hyp").head(1).with_columns(run_id=pl.lit("h"))
    quiet = g.summarise(host, action, signatures, SETUP, context, {}, [], None, facts)
    assert quiet.findings == [] and quiet.uncovered == []
    replug = given.filter(pl.col("where") == "hyp").head(1)
    replug = replug.with_columns(
        run_id=pl.lit("h"),
        cpu=pl.lit(2, dtype=replug["cpu"].dtype),
        operation=pl.lit("TLBI ALLE2"),
        symbol=pl.lit("__kvm_nvhe____kvm_hyp_init+0x74"),
    )
    rows = pl.concat([host, replug])
    loud = g.summarise(rows, action, signatures, SETUP, context, {}, [], None, facts)
    assert any("TLBI ALLE2" in f and "on CPU 2" in f for f in loud.findings), loud.findings


def test_a_requires_the_series_cannot_have_is_refused() -> None:
    """A 6.1 signature requiring kvm.enable_virt_at_load (6.12+) could never be met: the
    parser names it instead of leaving the step silently unchecked."""
    text = packaged_signatures_text().replace(
        'when = "no VM alive; a CPU that never ran the guest (6.1',
        'requires = { enable_virt_at_load = ["yes"] }\nwhen = "no VM alive; (6.1',
        1,
    )
    with pytest.raises(TracekitError, match=r"requires enable_virt_at_load, which 6\.1 does not"):
        parse_signatures(text)
    parse_signatures(packaged_signatures_text())  # the 6.12 entries' requires stay allowed


def test_probe_slot_tlbis_counts_the_slots_own_cpu_per_sample() -> None:
    """Issue 17 point 7: per probe syscall, the host kernel's TLBIs on the slot's CPU by
    what they name; other CPUs' and EL2's are not the slot's, a slot with none reads 0."""
    rows = [
        *[("range-511", 1, "kernel", "va")] * 1022,  # 2 calls x 511 pages
        ("range-511", 1, "kernel", "asid"),
        *[("range-511", 0, "kernel", "va")] * 50,  # another CPU's, not the slot's
        ("range-511", 1, "hyp", "all-vmids"),
        *[("range-513", 1, "kernel", "asid")] * 2,
        *[("range-513", 1, "kernel", "va-range")] * 4,
    ]
    frame = pl.DataFrame(
        rows,
        schema={"run_id": pl.String, "cpu": pl.Int32, "where": pl.String, "scope": pl.String},
        orient="row",
    )
    slots = pl.DataFrame(
        {
            "run_id": ["range-511", "range-513", "page"],
            "cpu": [1, 1, 3],
            "mode": ["range", "range", "page"],
            "pages": [511, 513, 1],
            "count": [2, 2, 10],
        }
    )
    found = {r["run_id"]: r for r in g.probe_slot_tlbis(frame, slots).iter_rows(named=True)}
    assert (found["range-511"]["by_va"], found["range-511"]["whole_asid"]) == (511.0, 0.5)
    assert found["range-511"]["by_range"] == 0
    assert (found["range-513"]["whole_asid"], found["range-513"]["by_range"]) == (1.0, 2.0)
    assert found["page"]["by_va"] == found["page"]["whole_asid"] == 0
