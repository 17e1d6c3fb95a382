#!/usr/bin/env python3
"""Fuzz every reader with many mutated inputs and print a table per reader: inputs tried,
read, clear errors (TracekitError, one line) and crashes (any other exception, which is a
bug), then each distinct crash with one input that gives it.

The mutations and the seed inputs are tests/fuzzing.py's, the same as the fuzz tests use
(tests/test_ingest_fuzz.py runs a fixed few per reader in CI); this runs many more.
Mutated copies go to a temporary directory, removed at the end.

    python3 benchmarks/fuzz.py [--per-reader 300] [--seed 1] [--reader NAME]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's tracekit, not an installed one

from fuzzing import SEEDS, mutate, outcome, seed_copy  # noqa: E402


def fuzz_reader(reader: str, n: int, seed: int, tmp: Path) -> tuple[Counter[str], dict[str, str]]:
    """n mutated inputs of one reader: outcome counts and one example per crash cause."""
    rng = random.Random(f"{seed}:{reader}")
    counts: Counter[str] = Counter()
    crashes: dict[str, str] = {}
    for i in range(n):
        work = tmp / f"{reader.replace(' ', '_')}-{i}"
        work.mkdir()
        path = seed_copy(rng.choice(SEEDS[reader]), work)
        how = mutate(path, reader, rng)
        got = outcome(path, reader)
        counts[got.kind] += 1
        if got.kind == "crash":
            crashes.setdefault(got.detail, f"{how}: {got.message}")
        _remove(work)
    return counts, crashes


def _remove(path: Path) -> None:
    """Delete one mutated copy."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    """Run the readers asked for and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-reader", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reader", action="append", choices=sorted(SEEDS))
    args = ap.parse_args()
    rows, causes = [], {}
    with tempfile.TemporaryDirectory(prefix="tracekit-fuzz-") as tmp:
        for reader in args.reader or list(SEEDS):
            counts, crashes = fuzz_reader(reader, args.per_reader, args.seed, Path(tmp))
            rows.append((reader, args.per_reader, counts["read"], counts["error"],
                         counts["crash"], len(crashes)))  # fmt: skip
            causes.update({f"{reader}: {k}": v for k, v in crashes.items()})
    print(f"{'reader':<22}{'inputs':>8}{'read':>8}{'errors':>8}{'crashes':>9}{'causes':>8}")
    for r in rows:
        print(f"{r[0]:<22}{r[1]:>8}{r[2]:>8}{r[3]:>8}{r[4]:>9}{r[5]:>8}")
    total = [sum(r[i] for r in rows) for i in range(1, 6)]
    print(f"{'total':<22}" + "".join(f"{v:>8}" if i != 3 else f"{v:>9}"
                                      for i, v in enumerate(total)))  # fmt: skip
    for cause, example in sorted(causes.items()):
        print(f"crash: {cause}\n  e.g. {example}")


if __name__ == "__main__":
    main()
