"""map_threads: results in input order, errors surface, one item runs inline; and the
binary decode that uses it gives the same tables on one core as on several."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import tracekit
from tracekit.ingest import tables, threads
from tracekit.ingest.threads import map_threads

FIX = Path(__file__).parent / "fixtures" / "ingest"


def test_results_keep_the_input_order() -> None:
    """Later items finishing first still come back in input order."""
    out = map_threads(lambda n: (time.sleep(0.01 * (5 - n)), n)[1], range(5))
    assert out == [0, 1, 2, 3, 4]


def test_an_error_in_a_worker_is_raised() -> None:
    """A failing item's exception reaches the caller (not swallowed by the pool)."""

    def work(n: int) -> int:
        if n == 3:
            raise ValueError("item 3 is bad")
        return n

    with pytest.raises(ValueError, match="item 3 is bad"):
        map_threads(work, range(6))


def test_items_not_started_are_cancelled_after_an_error() -> None:
    """Once an item fails, the queue is dropped: the error comes back without waiting for
    every other item to run."""
    ran: list[int] = []

    def work(n: int) -> int:
        if n == 0:
            raise RuntimeError("first item fails")
        time.sleep(0.05)
        ran.append(n)
        return n

    with pytest.raises(RuntimeError, match="first item fails"):
        map_threads(work, range(40))
    assert len(ran) < 10


def test_one_item_runs_in_the_calling_thread() -> None:
    """No pool for a single item: it runs where the caller runs."""
    assert map_threads(lambda _: threading.get_ident(), [0]) == [threading.get_ident()]


@pytest.mark.parametrize("name", ["small.v7zstd.dat", "arm64-nvhe.dat", "arm64-nvhe-graph.dat"])
def test_binary_tables_do_not_depend_on_the_thread_count(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """One core or several, small blocks of rows: the same tables, row for row."""
    monkeypatch.setattr(tables, "ROWS_PER_BLOCK", 64)  # many blocks, each decoded in parallel
    path = FIX / name
    threaded = tracekit.open(path, use_cache=False)
    monkeypatch.setattr(threads, "_usable_cpus", lambda: 1)
    inline = tracekit.open(path, use_cache=False)
    assert len(threaded.meta["cpus"]) > 1 and threaded.events.height > 64 * 4
    assert threaded.events.equals(inline.events) and threaded.lost.equals(inline.lost)
    assert threaded.event_names == inline.event_names
    for event in inline.event_names:
        assert threaded.event(event).equals(inline.event(event)), event
