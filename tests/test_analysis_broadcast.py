"""Guest-broadcast analysis: during/before comparisons on bundles with a known effect."""

from __future__ import annotations

from pathlib import Path

from report_bundles import edit_manifest, make_bundle

from tracekit.analysis.compare import PRESENT
from tracekit.ingest.bundle import load_bundle
from tracekit.report.sections import broadcast


def _during_bundle(root: Path, factor: float) -> Path:
    """Real resampled cyclictest runs; the second phase relabelled `during`, x factor."""
    bundle = make_bundle(root, runs=6, factor=factor)

    def relabel(data: dict) -> None:  # type: ignore[type-arg]
        for run in data["runs"]:
            if run["phase"] == "after":
                run["phase"] = "during"

    edit_manifest(bundle, relabel)
    return bundle


def _primary(section: object) -> object:
    """The section's primary comparison (during/before cyclictest p99.9)."""
    found = [c for c in section.comparisons if c.role == "primary"]  # type: ignore[attr-defined]
    assert len(found) == 1
    return found[0]


def test_injected_load_is_present_and_measured(tmp_path: Path) -> None:
    """Latencies x2 during the guest: verdict present, the interval holds 2."""
    section = broadcast.section([load_bundle(_during_bundle(tmp_path / "b", 2.0))])
    assert section is not None
    primary = _primary(section)
    assert primary.metric == "during/before cyclictest p99.9"  # type: ignore[attr-defined]
    assert primary.verdict == PRESENT  # type: ignore[attr-defined]
    assert primary.ci_low <= 2.0 <= primary.ci_high  # type: ignore[attr-defined]
    # No after phase here: the control is named as unknown, not silently skipped.
    assert any("after/before" in u for u in section.unknowns)


def test_no_load_is_not_present(tmp_path: Path) -> None:
    """Same runs without an effect: the verdict is not 'present'."""
    section = broadcast.section([load_bundle(_during_bundle(tmp_path / "b", 1.0))])
    assert section is not None and _primary(section).verdict != PRESENT  # type: ignore[attr-defined]


def test_no_during_phase_no_section(tmp_path: Path) -> None:
    """A main-scenario bundle (before/after only) has no guest-broadcast section."""
    bundle = make_bundle(tmp_path / "b", runs=2, factor=1.0)
    assert broadcast.section([load_bundle(bundle)]) is None


def test_the_guest_cpu_unprobed_during_the_guest_is_found_from_the_slots() -> None:
    """Collect probes the guest CPU before and after, not during (it runs the guest):
    the note says so from the slots, not as "never probed"."""
    import polars as pl

    from tracekit.analysis.broadcast import unprobed_guest_cpus

    samples = pl.DataFrame(
        {"phase": ["before", "before", "during", "after", "after"], "cpu": [1, 3, 3, 1, 3]}
    )
    assert unprobed_guest_cpus(samples, [1]) == [1]
    assert unprobed_guest_cpus(samples, [1], phase="after") == []
    assert unprobed_guest_cpus(samples, [3]) == []


def test_the_probe_table_says_which_guest_cpu_had_no_slot_during(tmp_path: Path) -> None:
    """A generated bundle (probe slots on CPUs 3 and 0) whose after phase is relabelled
    during: the guest's CPU 1 has none there, CPU 0 as the guest CPU has one."""
    from bundlegen import Spec, generate

    def relabel(guest: int):  # type: ignore[no-untyped-def]
        def edit(data: dict) -> None:  # type: ignore[type-arg]
            data["options"]["guest_cpus"] = [guest]
            for run in data["runs"]:
                if run["phase"] == "after":
                    run["phase"] = "during"

        return edit

    notes = {}
    for guest in (1, 0):
        bundle = generate(tmp_path / f"g{guest}", Spec(runs=2, seed=guest))
        edit_manifest(bundle, relabel(guest))
        section = broadcast.section([load_bundle(bundle)])
        assert section is not None
        (table,) = [t for t in section.tables if "probe cost per CPU" in t.title]
        notes[guest] = table.note
    assert "guest CPU 1: no slot during the guest (the guest runs there)" in notes[1]
    assert "no slot during" not in notes[0] and "not probed" not in notes[0]
