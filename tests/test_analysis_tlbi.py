"""TLBI cost: the probe file reader, per-CPU/phase percentiles, verdicts over slots, flush paths.

Probe files are real (tests/fixtures/analysis/tlbi-probe-cpu*.bin, emulated host); the
flush-path pairs come from a real text trace with entry/return kprobes
(teardown-6.1-a76.trace, see that directory's README.md).
"""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from bundlegen import Spec, generate

import tracekit
from tracekit.analysis.compare import INCONCLUSIVE, PRESENT
from tracekit.analysis.tlbi import (
    flush_missed,
    flush_summary,
    funcgraph_durations,
    probe_comparisons,
    probe_pair_durations,
    probe_percentiles,
    require_flush_events,
)
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import load_bundle
from tracekit.ingest.probe import HEADER, probe_samples, read_probe_file
from tracekit.report.sections.tlbi import section

FIXTURES = Path(__file__).parent / "fixtures" / "analysis"
PROBE = FIXTURES / "tlbi-probe-cpu3.bin"
TEARDOWN = FIXTURES / "teardown-6.1-a76.trace"


def test_probe_file_reads_every_sample() -> None:
    """Header fields and one row per 16-byte record, durations as the probe wrote them."""
    header, samples = read_probe_file(PROBE)
    assert (header.cpu, header.mode, header.clock_id) == (3, "page", 7)
    assert samples.height == header.count == (PROBE.stat().st_size - 64) // 16
    raw = np.frombuffer(PROBE.read_bytes()[64:], dtype="<u8").reshape(-1, 2)
    assert samples["duration_ns"].to_list() == raw[:, 1].tolist()
    assert samples["timestamp_ns"].is_sorted()


def _v2_file(path: Path, directions: list[int], durations: list[int], version: int = 2) -> Path:
    """A version-2 probe.bin as reproducer/README.md lays it out (24-byte records)."""
    header = HEADER.pack(
        b"TKPROBE\0", version, HEADER.size, 24, 3, 1, 1, 62_500_000, len(durations), 7, 2, 0
    )
    body = b"".join(
        struct.pack("<QQII", 1_000 * (i + 1), d, k, 0)
        for i, (k, d) in enumerate(zip(directions, durations, strict=True))
    )
    path.write_bytes(header + body)
    return path


def test_probe_file_versions_and_directions(tmp_path: Path) -> None:
    """Version 2 keeps RW->RO and RO->RW apart; version 1 reads as unknown; others refused."""
    header, samples = read_probe_file(_v2_file(tmp_path / "v2.bin", [1, 2, 1], [10, 20, 30]))
    assert header.version == 2
    assert samples["direction"].to_list() == ["rw-ro", "ro-rw", "rw-ro"]
    assert samples["duration_ns"].to_list() == [10, 20, 30]
    assert set(read_probe_file(PROBE)[1]["direction"]) == {"unknown"}  # a version-1 file
    with pytest.raises(TracekitError, match="version 3"):
        read_probe_file(_v2_file(tmp_path / "v3.bin", [1], [10], version=3))
    with pytest.raises(TracekitError, match="direction 7"):
        read_probe_file(_v2_file(tmp_path / "bad.bin", [1, 7], [10, 20]))


def test_truncated_or_foreign_probe_file_is_refused(tmp_path: Path) -> None:
    """A short file or another format is one clear error, never a partial read."""
    short = tmp_path / "short.bin"
    short.write_bytes(PROBE.read_bytes()[:-8])
    with pytest.raises(TracekitError, match="truncated or damaged"):
        read_probe_file(short)
    other = tmp_path / "other.bin"
    other.write_bytes(b"NOTPROBE" + PROBE.read_bytes()[8:])
    with pytest.raises(TracekitError, match="not a tlbiprobe sample file"):
        read_probe_file(other)


def _slots(
    factor_after: float, slots: int, seed: int = 1, direction: str = "unknown"
) -> pl.DataFrame:
    """Probe samples: `slots` resampled copies of the real file per phase, after scaled."""
    rng = np.random.default_rng(seed)
    durations = read_probe_file(PROBE)[1]["duration_ns"].to_numpy()
    frames = []
    for phase, scale in (("before", 1.0), ("after", factor_after)):
        for i in range(slots):
            drawn = (rng.choice(durations, len(durations)) * scale).astype(np.int64)
            frames.append(
                pl.DataFrame({"duration_ns": drawn}).with_columns(
                    pl.lit(f"{phase}-probe-page-cpu3-{i}-{direction}").alias("run_id"),
                    pl.lit(phase).alias("phase"),
                    pl.lit(3, pl.Int32).alias("cpu"),
                    pl.lit("page").alias("mode"),
                    pl.lit(1, pl.Int32).alias("pages"),
                    pl.lit(direction).alias("direction"),
                )
            )
    return pl.concat(frames)


def test_percentiles_per_cpu_and_phase_match_numpy() -> None:
    """Pooled percentiles per phase equal numpy's 'higher' quantiles, in microseconds."""
    samples = _slots(2.0, 2)
    table = probe_percentiles(samples)
    assert table["phase"].to_list() == ["before", "after"]
    for phase in ("before", "after"):
        d = samples.filter(pl.col("phase") == phase)["duration_ns"].to_numpy()
        row = table.filter(pl.col("phase") == phase).row(0, named=True)
        assert row["slots"] == 2 and row["samples"] == len(d)
        assert row["p99_us"] == round(np.quantile(d, 0.99, method="higher") / 1000, 1)
        assert row["max_us"] == round(d.max() / 1000, 1)


def test_one_slot_per_phase_is_inconclusive_and_says_how_many() -> None:
    """A slot is a run: 1+1 never gives a verdict, however large the change."""
    found = probe_comparisons(_slots(3.0, 1))
    assert {c.verdict for c in found} == {INCONCLUSIVE}
    assert {c.needed_runs for c in found} == {4}
    assert {c.interval() for c in found} == {"n/a"}  # one slot a side: no spread to estimate


def test_injected_probe_cost_is_found_with_enough_slots() -> None:
    """Five slots per phase, costs doubled after: present, and x2 inside each interval."""
    found = probe_comparisons(_slots(2.0, 5))
    pooled = "probe page, RW->RO and RO->RW pooled issued on cpu3"
    assert [c.metric for c in found] == [f"{pooled} p50", f"{pooled} p99"]
    for c in found:
        assert c.verdict == PRESENT and c.role == "secondary"
        assert c.ci_low <= 2.0 <= c.ci_high


def test_directions_are_compared_apart() -> None:
    """RW->RO doubled after the guest, RO->RW unchanged: two families, only one present."""
    samples = pl.concat([_slots(2.0, 5, 1, "rw-ro"), _slots(1.0, 5, 2, "ro-rw")])
    found = {c.metric: c.verdict for c in probe_comparisons(samples)}
    assert found["probe page rw-ro issued on cpu3 p50"] == PRESENT
    assert found["probe page ro-rw issued on cpu3 p50"] != PRESENT
    per = probe_percentiles(samples)
    assert per.select("direction", "phase").rows() == [
        ("ro-rw", "before"), ("ro-rw", "after"), ("rw-ro", "before"), ("rw-ro", "after")
    ]  # fmt: skip


def test_kprobe_pairs_give_durations_like_the_trace_text() -> None:
    """Entry/return pairs of a real trace: same count and durations as reading the text."""
    trace = tracekit.open(TEARDOWN)
    durations, unpaired, unclosed = probe_pair_durations(trace.events)
    assert unpaired == 0 and unclosed == []
    line = re.compile(r"\[\d+\]\s+\S+\s+([\d.]+): (kvm_free_stage2_pgd(?:_ret)?):")
    stamps = {"kvm_free_stage2_pgd": [], "kvm_free_stage2_pgd_ret": []}
    for m in line.finditer(TEARDOWN.read_text()):
        stamps[m[2]].append(round(float(m[1]) * 1e6))  # microseconds in the text
    expected = [r - e for e, r in zip(*stamps.values(), strict=True)]
    got = durations.filter(pl.col("function") == "kvm_free_stage2_pgd").sort("start_ns")
    assert [round(d / 1000) for d in got["duration_ns"]] == expected
    summary = flush_summary(got.with_columns(pl.lit("guest").alias("phase")))
    assert summary["calls"].to_list() == [len(expected)]


def test_a_lost_return_leaves_its_entry_unpaired() -> None:
    """Drop one return event: one call fewer, and its entry counted as unpaired."""
    events = tracekit.open(TEARDOWN).events
    first_ret = events.filter(pl.col("event") == "kvm_free_stage2_pgd_ret")["row"].min()
    durations, unpaired, unclosed = probe_pair_durations(events.filter(pl.col("row") != first_ret))
    assert durations.filter(pl.col("function") == "kvm_free_stage2_pgd").height == 8
    assert unpaired == 1
    assert "did not record the kretprobe's misses" in unclosed[0]


def test_missed_returns_are_said_with_the_flush_durations_they_change() -> None:
    """A return the kretprobe missed (kprobe_profile's count): the unpaired call's note
    says it may be one, and the summary's missed column carries the run's count, summed
    per phase; an unrecorded run makes the phase's count unknown, never 0."""
    events = tracekit.open(TEARDOWN).events
    first_ret = events.filter(pl.col("event") == "kvm_free_stage2_pgd_ret")["row"].min()
    misses = {"tracekit/kvm_free_stage2_pgd_ret": 1, "tracekit/kvm_free_stage2_pgd": 0}
    durations, _, unclosed = probe_pair_durations(events.filter(pl.col("row") != first_ret), misses)
    assert unclosed == [
        "kvm_free_stage2_pgd: 1 call(s) without a return: the kretprobe missed 1 return(s)"
        " in this run (kprobe_profile), so up to 1 may be missed returns"
    ]
    got = durations.filter(pl.col("function") == "kvm_free_stage2_pgd").with_columns(
        pl.lit("guest").alias("phase")
    )
    fn = ["kvm_free_stage2_pgd"]
    two_runs = pl.concat([flush_missed(fn, "guest", misses), flush_missed(fn, "guest", misses)])
    assert flush_summary(got, two_runs)["missed_returns"].to_list() == [2]
    # A third run timed no call of it, but its kretprobe missed one there too.
    untimed = pl.concat([two_runs, flush_missed([], "guest", misses)])
    assert flush_summary(got, untimed)["missed_returns"].to_list() == [3]
    unknown = pl.concat([flush_missed(fn, "guest", misses), flush_missed(fn, "guest", None)])
    assert flush_summary(got, unknown)["missed_returns"].to_list() == [None]


def test_probe_slots_say_how_long_after_the_guest_they_ran() -> None:
    """since_guest_s is the group's first slot's RunRecord.since_guest_ns, in seconds;
    a slot before any guest ended has none."""
    samples = pl.concat([_slots(1.0, 2, 1, "rw-ro")])
    runs = sorted(set(samples.filter(pl.col("phase") == "after")["run_id"]))
    since = {run: 30_000_000_000 + i * 10_000_000_000 for i, run in enumerate(runs)}
    per = probe_percentiles(samples, since)
    got = dict(per.select("phase", "since_guest_s").rows())
    assert got == {"before": None, "after": 30.0}


def test_flush_durations_name_the_events_they_need() -> None:
    """Without probe pairs or function_graph, the error names both ways to record them."""
    with pytest.raises(TracekitError, match=r"funcgraph_exit.*function_graph"):
        require_flush_events(["sched_switch", "kvm_free_stage2_pgd"])
    require_flush_events(["kvm_free_stage2_pgd", "kvm_free_stage2_pgd_ret"])


def test_section_on_a_generated_bundle(tmp_path: Path) -> None:
    """Probe table per CPU/phase, a histogram per CPU, inconclusive probe verdicts (1 slot)."""
    data = load_bundle(generate(tmp_path / "b", Spec(runs=2, factor=2.0)))
    s = section([data])
    assert s is not None and s.key == "tlbi"
    table = s.tables[0].frame
    assert set(table["cpu"]) == {0, 3} and table.width <= 7
    for plot in s.plots:  # the injected x2, in the histogram's data (geometric means)
        logs = plot.frame.group_by("phase").agg(pl.col("duration_us").log().mean())
        shift = dict(logs.rows())
        assert 1.7 < np.exp(shift["after"] - shift["before"]) < 2.3
    assert [p.kind for p in s.plots] == ["histogram", "histogram"]
    assert all(c.verdict == INCONCLUSIVE for c in s.comparisons)
    assert "needs 4+4" in " ".join(s.unknowns)
    assert any(
        u.startswith("which CPU holds any state: not from the probe alone") for u in s.unknowns
    )
    assert "issuing CPU" in s.tables[0].title and "never the slow responder" in s.tables[0].note
    shutil.rmtree(tmp_path / "b")


def test_funcgraph_durations_keep_the_top_functions_and_name_them() -> None:
    """Depth-0 exits give rettime - calltime; a missing symbol falls back to the address."""
    exits = pl.DataFrame(
        {
            "cpu": [1, 1, 2],
            "common_pid": [10, 10, 11],
            "func": [0xFFFF800008001000, 0xFFFF800008002000, 0xFFFF800008003000],
            "func_sym": ["__kvm_tlb_flush_vmid", "callee", None],
            "depth": [0, 1, 0],
            "calltime": [1_000, 1_100, 5_000],
            "rettime": [4_000, 1_200, 5_500],
        }
    )
    got = funcgraph_durations(exits)
    assert got.select("function", "duration_ns").rows() == [
        ("__kvm_tlb_flush_vmid", 3_000),
        ("0xffff800008003000", 500),
    ]


def test_page_counts_on_either_side_of_the_by_va_limit_are_never_pooled() -> None:
    """Review of 17, point 4: 511 pages (by-VA TLBIs) and 513 (one ASIDE1IS) stay apart."""
    frames = []
    for pages, factor in ((511, 1.0), (513, 3.0)):
        slots = _slots(factor, 8, seed=pages, direction="munmap")
        frames.append(
            slots.with_columns(
                pl.lit("munmap").alias("mode"),
                pl.lit(pages, pl.Int32).alias("pages"),
                (pl.col("run_id") + f"-{pages}p").alias("run_id"),
            )
        )
    samples = pl.concat(frames)
    table = probe_percentiles(samples)
    assert table.select("pages", "phase").rows() == [
        (511, "before"), (511, "after"), (513, "before"), (513, "after")
    ]  # fmt: skip
    found = {c.metric: c.verdict for c in probe_comparisons(samples)}
    assert found["probe munmap 513 pages issued on cpu3 p50"] == PRESENT
    assert found["probe munmap 511 pages issued on cpu3 p50"] != PRESENT
    with pytest.raises(TracekitError, match="no column pages"):
        probe_percentiles(samples.drop("pages"))


def test_probe_samples_carry_the_headers_page_count(tmp_path: Path) -> None:
    """Each sample row says its slot's page count, from the probe file's header."""
    data = load_bundle(generate(tmp_path / "b", Spec(runs=1)))
    samples = probe_samples(data)
    assert samples.height > 0 and set(samples["pages"]) == {1}
    assert samples.schema["pages"] == pl.Int32


def test_what_el2_hid_from_the_probes_is_said() -> None:
    """scenario.el2_unseen (collect, nVHE/protected): one line per function, with why."""
    from tracekit.analysis.tlbi import el2_unseen

    why = "runs at EL2 in nvhe mode; its host-side callers are probed instead: kvm_arm_vmid_update"
    assert el2_unseen({"el2_unseen": {"__kvm_flush_vm_context": why}}) == [
        f"__kvm_flush_vm_context: {why}"
    ]
    assert el2_unseen({}) == []
