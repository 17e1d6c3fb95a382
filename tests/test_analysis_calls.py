"""Entry/return probes paired into calls: per thread as a stack, never per CPU."""

import polars as pl

from tracekit.analysis.calls import pair_calls


def _events(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    """(row, ts, cpu, common_pid) rows as an ingest table."""
    return pl.DataFrame(rows, schema=["row", "ts", "cpu", "common_pid"], orient="row")


def test_a_call_that_migrated_keeps_its_duration() -> None:
    """Entry on CPU 0, return on CPU 2: one call of 30 ns (pairing per CPU lost it)."""
    calls, orphans = pair_calls(_events([(1, 100, 0, 7)]), _events([(2, 130, 2, 7)]))
    assert calls.select("pid", "cpu", "start_ts", "dur_ns").rows() == [(7, 0, 100, 30)]
    assert orphans == 0


def test_nested_calls_pair_as_a_stack_and_threads_apart() -> None:
    entries = _events([(1, 10, 0, 1), (2, 12, 1, 2), (3, 15, 0, 1), (6, 40, 0, 1)])
    returns = _events([(4, 20, 0, 1), (5, 25, 0, 1), (7, 30, 1, 2)])
    calls, orphans = pair_calls(entries, returns)
    # pid 1: outer 10..25 holds inner 15..20; its third call never returned.
    assert calls.select("pid", "start_ts", "end_ts").rows() == [
        (1, 10, 25), (2, 12, 30), (1, 15, 20), (1, 40, None)
    ]  # fmt: skip
    assert orphans == 0


def test_a_return_without_its_entry_is_counted_not_guessed() -> None:
    """The trace started inside a call: its return closes nothing; later calls pair."""
    calls, orphans = pair_calls(_events([(2, 50, 0, 1)]), _events([(1, 5, 0, 1), (3, 60, 0, 1)]))
    assert calls.select("start_ts", "end_ts").rows() == [(50, 60)]
    assert orphans == 1


def test_pid_0_has_a_stack_per_cpu() -> None:
    """Two CPUs' idle tasks (both pid 0) in calls at once: each return closes its CPU's."""
    entries = _events([(1, 10, 0, 0), (2, 12, 1, 0)])
    returns = _events([(3, 20, 0, 0), (4, 30, 1, 0)])
    calls, orphans = pair_calls(entries, returns)
    assert calls.select("cpu", "start_ts", "end_ts").rows() == [(0, 10, 20), (1, 12, 30)]
    assert orphans == 0


def test_an_entry_without_return_may_be_a_missed_return_when_the_kretprobe_missed() -> None:
    from tracekit.analysis.calls import unclosed_note

    entries = _events([(1, 10, 0, 5), (3, 40, 0, 5)])
    returns = _events([(2, 20, 0, 5)])
    missed, _ = pair_calls(entries, returns, returns_missed=3)
    assert missed["maybe_missed_return"].to_list() == [None, True]
    assert "up to 1 may be missed returns" in str(unclosed_note(missed, 3))
    none_missed, _ = pair_calls(entries, returns, returns_missed=0)
    assert none_missed["maybe_missed_return"].to_list() == [None, False]
    assert "missed none" in str(unclosed_note(none_missed, 0))
    unknown, _ = pair_calls(entries, returns)
    assert unknown["maybe_missed_return"].to_list() == [None, None]
    assert "did not record" in str(unclosed_note(unknown, None))
    closed, _ = pair_calls(entries.head(1), returns)
    assert unclosed_note(closed, 3) is None


def test_a_runs_probe_misses_are_read_by_event_name() -> None:
    """RunRecord.probe_misses keys are "tracekit/EVENT"; a probe not listed is unknown."""
    from tracekit.analysis.calls import missed_note, probe_missed, returns_missed

    misses = {"tracekit/kvm_free_stage2_pgd_ret": 2, "tracekit/kvm_free_stage2_pgd": 0}
    assert returns_missed(misses, "kvm_free_stage2_pgd") == 2
    assert probe_missed(misses, "kvm_free_stage2_pgd") == 0
    assert returns_missed(misses, "kvm_arch_destroy_vm") is None
    assert returns_missed(None, "kvm_free_stage2_pgd") is None
    entries = _events([(1, 100, 0, 7), (3, 300, 0, 7)])
    returns = _events([(2, 130, 0, 7)])
    note = missed_note("f", entries, returns, 2)
    assert note is not None and note.startswith("f: 1 call(s) without a return")
    assert missed_note("f", entries.head(1), returns, 2) is None


def test_misses_are_summed_over_runs_and_unknown_if_one_run_did_not_record_them() -> None:
    from tracekit.analysis.calls import misses_over_runs

    one = {"tracekit/f": 1, "tracekit/f_ret": 2}
    two = {"tracekit/f": 0, "tracekit/f_ret": 3}
    assert misses_over_runs([one, two], "f") == (1, 5)
    assert misses_over_runs([one, None], "f") == (None, None)
    assert misses_over_runs([{"tracekit/f": 4}], "f") == (4, None)  # no kretprobe
    assert misses_over_runs([], "f") == (0, 0)
