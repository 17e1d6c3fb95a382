"""What collect records beside the traces, said by the report: the setup's host facts
(FEAT_TLBIRANGE, FEAT_FWB, THP, guest backing) and the guest CPUs' idle states after the
guest. Bundles are tests/bundlegen.py's (host facts from the real nVHE a76 fixture)."""

from __future__ import annotations

from pathlib import Path

from bundlegen import Spec, generate

from tracekit.analysis.beforeafter import idle_after_guest
from tracekit.analysis.conditions import fact_slots, host_facts
from tracekit.bundle import NO_CPUIDLE, Manifest, RunRecord
from tracekit.ingest.bundle import load_bundle
from tracekit.report.assemble import build_report
from tracekit.report.render import render


def test_setup_says_the_features_thp_and_backing(tmp_path: Path) -> None:
    """The lead's setup has one facts line, from the condition (analysis/conditions.py)."""
    data = load_bundle(generate(tmp_path / "b", Spec(runs=2, factor=1.0, backing="thp")))
    assert host_facts(data.manifest) == [
        "FEAT_TLBIRANGE no",
        "FEAT_FWB no",
        "REPEAT_TLBI erratum yes",
        "host THP always",
        "guest backing thp",
    ]
    text = render(build_report([data]), "text")
    setup = text.split("Setup:")[1].split("Result:")[0]
    assert "facts: FEAT_TLBIRANGE no, FEAT_FWB no" in setup
    assert "guest backing thp" in setup


def test_an_old_manifest_says_not_recorded_and_range_use_is_said() -> None:
    """Facts a manifest lacks: "not recorded"; FEAT_TLBIRANGE says if the kernel uses it."""
    assert host_facts(Manifest()) == ["none recorded (CPU features, THP, guest backing)"]
    host = {"features": {"tlbirange": {"present": True, "kernel_uses": False}}}
    assert host_facts(Manifest(host=host)) == [
        "FEAT_TLBIRANGE yes (the kernel, built without them, does not use them)",
        "not recorded: FEAT_FWB, REPEAT_TLBI erratum, host THP, guest backing",
    ]


def _after(run_id: str, idle: dict[str, int] | None, since_ns: int | None) -> RunRecord:
    """An after-phase run record with its idle entries since the guest."""
    return RunRecord(run_id, "after", "quiet", 0, since_guest_ns=since_ns, idle_since_guest=idle)


def test_idle_states_after_the_guest_are_the_last_after_runs() -> None:
    """The last after run's record counts from the guest's end; WFI-only CPUs say so."""
    before = RunRecord("before-quiet-0", "before", "quiet", 0)
    assert idle_after_guest([before]) is None  # not recorded: nothing to say
    wfi = {f"cpu1/{NO_CPUIDLE}": 0}
    runs = [
        before,
        _after("after-quiet-0", wfi, 5_000_000_000),
        _after("after-quiet-1", wfi, 30_000_000_000),
    ]
    assert idle_after_guest(runs) == (
        "guest CPUs' idle after the guest (30 s, to after-quiet-1's start): cpu1 WFI only,"
        " no power-down cpuidle state"
    )
    slept = {"cpu1/cpu-sleep-0": 12, "cpu1/cluster-sleep-0": 0}
    said = idle_after_guest([_after("after-quiet-0", slept, None)])
    assert said is not None
    assert "entered cpu1/cpu-sleep-0 x12: a power-down state may lose" in said
    assert said.endswith("never entered cpu1/cluster-sleep-0")


def test_several_bundles_say_shared_facts_once(tmp_path: Path) -> None:
    """Two bundles of one host but different backings: the features and THP in the "in
    all" line, each bundle's backing on its own line; fact_slots keeps unknowns in place."""
    a = load_bundle(generate(tmp_path / "a", Spec(runs=2, factor=1.0, backing="thp")))
    b = load_bundle(generate(tmp_path / "b", Spec(runs=2, factor=1.0, backing="4k")))
    text = render(build_report([a, b]), "text")
    setup = text.split("Setup:")[1].split("Result:")[0].replace("\n  ", " ")
    in_all = next(line for line in setup.splitlines() if "in all:" in line)
    assert "FEAT_FWB no" in in_all and "host THP always" in in_all
    assert "guest backing" not in in_all
    assert "guest backing thp" in setup and "guest backing 4k" in setup
    assert fact_slots(Manifest())[-1] == "guest backing unknown"
