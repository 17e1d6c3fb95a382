"""cyclictest latencies and TLBI probe samples as counters, with their times rebuilt."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from perfetto_support import Export, read_export

import tracekit
from tracekit.analysis.wakeup import sleep_due_times
from tracekit.bundle import read_manifest
from tracekit.ingest.probe import ProbeHeader, read_probe_file
from tracekit.ingest.tools import read_cyclictest_verbose
from tracekit.perfetto.bundle import export_bundle
from tracekit.perfetto.latency import (
    BY_START,
    BY_TRACE,
    grid_steps,
    timelines,
)
from tracekit.perfetto.probe import write_probe_samples
from tracekit.perfetto.tracks import TrackWriter
from tracekit.perfetto.validate import validate_file
from tracekit.perfetto.writer import PacketWriter

FIXTURE = Path(__file__).parent / "fixtures" / "perfetto" / "nvhe-a76-kprobes"
MS = 1_000_000


def _simulate(latency: list[int], interval: int, due0: int) -> np.ndarray:
    """Due times as cyclictest makes them: next = due + interval, skipping past ones."""
    due = [due0]
    for lat in latency[:-1]:
        woke = due[-1] + lat
        nxt = due[-1] + interval
        while nxt <= woke:
            nxt += interval
        due.append(nxt)
    return np.array(due, dtype=np.int64)


def _trace_tables(expires: list[int], main: list[int]) -> dict[str, pl.DataFrame]:
    """hrtimer_start of a measuring thread (tid 11) and cyclictest's main thread (tid 10)."""
    rows = [(11, e) for e in expires] + [(10, e) for e in main]
    starts = pl.DataFrame(
        {
            "row": range(len(rows)),
            "ts": [e - 500 for _, e in rows],
            "cpu": [3] * len(rows),
            "common_pid": [p for p, _ in rows],
            "function": [0xFF00] * len(rows),
            "function_sym": ["hrtimer_wakeup"] * len(rows),
            "expires": [e + 50_000 for _, e in rows],  # a timer slack
            "softexpires": [e for _, e in rows],
        },
        schema_overrides={"common_pid": pl.Int32},
    )
    # Both cyclictest threads ran on the rt CPU; only tid 11 is real-time (prio 0).
    switches = pl.DataFrame(
        {"cpu": [3, 3, 3], "next_comm": ["cyclictest", "cyclictest", "stress-ng"],
         "next_pid": [10, 11, 12], "next_prio": [120, 0, 120]},
        schema_overrides={"next_pid": pl.Int32, "cpu": pl.Int32},
    )  # fmt: skip
    return {"hrtimer_start": starts, "sched_switch": switches}


def test_grid_steps_follow_cyclictest_skipping_missed_periods() -> None:
    """A latency of k intervals moves the next due time k + 1 intervals on."""
    latency = np.array([300_000, 1_700_000, 5_000, 3_000_000, 10])
    steps = grid_steps(latency, MS)
    assert steps.tolist() == [0, 1, 3, 4, 8]
    assert (steps * MS + 7).tolist() == (_simulate(latency.tolist(), MS, 7) - 0).tolist()


def test_due_times_come_from_the_measuring_threads_timers() -> None:
    """The measuring thread's timers anchor the grid; its main thread is not mistaken for it."""
    latency = [120_000, 2_400_000, 90_000, 1_000_000, 50_000, 700_000]
    due = _simulate(latency, MS, 5_000 * MS)
    tables = _trace_tables([*due.tolist(), int(due[-1]) + MS], [1, 2])
    timers = sleep_due_times(tables, rt_cpu=3)
    samples = pl.DataFrame({"thread": [0] * 6, "cycle": range(6), "latency_ns": latency})
    (line,) = timelines(samples, MS, start_ns=0, timers=timers)
    assert line.method == BY_TRACE and line.matched == 1.0
    assert line.due_ns.tolist() == due.tolist()


def test_timers_off_the_grid_fall_back_to_the_run_start() -> None:
    """Timers that do not fit the samples are not trusted: approximate times, said so."""
    latency = [120_000, 2_400_000, 90_000, 1_000_000]
    off = [5_000 * MS + i * 1_300_000 for i in range(4)]
    tables = _trace_tables(off, [])
    samples = pl.DataFrame({"thread": [0] * 4, "cycle": range(4), "latency_ns": latency})
    (line,) = timelines(samples, MS, 77 * MS, sleep_due_times(tables, rt_cpu=3))
    assert line.method == BY_START and "APPROXIMATE" in line.method
    assert line.due_ns[0] == 77 * MS and line.matched is not None and line.matched < 0.9


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Export]:
    """The fixture bundle (a private copy) and its whole export read back."""
    root = tmp_path_factory.mktemp("b") / "b"
    shutil.copytree(FIXTURE, root)
    out = root.parent / "all.pftrace"
    export_bundle(root, out)
    return root, read_export(out)


def _samples(root: Path, run: str) -> pl.DataFrame:
    """A run's cyclictest samples."""
    return read_cyclictest_verbose(root / "runs" / run / "cyclictest.txt")


def test_traced_run_latencies_are_timed_by_its_trace(exported: tuple[Path, Export]) -> None:
    """Every sample is a counter value at its due time; the first due time is a real timer."""
    root, export = exported
    samples = _samples(root, "before-traced-0")
    group = "run before-traced-0 (traced)"
    name = next(n for n in export.children(group) if n.startswith("cyclictest latency"))
    values = export.counters[name]
    assert [v for _, v in values] == samples["latency_ns"].cast(pl.Float64).to_list()
    assert "hrtimer_start" in export.description(name)
    trace = tracekit.open(root / "runs" / "before-traced-0" / "trace")
    expires = trace.event("hrtimer_start").filter(pl.col("function_sym") == "hrtimer_wakeup")
    assert values[0][0] in set(expires["softexpires"].to_list())


def test_worst_wake_ups_are_slices_with_details(exported: tuple[Path, Export]) -> None:
    """The ten largest latencies, each a slice as long as its latency, with its cycle."""
    root, export = exported
    samples = _samples(root, "before-traced-0")
    worst = export.slices["cyclictest worst 10 wake-ups, CPU 3 (before-traced-0)"]
    top = samples.sort("latency_ns", descending=True).head(10)
    assert sorted(s.args["latency_ns"] for s in worst) == sorted(top["latency_ns"].to_list())
    assert all(s.end - s.start == s.args["latency_ns"] for s in worst)
    by_rank = {s.args["rank"]: s for s in worst}
    assert by_rank[1].args["latency_ns"] == samples["latency_ns"].max()
    assert by_rank[1].args["cycle"] == samples.sort("latency_ns")["cycle"][-1]


def test_quiet_run_times_are_marked_approximate(exported: tuple[Path, Export]) -> None:
    """A quiet run has no trace: its counter starts at the run's start and says so."""
    root, export = exported
    run = next(r for r in read_manifest(root).runs if r.run_id == "before-quiet-0")
    (name,) = [n for n in export.children("run before-quiet-0 (quiet)") if "latency" in n]
    assert "APPROXIMATE" in export.description(name)
    assert export.counters[name][0][0] == run.start_ns
    assert len(export.counters[name]) == _samples(root, "before-quiet-0").height


def test_probe_samples_are_a_counter_at_their_own_times(exported: tuple[Path, Export]) -> None:
    """Every probe.bin sample: its timestamp (boot clock) and its call duration."""
    root, export = exported
    header, samples = read_probe_file(root / "runs" / "before-probe-page-cpu3" / "probe.bin")
    values = export.counters[
        f"TLBI probe on CPU {header.cpu}: page, RW->RO and RO->RW pooled: syscall duration"
        " (before-probe-page-cpu3)"  # a version-1 file: no direction recorded
    ]
    want = zip(samples["timestamp_ns"], samples["duration_ns"].cast(float), strict=True)
    assert values == list(want)
    run = next(r for r in read_manifest(root).runs if r.run_id == "before-probe-page-cpu3")
    assert run.start_ns <= values[0][0] and values[-1][0] <= run.end_ns  # type: ignore[operator]


def test_probe_directions_are_counters_of_their_own(tmp_path: Path) -> None:
    """A version-2 file's RW->RO and RO->RW samples (different kernel paths) go on two
    counters, each saying a sample is a whole syscall on its issuing CPU."""
    header = ProbeHeader(
        cpu=1, mode="page", pages=1, counter_hz=62_500_000, count=4, clock_id=7, helpers=3,
        version=2,
    )  # fmt: skip
    samples = pl.DataFrame(
        {
            "timestamp_ns": [100, 200, 300, 400],
            "duration_ns": [10, 20, 30, 40],
            "direction": ["rw-ro", "ro-rw", "rw-ro", "ro-rw"],
        }
    )
    out = tmp_path / "p.pftrace"
    with PacketWriter(out) as writer:
        tracks = TrackWriter(writer)
        root = tracks.track("root", "tracekit")
        assert write_probe_samples(tracks, root, "r", (header, samples), None, (None, 300)) == 3
    assert validate_file(out).ok
    export = read_export(out)
    assert export.counters["TLBI probe on CPU 1: page rw-ro: syscall duration (r)"] == [
        (100, 10.0), (300, 30.0)
    ]  # fmt: skip
    assert export.counters["TLBI probe on CPU 1: page ro-rw: syscall duration (r)"] == [(200, 20.0)]
    said = export.description("TLBI probe on CPU 1: page rw-ro: syscall duration (r)")
    assert "one whole mprotect/munmap syscall" in said
    assert "CPU 1 is the issuer, never the slow responder" in said
