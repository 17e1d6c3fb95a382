"""The same input gives the same report, byte for byte, in every format.

polars' group_by, unique and value_counts leave their order unspecified, and its hash
seeds and thread count change from process to process: so each report is rendered in two
fresh processes with different PYTHONHASHSEED and POLARS_MAX_THREADS (the first parses
the traces, the second reads the cache the first wrote) and the bytes are compared.
Where a table is a set of records (exits, lost counts, causes), its rows are shuffled
and the analysis must give the same answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest
from report_bundles import copy_real_bundle
from vm_bundles import make_vm_bundle

from tracekit.analysis import vm
from tracekit.ingest.lost import lost_per_cpu
from tracekit.report.sections import wakeup

WAKEUP_BUNDLE = Path(__file__).parent / "fixtures" / "analysis" / "wakeup-bundle"
FORMATS = ("text", "email", "html", "json")

# Renders every bundle named on the command line in every format into OUT/<bundle>.<fmt>.
RENDER = textwrap.dedent(
    f"""
    import sys
    from pathlib import Path
    from tracekit.ingest.bundle import load_bundle
    from tracekit.report.assemble import build_report
    from tracekit.report.render import render
    out = Path(sys.argv[1])
    for bundle in map(Path, sys.argv[2:]):
        report = build_report([load_bundle(bundle)])
        for fmt in {FORMATS!r}:
            (out / f"{{bundle.name}}.{{fmt}}").write_text(render(report, fmt))
    """
)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Bundles whose reports hold every section the fixtures reach."""
    root = tmp_path_factory.mktemp("bundles")
    shutil.copytree(WAKEUP_BUNDLE, root / "wakeup")
    cache = {
        "c1": "cacheflush-1vcpu",
        "c2": "cacheflush-2vcpu",
        "c3": "cacheflush-2vcpu-big",
        "c4": "cacheflush-setway",
    }
    return [
        root / "wakeup",
        make_vm_bundle(root / "cache", cache, "6.1.0-50-arm64", kind="cache-toggle"),
        make_vm_bundle(root / "teardown", {"t": "teardown-6.1-a76"}, "6.1.0-50-arm64"),
        make_vm_bundle(root / "teardown12", {"t": "teardown-6.12-max"}, "6.12.117+deb13-arm64"),
        copy_real_bundle(root / "real"),
    ]


def _render(bundles: list[Path], out: Path, seed: int, threads: int) -> dict[str, bytes]:
    """Every bundle's report in every format, rendered by a fresh process."""
    out.mkdir()
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "POLARS_MAX_THREADS": str(threads)}
    result = subprocess.run(
        [sys.executable, "-c", RENDER, str(out), *map(str, bundles)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_the_same_bundles_give_the_same_bytes_in_every_format(
    bundles: list[Path], tmp_path: Path
) -> None:
    first = _render(bundles, tmp_path / "first", seed=1, threads=1)
    second = _render(bundles, tmp_path / "second", seed=2, threads=2)
    assert len(first) == len(bundles) * len(FORMATS)
    differing = [name for name in first if first[name] != second.get(name)]
    assert differing == []
    # The sections the orders were fixed in are there to compare.
    text = b"".join(first[f"{b.name}.text"] for b in bundles)
    for title in (b"guest exits by reason", b"cause (largest part)", b"slowest wake-ups"):
        assert title in text


def _shuffled(frame: pl.DataFrame, seed: int) -> pl.DataFrame:
    """The same rows in another order."""
    return frame.sample(fraction=1.0, shuffle=True, seed=seed)


def test_exit_reasons_with_equal_counts_come_out_in_one_order() -> None:
    # Two VMs, each with reasons of equal counts: the order once decided by hashing.
    rows = [(seq, 0, ec) for seq in (0, 1) for ec in (0x16, 0x24, 0x20, 0x01) for _ in range(3)]
    exits = pl.DataFrame(
        {
            "vm_seq": [r[0] for r in rows],
            "vcpu": [r[1] for r in rows],
            "ret": [2] * len(rows),  # ARM_EXCEPTION_TRAP: the reason is the ESR class
            "esr_ec": [r[2] for r in rows],
        },
        schema={"vm_seq": pl.Int32, "vcpu": pl.Int32, "ret": pl.Int64, "esr_ec": pl.Int64},
    )
    expected = vm.exits_by_reason(exits)
    assert expected["count"].to_list() == [3] * 8
    assert expected.filter(pl.col("vm_seq") == 0)["reason"].is_sorted()
    for seed in range(5):
        assert vm.exits_by_reason(_shuffled(exits, seed)).equals(expected)


def test_lost_counts_and_ranked_causes_ignore_row_order() -> None:
    lost = pl.DataFrame(
        {"cpu": [3, 1, 2, 1, 0], "source": ["stats", "stats", "page", "page", "stats"]},
    ).with_columns(count=pl.Series([5, 2, 0, 4, 1]))
    expected = lost_per_cpu(lost, {})
    assert list(expected) == [0, 1, 2, 3] and expected[1] == 4
    causes = pl.Series("cause", ["irq", "late_arm", "irq", "late_arm", "switch", "switch"])
    top = wakeup.ranked(causes)
    assert top.rows() == [("irq", 2), ("late_arm", 2), ("switch", 2)]
    for seed in range(5):
        assert list(lost_per_cpu(_shuffled(lost, seed), {}).items()) == list(expected.items())
        assert wakeup.ranked(causes.sample(fraction=1.0, shuffle=True, seed=seed)).equals(top)
