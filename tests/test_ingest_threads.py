"""map_threads: results in input order, errors surface, one item runs inline."""

from __future__ import annotations

import threading
import time

import pytest

from tracekit.ingest.threads import map_threads


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
