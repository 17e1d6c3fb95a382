"""The wake-up decomposition on a real traced run's cut, and on generated loops.

tests/fixtures/analysis/wakeup-before/ is 0.6 s of a real traced run of the emulated
host (README.md says how it was cut); tests/wakeup_synth.py generates loops whose parts
are known, for what a real run cannot be made to show (an injected long interrupt).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import wakeup_synth as synth

from tracekit.analysis.wakecheck import against_cyclictest, paired_offset
from tracekit.analysis.wakeup import COMPONENTS, decompose, measuring_threads
from tracekit.errors import TracekitError

FIXTURES = Path(__file__).parent / "fixtures" / "analysis"


def load_cut(name: str) -> tuple[dict[str, pl.DataFrame], dict[str, object]]:
    """A cut's event tables and its meta.json."""
    where = FIXTURES / name
    events = {p.stem: pl.read_parquet(p) for p in sorted(where.glob("*.parquet"))}
    return events, json.loads((where / "meta.json").read_text())


@pytest.fixture(scope="module")
def real() -> tuple[pl.DataFrame, dict[str, object], object]:
    """The real cut, decomposed."""
    events, meta = load_cut("wakeup-before")
    result = decompose(events, int(meta["rt_cpu"]), str(meta["clock"]))
    return result.frame, meta, result


def test_real_cut_parts_add_up_and_are_never_negative(real) -> None:
    frame, _, _ = real
    assert frame.height >= 40
    parts = frame.select(pl.sum_horizontal(list(COMPONENTS))).to_series()
    assert (parts == frame["total_ns"]).all()
    for column in COMPONENTS:
        assert frame[column].min() >= 0, column


def test_real_cut_stages_are_in_order(real) -> None:
    frame, _, _ = real
    # Every wake-up's switch-in follows its waking, which follows the timer interrupt.
    assert (frame["switch_ts"] >= frame["waking_ts"]).all()
    assert (frame["queued_ts"] >= frame["waking_ts"]).all()
    assert (frame["waking_ts"] >= frame["irq_entry_ts"]).all()
    assert (frame["switch_ts"] > frame["expiry_ns"]).all()


def test_real_cut_finds_the_measuring_thread_not_the_main_thread() -> None:
    events, meta = load_cut("wakeup-before")
    # cyclictest's main thread (SCHED_OTHER) also runs on the rt CPU; only the RT one counts.
    switches = events["sched_switch"].filter(
        (pl.col("cpu") == meta["rt_cpu"]) & (pl.col("next_comm") == "cyclictest")
    )
    assert switches["next_pid"].n_unique() == 2
    assert measuring_threads(events["sched_switch"], int(meta["rt_cpu"])) == [160]


def test_hand_checked_local_wakeup(real) -> None:
    frame, _, _ = real
    # Loop 4 of the cut (rows 18277-18289): timer expires 74121271424, arch_timer entry
    # 74121312736, waking 74121327184, wakeup 74121344608, irq exit 74121356176, switch
    # from idle 74121390400; see README.md.
    row = frame.filter(pl.col("wake_id") == 4).row(0, named=True)
    assert row["path"] == "local" and row["slept"]
    assert row["irq_delay_ns"] == 74121312736 - 74121271424
    assert row["handler_ns"] == (74121327184 - 74121312736) + (74121356176 - 74121344608)
    assert row["ipi_ns"] == 74121344608 - 74121327184
    assert row["sched_ns"] == 74121390400 - 74121356176
    assert row["irq_ns"] == row["softirq_ns"] == row["blocking_ns"] == 0
    assert row["total_ns"] == 74121390400 - 74121271424
    assert row["cause"] == "irq_delay"


def test_hand_checked_remote_wakeup(real) -> None:
    frame, _, _ = real
    # Loop 1: the timer fired on CPU 0 (nohz_full moved it) at 74115369968, woke the
    # thread at 74115485280; the IPI reached CPU 3 at 74116714240, wakeup 74116807296,
    # IPI exit 74116827696, switch 74116938880.
    row = frame.filter(pl.col("wake_id") == 1).row(0, named=True)
    assert (row["path"], row["timer_cpu"]) == ("remote", 0)
    assert row["irq_delay_ns"] == 74115369968 - 74113271424
    assert row["handler_ns"] == 74115485280 - 74115369968
    assert row["ipi_ns"] == (74116807296 - 74115485280) + (74116827696 - 74116807296)
    assert row["sched_ns"] == 74116938880 - 74116827696


def test_a_thread_woken_before_it_slept_ends_at_the_interrupt_exit(real) -> None:
    frame, _, _ = real
    stayed = frame.filter(~pl.col("slept"))
    assert stayed.height > 0
    assert (stayed["prev_comm"] == "cyclictest").all()
    assert (stayed["blocking_ns"] == 0).all() and (stayed["sched_ns"] == 0).all()


def test_real_cut_loops_not_whole_are_counted(real) -> None:
    _, _, result = real
    # The cut ends inside a sleep: that loop has no expiry in the cut and is counted.
    assert result.loops == result.frame.height + 1
    assert result.incomplete["stage"].to_list() == ["timer expiry (hrtimer_expire_entry)"]


def test_trace_agrees_with_cyclictest_loop_by_loop(real) -> None:
    frame, _, _ = real
    samples = pl.read_csv(FIXTURES / "wakeup-before" / "samples.csv")
    pairs = paired_offset(frame, samples).row(0, named=True)
    # cyclictest reads the clock later than the switch-in, never earlier.
    assert pairs["non_negative"] == 1.0
    assert 0 < pairs["median_us"] < 1000
    table = against_cyclictest(frame, samples)
    assert table["statistic"].to_list() == ["samples", "median", "p99", "max"]
    assert (table.filter(pl.col("statistic") != "samples")["difference_us"] > 0).all()


def test_shifted_pairing_is_detected(real) -> None:
    frame, _, _ = real
    samples = pl.read_csv(FIXTURES / "wakeup-before" / "samples.csv").slice(3)
    assert paired_offset(frame, samples).item(0, "non_negative") < 1.0


@pytest.mark.parametrize(
    ("loop", "cause", "column", "expected"),
    [
        (synth.Loop(other_irq=500_000), "irq", "irq_ns", 500_000),
        (synth.Loop(softirq=200_000), "softirq", "softirq_ns", 200_000),
        (synth.Loop(hog=300_000), "blocking", "blocking_ns", 303_000),
        (synth.Loop(irq_delay=400_000), "irq_delay", "irq_delay_ns", 400_000),
        (synth.Loop(handler=90_000), "handler", "handler_ns", 92_000),
    ],
)
def test_injected_part_is_the_cause(
    loop: synth.Loop, cause: str, column: str, expected: int
) -> None:
    frame = decompose(synth.events([synth.Loop(), loop, synth.Loop()]), synth.RT_CPU).frame
    row = frame.filter(pl.col("wake_id") == 1).row(0, named=True)
    assert row["cause"] == cause
    assert row[column] == expected
    assert row["total_ns"] == loop.total
    quiet = frame.filter(pl.col("wake_id") != 1)
    assert (quiet["cause"] == "irq_delay").all() and (quiet["total_ns"] == 31_000).all()


def test_missing_sched_waking_names_it_and_how_to_record_it() -> None:
    events, meta = load_cut("wakeup-before")
    del events["sched_waking"]
    with pytest.raises(TracekitError) as err:
        decompose(events, int(meta["rt_cpu"]))
    message = str(err.value)
    assert "sched_waking" in message and "sched/sched_waking" in message
    assert "trace-cmd record -e sched:sched_waking" in message
    assert "\n" not in message


def test_no_cyclictest_on_the_rt_cpu_is_a_clear_error() -> None:
    events, _ = load_cut("wakeup-before")
    with pytest.raises(TracekitError, match="no cyclictest thread ran on the rt CPU 2"):
        decompose(events, 2)


def test_without_symbols_the_sleep_timer_is_found_by_address() -> None:
    events = synth.events([synth.Loop(), synth.Loop(other_irq=50_000)])
    for name in ("hrtimer_start", "hrtimer_expire_entry"):
        events[name] = (
            events[name]
            .drop("function_sym")
            .with_columns(pl.lit(0xFFFF80000811A000, pl.UInt64).alias("function"))
        )
    frame = decompose(events, synth.RT_CPU).frame
    assert frame["cause"].to_list() == ["irq_delay", "irq"]


def test_other_trace_clocks_are_aligned_by_the_timer_now_field() -> None:
    events = synth.events([synth.Loop(), synth.Loop()])
    # A trace clock 5 ms ahead of CLOCK_MONOTONIC: event ts move, timer fields do not.
    shifted = {n: t.with_columns(pl.col("ts") + 5_000_000) for n, t in events.items()}
    frame = decompose(shifted, synth.RT_CPU, clock="local").frame
    # `now` is read 100 ns before hrtimer_expire_entry in the generator: that is the bias.
    assert frame["total_ns"].to_list() == [31_000 - 100, 31_000 - 100]


def test_sched_waking_enabled_but_never_seen_leaves_every_loop_incomplete() -> None:
    events, meta = load_cut("wakeup-before")
    del events["sched_waking"]
    result = decompose(events, int(meta["rt_cpu"]), enabled=["sched/sched_waking"])
    assert result.frame.height == 0
    stages = dict(result.incomplete.iter_rows())
    assert stages["sched_waking of the thread"] == result.loops - 1
