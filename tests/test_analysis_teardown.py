"""Teardown time vs IPA size: trace vs VMM agreement on real runs, the fit on generated data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from vm_bundles import FIXTURES, make_vm_bundle, open_fixture, timeline

from tracekit.analysis import teardown as td
from tracekit.bundle import BundleWriter, read_manifest
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import load_bundle
from tracekit.ingest.vmm import read_vmm_output
from tracekit.report.sections import teardown as td_section

REAL = ("teardown-6.1-a76", "teardown-6.12-max")


def _real_table(name: str) -> pl.DataFrame:
    """The per-VM teardown table of one real fixture, kernel spans of kvm_free_stage2_pgd."""
    trace = open_fixture(name)
    windows, _ = timeline(trace)
    spans = td.function_spans(
        trace.event("kvm_free_stage2_pgd"), trace.event("kvm_free_stage2_pgd_ret")
    )
    kernel = td.spans_in_windows(spans, windows)
    vmm = read_vmm_output(FIXTURES / f"{name}.vmm.txt").vms
    return td.teardown_table(windows, vmm, kernel)


@pytest.mark.parametrize("name", REAL)
def test_markers_agree_with_the_vmm_clock(name: str) -> None:
    """Every VM: the marker span holds the VMM's own teardown time, within the tolerance."""
    table = _real_table(name)
    assert table.height == read_vmm_output(FIXTURES / f"{name}.vmm.txt").vms.height
    assert table["agrees"].all()
    # The markers are written just outside the VMM's timed section: never shorter.
    assert (table["diff_ns"] >= 0).all()
    # The kernel's stage-2 free runs inside the teardown, once per VM.
    assert table["kernel_ns"].null_count() == 0
    assert (table["kernel_ns"] < table["marker_ns"]).all()


def test_tolerance_flags_a_disagreeing_vm() -> None:
    """A VMM value changed by 20 % (and > 1 ms) no longer agrees; the others still do."""
    name = "teardown-6.1-a76"
    trace = open_fixture(name)
    windows, _ = timeline(trace)
    vmm = read_vmm_output(FIXTURES / f"{name}.vmm.txt").vms
    bent = vmm.with_columns(
        pl.when(pl.col("vm") == 4).then(pl.col("teardown_ns") * 1.2).otherwise("teardown_ns")
        .cast(pl.Int64)
    )  # fmt: skip
    table = td.teardown_table(windows, bent, None)
    assert table.filter(~pl.col("agrees"))["vm_seq"].to_list() == [4]
    assert table["kernel_ns"].null_count() == table.height


def test_vmm_output_of_another_run_is_refused() -> None:
    """Different VM counts or IPA sizes between trace and VMM output: one clear error."""
    windows, _ = timeline(open_fixture("teardown-6.1-a76"))
    other = read_vmm_output(FIXTURES / "teardown-6.12-max.vmm.txt").vms
    with pytest.raises(TracekitError, match=r"9 VMs .* 12 `vm` records"):
        td.match_vmm(windows, other)
    with pytest.raises(TracekitError, match="does not match the VMM's record"):
        td.match_vmm(windows, other.head(9))


def test_function_spans_pair_per_thread() -> None:
    """Entries and returns interleaved across threads; an entry with no return is counted."""
    entries = pl.DataFrame({"ts": [10, 12, 50, 90], "common_pid": [1, 2, 1, 2]})
    returns = pl.DataFrame({"ts": [20, 15, 70], "common_pid": [1, 2, 1]})
    spans = td.function_spans(entries, returns)
    assert spans.select("pid", "start_ts", "dur_ns").rows() == [
        (1, 10, 10),
        (2, 12, 3),
        (1, 50, 20),
    ]
    assert td.unmatched_entries(entries, spans) == 1


def _generated(per_bit: float, noise: float, seed: int) -> pl.DataFrame:
    """VMs at 36..48 bits, 5 each: 5 ms x per_bit^(bits-36) x lognormal noise."""
    rng = np.random.default_rng(seed)
    bits = np.repeat([36, 40, 44, 48], 5)
    ns = 5e6 * per_bit ** (bits - 36) * np.exp(rng.normal(0, noise, bits.size))
    return pl.DataFrame({"ipa_bits": bits, "vmm_ns": ns.astype(np.int64)})


@pytest.mark.parametrize(
    ("per_bit", "verdict"), [(2.0, "ipa-space"), (1.10, "ipa-space"), (1.0, "mapped")]
)
def test_growth_interval_holds_the_known_slope(per_bit: float, verdict: str) -> None:
    """The fitted factor's interval contains the generating factor; the verdict follows it."""
    growth = td.growth_per_bit(_generated(per_bit, noise=0.05, seed=3))
    assert growth.low <= per_bit <= growth.high
    assert growth.sizes == (36, 40, 44, 48) and growth.vms == 20
    assert growth.verdict() == verdict
    assert "x" in growth.statement() and "rule:" in growth.statement()


def test_growth_covers_the_true_slope_most_of_the_time() -> None:
    """Over 40 generated experiments, the 95 % interval misses the truth rarely."""
    fits = [td.growth_per_bit(_generated(1.3, 0.2, seed), resamples=500) for seed in range(40)]
    assert sum(g.low <= 1.3 <= g.high for g in fits) >= 33


def test_growth_needs_two_sizes_and_steady_state_drops_first_vms() -> None:
    """One IPA size: a clear error; steady_state keeps VMs after each invocation's first."""
    one = pl.DataFrame({"ipa_bits": [40, 40], "vmm_ns": [1, 2]})
    with pytest.raises(TracekitError, match="at least two IPA sizes"):
        td.growth_per_bit(one)
    table = _real_table("teardown-6.12-max")
    assert td.steady_state(table)["vm_seq"].to_list() == list(range(1, 12))


def test_section_puts_kernels_side_by_side(tmp_path: Path) -> None:
    """Two bundles of two kernels: one row each in the growth table, one xy plot."""
    a = make_vm_bundle(tmp_path / "a", {"teardown": REAL[0]}, "6.1.0-50-arm64")
    b = make_vm_bundle(tmp_path / "b", {"teardown": REAL[1]}, "6.12.117+deb13-arm64")
    section = td_section.section([load_bundle(a), load_bundle(b)])
    assert section is not None
    side = next(t for t in section.tables if "by kernel" in t.title).frame
    assert side["kernel"].to_list() == ["6.1.0-50-arm64", "6.12.117+deb13-arm64"]
    plot = section.plots[0]
    assert plot.kind == "xy" and plot.frame.height == 21
    assert sum("agree for" in f for f in section.findings) == 2
    only_cache = make_vm_bundle(tmp_path / "c", {"ct": "cacheflush-1vcpu"}, "6.1.0-50-arm64")
    assert td_section.section([load_bundle(only_cache)]) is None


def test_section_falls_back_to_the_vmm_when_the_trace_does_not_match(tmp_path: Path) -> None:
    """VMM output of another run: the fit still uses the VMM's times, and says why."""
    bundle = make_vm_bundle(tmp_path / "a", {"teardown": REAL[0]}, "6.1.0-50-arm64")
    other = (FIXTURES / f"{REAL[1]}.vmm.txt").read_text()
    (bundle / "runs" / "teardown" / "vmm.txt").write_text(other)
    BundleWriter(bundle, read_manifest(bundle)).finish()  # recorded so, not changed later
    section = td_section.section([load_bundle(bundle)])
    assert section is not None
    assert any("trace not compared with the VMM" in f for f in section.findings)
    assert any("per IPA bit" in f and "over 11 VMs" in f for f in section.findings)
    assert section.plots[0].frame.height == 12


def test_a_missed_return_is_said_with_the_kernel_teardown_time(tmp_path: Path) -> None:
    """One kvm_free_stage2_pgd return gone, and the run's kprobe_profile says its
    kretprobe missed one: the section says that call may be a missed return, whose VM
    then has no kernel time."""
    bundle = make_vm_bundle(tmp_path / "a", {"teardown": REAL[0]}, "6.1.0-50-arm64")
    trace = bundle / "runs" / "teardown" / "trace"
    lines = trace.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if "kvm_free_stage2_pgd_ret:" in line)
    trace.write_text("".join(lines[:first] + lines[first + 1 :]))
    manifest = read_manifest(bundle)
    manifest.runs[0].probe_misses = {"tracekit/kvm_free_stage2_pgd_ret": 1}
    BundleWriter(bundle, manifest).finish()  # recorded so, not changed later
    section = td_section.section([load_bundle(bundle)])
    assert section is not None
    said = [f for f in section.findings if "without a return" in f]
    assert said == [
        "teardown: kvm_free_stage2_pgd: 1 call(s) without a return: the kretprobe missed 1"
        " return(s) in this run (kprobe_profile), so up to 1 may be missed returns; their"
        " VMs have no kernel time here"
    ]
