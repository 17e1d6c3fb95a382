"""The REPEAT_TLBI workaround in the ground truth (tracekit/analysis/gtrepeat.py): its
TLBIs told apart by Rt = XZR, and every completion of a broadcast stage-1 TLBI checked
for its repeat, exactly, on a cut of the demo's real boot
(tests/fixtures/gtrepeat/README.md: bookworm 6.1, nVHE, 4 x cortex-a76)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis import groundtruth as g
from tracekit.analysis import gtrepeat

FIXTURE = Path(__file__).parent / "fixtures" / "gtrepeat" / "nvhe-a76-61.json"
SCHEMA = {
    "ts": pl.Int64,
    "ts_host": pl.Int64,
    "cpu": pl.Int32,
    "operation": pl.String,
    "kind": pl.String,
    "scope": pl.String,
    "effective_shareability": pl.String,
    "where": pl.String,
    "symbol": pl.String,
    "insn": pl.UInt32,
}
REPEAT = "TLBI VALE1IS, XZR (REPEAT_TLBI)"


@pytest.fixture(scope="module")
def cut() -> dict:
    """The fixture's JSON."""
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def table(cut: dict) -> pl.DataFrame:
    """The cut's ground-truth rows."""
    return pl.DataFrame(cut["rows"], schema=SCHEMA)


def test_every_completion_once_patched_is_followed_by_its_repeat(table: pl.DataFrame) -> None:
    """Exact counts on the cut (what cut.py chose: 20 + 12 - 1 direct, 9, 10): every
    kernel DSB ISH completing a broadcast stage-1 TLBI after the workaround is patched in
    is followed by TLBI VALE1IS, XZR, directly or, 9 times in the boot, after an interrupt
    (gic_handle_irq's DSB SY between the DSB and the repeat, the repeat right after it);
    none is missing; the __set_fixmap completions of early boot, before the first repeat,
    have none."""
    done = gtrepeat.completions(table)
    by = dict(done.group_by("outcome").len().iter_rows())
    assert by == {"repeat": 31, "repeat-after": 9, "not-patched": 10}
    after = done.filter(pl.col("outcome") == "repeat-after")
    assert set(after["between"]) == {"gic_handle_irq+0x24"}
    assert after["where"].unique().to_list() == ["kernel"]
    early = done.filter(pl.col("outcome") == "not-patched")
    assert set(early["symbol"]) == {"__set_fixmap+0xb0"} and set(early["cpu"]) == {0}
    first = table.filter(gtrepeat.is_repeat())["ts"].min()
    assert early["ts"].max() < first
    # Each repeat in the cut follows one completion: none unaccounted for.
    assert table.filter(gtrepeat.is_repeat()).height == by["repeat"] + by["repeat-after"]


def test_a_missing_repeat_is_missing(table: pl.DataFrame) -> None:
    """The same cut with one repeat TLBI (and its DSB ISH) taken out: that completion,
    once patched in, is `missing`, and the sentence says so."""
    repeats = table.filter(gtrepeat.is_repeat()).sort("ts")
    gone = repeats.row(len(repeats) // 2, named=True)
    rest = table.filter(~((pl.col("ts_host") == gone["ts_host"]) & (pl.col("cpu") == gone["cpu"])))
    done = gtrepeat.completions(rest)
    assert done.filter(pl.col("outcome") == "missing").height == 1
    line = gtrepeat.completion_line(done, repeats.height - 1)
    assert line is not None and "1 once it is patched in have none" in line
    assert line.startswith("REPEAT_TLBI workaround, in the bundle's runs:")  # its scope
    contradiction = gtrepeat.missing_line(done)
    assert contradiction is not None and f"(CPU {gone['cpu']})" in contradiction
    assert gtrepeat.missing_line(gtrepeat.completions(table)) is None


def test_a_switch_before_the_sync_is_not_a_missing_repeat(table: pl.DataFrame) -> None:
    """7.2 is preemptible: __switch_to's DSB ISH can complete a flush's TLBI before the
    flush's own sync. Such a completion without its repeat is `switched`, stated as not
    known, and no contradiction; the same DSB in any other function stays `missing`."""
    repeats = table.filter(gtrepeat.is_repeat()).sort("ts")
    gone = repeats.row(len(repeats) // 2, named=True)
    rest = table.filter(~((pl.col("ts_host") == gone["ts_host"]) & (pl.col("cpu") == gone["cpu"])))
    lost = gtrepeat.completions(rest).filter(pl.col("outcome") == "missing").row(0, named=True)
    at = (pl.col("cpu") == lost["cpu"]) & (pl.col("ts") == lost["ts"])
    switched = rest.with_columns(
        symbol=pl.when(at & (pl.col("operation") == "DSB ISH"))
        .then(pl.lit("__switch_to"))
        .otherwise(pl.col("symbol"))
    )
    done = gtrepeat.completions(switched)
    assert done.filter(pl.col("outcome") == "switched").height == 1
    assert done.filter(pl.col("outcome") == "missing").is_empty()
    assert gtrepeat.missing_line(done) is None
    line = gtrepeat.completion_line(done, repeats.height - 1)
    assert line is not None and "1 completed first by a context switch's DSB ISH" in line


def test_a_missing_repeat_is_a_contradiction_in_the_summarys_lead(table: pl.DataFrame) -> None:
    """summarise puts a missing repeat among its findings (the report's lead: the
    workaround did not run there), not only in the REPEAT line (review 15b B9)."""
    from tracekit.analysis.gtsignatures import packaged_signatures

    gone = table.filter(gtrepeat.is_repeat()).sort("ts").row(20, named=True)
    kept = ~((pl.col("ts_host") == gone["ts_host"]) & (pl.col("cpu") == gone["cpu"]))
    run = {"run_id": pl.lit("r"), "phase": pl.lit("before"), "regime": pl.lit(None, pl.String)}

    def lead(rows: pl.DataFrame) -> list[str]:
        """The summary's findings on these rows, as one run with no VM steps."""
        steps = pl.DataFrame(schema=g.STEP_SCHEMA)
        setup, context = ("6.1", "nvhe", "cortex-a76"), g.StepContext((0, 1, 2, 3), (1,))
        given = rows.with_columns(**run)
        signatures = packaged_signatures()
        return g.summarise(given, steps, signatures, setup, context, {}, [], None, {}).findings

    assert lead(table) == []
    found = lead(table.filter(kept))
    assert len(found) == 1 and found[0].startswith("REPEAT_TLBI workaround: 1 DSB ISH")


def test_a_completion_at_the_rows_end_is_cut_not_missing(table: pl.DataFrame) -> None:
    """Rows that end right after a completing DSB ISH (a run's last instructions, review
    15b B9): no next TLBI to judge by, so `cut`, never a `missing` contradiction."""
    done = gtrepeat.completions(table)
    last = done.filter(pl.col("outcome") == "repeat").sort("ts").row(-1, named=True)
    before = table.filter((pl.col("cpu") != last["cpu"]) | (pl.col("ts") <= last["ts"]))
    ended = gtrepeat.completions(before)
    assert ended.filter(pl.col("ts") == last["ts"])["outcome"].to_list() == ["cut"]
    assert gtrepeat.missing_line(ended) is None
    line = gtrepeat.completion_line(ended, 0)
    assert line is not None and line.endswith("; 1 at the rows' end, not known")


def test_the_repeats_are_labelled_apart_in_the_counts(table: pl.DataFrame) -> None:
    """invalidations() names the workaround's TLBIs apart (Rt = XZR), so a count by
    instruction does not add them to the host's own per-page VALE1IS; a VALE1IS with
    another register is the plain one."""
    rows = g.invalidations(table)
    counted = dict(g.counts(rows, ("instruction",)).iter_rows())
    rt = (pl.col("insn").cast(pl.Int64) & 0x1F) == 31
    vale1is = table.filter(pl.col("operation") == "TLBI VALE1IS")
    assert counted[REPEAT] == vale1is.filter(rt).height > 0
    assert counted["TLBI VALE1IS"] == vale1is.filter(~rt).height > 0


def test_the_whole_boot_counts_recorded_with_the_cut(cut: dict) -> None:
    """The demo boot's whole-log counts cut.py wrote beside the cut (docs/vhost.md quotes
    them): 59,759 repeats, each after one completion, none missing."""
    whole = cut["whole_boot"]
    assert whole == {"not-patched": 78_085, "repeat": 59_750, "repeat-after": 9}
    assert cut["whole_boot_repeats"] == whole["repeat"] + whole["repeat-after"]


def test_no_line_without_the_workaround(table: pl.DataFrame) -> None:
    """A boot without repeats (max, cortex-a53): every completion is not-patched, no line."""
    plain = table.filter(~gtrepeat.is_repeat())
    done = gtrepeat.completions(plain)
    assert set(done["outcome"]) == {"not-patched"}
    assert gtrepeat.completion_line(done, 0) is None
