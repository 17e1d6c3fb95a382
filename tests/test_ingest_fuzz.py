"""Fuzzing every reader (tests/fuzzing.py's seeds and mutations, hypothesis-driven):
a mutated input reads, or raises TracekitError with one line; never another exception.

Seeded (derandomize) with a fixed number of examples per reader so CI time is known
(128 inputs, each read, summarised and printed by `tracekit events`: about 15 s of CPU
on the shared 2-core machine); benchmarks/fuzz.py runs many more and prints the table.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pytest
from fuzzing import SEEDS, mutate, outcome, seed_copy
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

EXAMPLES = {"raw capture": 20}  # others: 12
# No shrinking: a failure names its seed and mutation, which benchmarks/fuzz.py reproduces.
FAST = settings(
    deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate]
)


@pytest.mark.parametrize("reader", list(SEEDS))
def test_mutated_inputs_read_or_fail_clearly(reader: str) -> None:
    """Each mutated input of this reader: read, or one clear TracekitError line."""

    @settings(FAST, max_examples=EXAMPLES.get(reader, 12))
    @given(seed=st.sampled_from(SEEDS[reader]), rng_seed=st.integers(0, 2**32 - 1))
    def check(seed: str, rng_seed: int) -> None:
        with tempfile.TemporaryDirectory(prefix="tk-fuzz-") as tmp:
            path = seed_copy(seed, Path(tmp))
            how = mutate(path, reader, random.Random(rng_seed))
            got = outcome(path, reader)
            assert got.kind != "crash", f"{reader}, {seed}, {how}: {got.detail}: {got.message}"

    check()


def test_unmutated_seeds_read() -> None:
    """The seeds themselves read without error (so a mutation is what the fuzz varies)."""
    with tempfile.TemporaryDirectory(prefix="tk-fuzz-") as tmp:
        for reader, seeds in SEEDS.items():
            for seed in seeds:
                work = Path(tmp) / f"{reader}-{Path(seed).name}".replace(" ", "_")
                work.mkdir()
                got = outcome(seed_copy(seed, work), reader)
                assert got.kind == "read", (reader, seed, got)
                shutil.rmtree(work)
