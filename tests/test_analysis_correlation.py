"""Correlation of wake-up windows with other CPUs' activity: generated and real frames."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_analysis_wakeup import load_cut

from tracekit.analysis.compare import PRESENT, Comparison
from tracekit.analysis.correlation import (
    activity_intervals,
    concentration,
    exposure,
    latency_windows,
    per_wakeup,
    window_activity,
    with_without,
)
from tracekit.analysis.intervals import overlap, pair_intervals
from tracekit.analysis.wakeup import decompose
from tracekit.errors import TracekitError


def frame(rows: list[tuple[int, int]]) -> pl.DataFrame:
    """start_ns/end_ns pairs as a frame."""
    return pl.DataFrame(rows, schema={"start_ns": pl.Int64, "end_ns": pl.Int64}, orient="row")


def brute(windows: list[tuple[int, int]], intervals: list[tuple[int, int]]) -> list[tuple]:
    """The overlap answer by definition, one pair at a time."""
    out = []
    for a, b in windows:
        hits = [(s, e) for s, e in intervals if s < b and e > a]
        out.append((len(hits), sum(min(e, b) - max(s, a) for s, e in hits)))
    return out


def test_overlap_counts_and_clips_known_cases() -> None:
    windows = [(100, 200), (150, 150), (0, 50), (250, 1000)]
    intervals = [(90, 110), (120, 130), (190, 300), (140, 160), (400, 400)]
    got = overlap(frame(windows), frame(intervals))
    assert list(zip(got["n"], got["overlap_ns"], strict=True)) == [
        (4, 10 + 10 + 10 + 20),
        (1, 0),
        (0, 0),
        (2, 50),
    ]


def test_overlap_matches_the_definition_on_random_overlapping_intervals() -> None:
    rng = np.random.default_rng(3)
    starts = rng.integers(0, 10_000, 300)
    intervals = [
        (int(s), int(s + d)) for s, d in zip(starts, rng.integers(0, 400, 300), strict=True)
    ]
    ws = rng.integers(0, 10_000, 200)
    windows = [(int(s), int(s + d)) for s, d in zip(ws, rng.integers(1, 900, 200), strict=True)]
    got = overlap(frame(windows), frame(intervals))
    assert list(zip(got["n"], got["overlap_ns"], strict=True)) == brute(windows, intervals)


def test_pairing_never_stretches_over_a_lost_exit() -> None:
    enters = pl.DataFrame(
        {"ts": [10, 20, 40], "cpu": [0, 0, 0]}, schema_overrides={"cpu": pl.Int32}
    )
    exits = pl.DataFrame({"ts": [15, 50], "cpu": [0, 0]}, schema_overrides={"cpu": pl.Int32})
    got, unpaired = pair_intervals(enters, exits, ["cpu"])
    # The entry at 20 lost its exit: it must not take the exit at 50 from the entry at 40.
    assert got.select("start_ns", "end_ns").rows() == [(10, 15), (40, 50)]
    assert unpaired == 1


def syscalls(
    cpu: int, spans: list[tuple[int, int]], name: str = "mprotect"
) -> dict[str, pl.DataFrame]:
    """sys_enter/sys_exit tables for spans on one CPU (task 300)."""

    def table(times: list[int]) -> pl.DataFrame:
        return pl.DataFrame(
            {"ts": times, "cpu": [cpu] * len(times), "common_pid": [300] * len(times)},
            schema={"ts": pl.Int64, "cpu": pl.Int32, "common_pid": pl.Int32},
        )

    return {
        f"sys_enter_{name}": table([s for s, _ in spans]),
        f"sys_exit_{name}": table([e for _, e in spans]),
    }


def generated_events() -> dict[str, pl.DataFrame]:
    """TLBI syscalls on CPUs 0 and 1, idle on CPU 2, IPIs towards CPU 3 and CPU 2."""
    cpu0 = syscalls(0, [(1_000, 3_000), (10_000, 11_000)])
    cpu1 = syscalls(1, [(2_500, 2_600)])
    events = {name: pl.concat([cpu0[name], cpu1[name]]) for name in cpu0}
    events |= syscalls(0, [], "munmap") | syscalls(0, [], "madvise")
    events["cpu_idle"] = pl.DataFrame(
        {"ts": [0, 5_000], "cpu": [2, 2], "common_pid": [0, 0], "state": [1, 4294967295]},
        schema={"ts": pl.Int64, "cpu": pl.Int32, "common_pid": pl.Int32, "state": pl.UInt32},
    )
    events["ipi_raise"] = pl.DataFrame(
        {"ts": [2_050, 2_100], "cpu": [0, 0], "common_pid": [300, 300], "target_cpus": [[8], [4]]},
        schema={
            "ts": pl.Int64,
            "cpu": pl.Int32,
            "common_pid": pl.Int32,
            "target_cpus": pl.List(pl.UInt64),
        },
    )
    return events


def test_window_activity_on_generated_frames() -> None:
    intervals, unpaired = activity_intervals(generated_events(), rt_cpu=3)
    assert unpaired == {"tlbi_syscall": 0, "idle": 0}
    wakeups = pl.DataFrame(
        {
            "wake_id": [0, 1],
            "expiry_ns": [2_000, 20_000],
            "switch_ts": [4_000, 21_000],
            "total_ns": [2_000, 1_000],
        },
        schema_overrides={"wake_id": pl.UInt32},
    )
    got = window_activity(latency_windows(wakeups), intervals)
    rows = {
        (r["wake_id"], r["cpu"], r["activity"]): (r["n"], r["overlap_ns"])
        for r in got.iter_rows(named=True)
    }
    assert rows == {
        (0, 0, "tlbi_syscall"): (1, 1_000),
        (0, 1, "tlbi_syscall"): (1, 100),
        (0, 2, "idle"): (1, 2_000),
        # the IPI to CPU 3 (mask 8) counts, the one to CPU 2 (mask 4) does not
        (0, 0, "ipi_to_rt"): (1, 0),
    }
    summary = per_wakeup(wakeups, got).sort("wake_id")
    assert summary["tlbi_n"].to_list() == [2, 0]
    assert summary["tlbi_cpus"].to_list() == [2, 0]
    assert summary["broadcast"].to_list() == [True, False]


def test_missing_syscall_events_name_them() -> None:
    events = generated_events()
    del events["sys_exit_madvise"]
    with pytest.raises(TracekitError, match=r"sys_exit_madvise .*syscalls/sys_exit_madvise"):
        activity_intervals(events, rt_cpu=3)


def test_exposure_uses_a_fixed_window_not_the_wakeup_length() -> None:
    # A long wake-up overlapping a syscall only after its first median-width stretch
    # does not count as "with broadcast": otherwise length alone would decide.
    events = syscalls(0, [(5_000, 6_000)]) | syscalls(0, [], "munmap") | syscalls(0, [], "madvise")
    intervals, _ = activity_intervals(events, rt_cpu=3)
    wakeups = pl.DataFrame(
        {"wake_id": [0, 1, 2], "expiry_ns": [0, 4_500, 9_000], "switch_ts": [10_000, 5_500, 10_000]}
    ).with_columns(
        (pl.col("switch_ts") - pl.col("expiry_ns")).alias("total_ns"),
        pl.col("wake_id").cast(pl.UInt32),
    )
    got = exposure(wakeups, intervals).sort("wake_id")
    assert got["broadcast"].to_list() == [False, True, False]


def runs_with_effect(factor: float, runs: int = 6, seed: int = 5) -> pl.DataFrame:
    """Per-wake-up frames of several runs: broadcast wake-ups `factor` times slower."""
    rng = np.random.default_rng(seed)
    frames = []
    for r in range(runs):
        lat = rng.lognormal(11, 0.3, 2000)
        broadcast = rng.random(2000) < 0.5
        lat = np.where(broadcast, lat * factor, lat)
        frames.append(
            pl.DataFrame({"total_ns": lat.astype(np.int64), "broadcast": broadcast}).with_columns(
                pl.lit(f"run-{r}").alias("run_id")
            )
        )
    return pl.concat(frames)


def test_concentration_finds_an_injected_effect_with_the_run_as_unit() -> None:
    per_run = with_without(runs_with_effect(1.6))
    assert per_run.height == 6
    for c in concentration(per_run):
        assert c.n_before == c.n_after == 6
        assert c.verdict == PRESENT
        assert abs(c.ratio - 1.6) < 0.15
        # Each run gives a value to both groups: said as 6 runs split, never "6+6 runs".
        assert "6 run(s), each split with/without" in c.describe()
        assert "6+6" not in c.describe() + c.brief()
    short = concentration(per_run.head(2))[0]
    assert short.needed_runs is not None
    assert short.needs() == f"{short.needed_runs} runs, each split"
    assert found_p50(per_run).ci_low <= 1.6 <= found_p50(per_run).ci_high


def found_p50(per_run: pl.DataFrame) -> Comparison:
    """The median's comparison."""
    return next(c for c in concentration(per_run) if "p50" in c.metric)


def test_concentration_without_effect_is_not_present() -> None:
    for c in concentration(with_without(runs_with_effect(1.0))):
        assert c.verdict != PRESENT


def test_concentration_excludes_runs_that_lost_events() -> None:
    per_run = with_without(runs_with_effect(1.6))
    found = concentration(per_run, lost={"run-2": 40})
    assert all(c.n_before == 5 and len(c.excluded) == 2 for c in found)


def test_real_cut_slowest_wakeup_overlaps_stress_syscalls() -> None:
    events, meta = load_cut("wakeup-before")
    rt = int(meta["rt_cpu"])
    wakeups = decompose(events, rt).frame
    intervals, _ = activity_intervals(events, rt)
    assert set(intervals["cpu"].unique()) <= {0, 1, 2}
    summary = per_wakeup(wakeups, window_activity(latency_windows(wakeups), intervals))
    slowest = summary.sort("total_ns", descending=True).row(0, named=True)
    # 106 ms in emulation, with all three stress CPUs inside mprotect/madvise calls.
    assert slowest["total_ns"] == 106_033_504
    assert slowest["tlbi_n"] > 10 and slowest["tlbi_cpus"] == 3
    assert summary.height == wakeups.height


def test_real_guest_cut_shows_the_guest_running_on_its_cpu() -> None:
    events, meta = load_cut("wakeup-guest")
    intervals, unpaired = activity_intervals(events, int(meta["rt_cpu"]))
    guest = intervals.filter(pl.col("activity") == "guest")
    assert unpaired["guest"] == 0
    assert guest["cpu"].unique().to_list() == [1]
    entries, exits = events["kvm_entry"], events["kvm_exit"]
    assert guest.height == entries.height == 9
    assert (guest["end_ns"] - guest["start_ns"]).sum() == exits["ts"].sum() - entries["ts"].sum()


def test_concentration_with_no_run_having_both_groups_is_empty() -> None:
    all_with = runs_with_effect(1.6).with_columns(pl.lit(True).alias("broadcast"))
    assert concentration(with_without(all_with)) == []


def test_an_enabled_event_that_never_fired_is_empty_not_missing() -> None:
    events = generated_events()
    del events["sys_enter_munmap"], events["sys_exit_munmap"]
    enabled = ["syscalls/sys_enter_munmap", "syscalls/sys_exit_munmap"]
    intervals, _ = activity_intervals(events, rt_cpu=3, enabled=enabled)
    assert intervals.filter(pl.col("activity") == "tlbi_syscall").height == 3
    with pytest.raises(TracekitError, match="sys_enter_munmap"):
        activity_intervals(events, rt_cpu=3)
