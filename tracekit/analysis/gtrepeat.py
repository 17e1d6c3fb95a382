"""The REPEAT_TLBI erratum workaround in the ground truth: its extra TLBIs told apart,
and every completion of a broadcast stage-1 TLBI checked for its repeat.

With ARM64_WORKAROUND_REPEAT_TLBI ("Broken broadcast TLBI completion"; 6.1.176
arch/arm64/kernel/cpu_errata.c:578-585: Cortex-A55 2441007, Cortex-A76 4118414 and
others, all revisions), `__tlbi_sync_s1ish` and `__tlbi_sync_s1ish_hyp` follow their
`dsb(ish)` with `__repeat_tlbi_sync(vale1is, 0)` / `(vale2is, 0)`: one more `TLBI
VALE1IS, XZR` (host) or `TLBI VALE2IS, XZR` (hyp code) and `DSB ISH`
(arch/arm64/include/asm/tlbflush.h:153-159, :165-169, :175-179). Those are the only
VALE1IS/VALE2IS with a constant 0 operand in 6.1.176's arch/arm64, so Rt = XZR (the
recorded word's bits 4:0 = 31) in kernel or hyp text tells them apart exactly.

The capability is ARM64_CPUCAP_LOCAL_CPU_ERRATUM (cpu_errata.c:582), not a boot-CPU
one: apply_boot_alternatives patches only boot_capabilities (alternative.c:269-277;
cpufeature.c:2944-2945 sets only SCOPE_BOOT_CPU ones there), and the rest, this one
included, is patched by apply_alternatives_all from smp_cpus_done (smp.c:441), once all
CPUs are up. So before the boot's first repeat no completion has one.
"""

from __future__ import annotations

import polars as pl

REPEAT_OPERATIONS = ("TLBI VALE1IS", "TLBI VALE2IS")
REPEAT_LABEL = ", XZR (REPEAT_TLBI)"
XZR = 31
SWITCH_SYMBOL = "__switch_to"
# What a completion was followed by.
OUTCOMES = {
    "repeat": "its repeat was the CPU's next TLBI/DSB/IC record",
    "repeat-after": (
        "other records first (an interrupt or a switch), then its repeat as the CPU's next TLBI"
    ),
    "switched": (
        "a context switch's DSB ISH (__switch_to) came before the flush's own sync, and no"
        " repeat as the CPU's next TLBI: the repeat runs after the sync, wherever the task"
        " resumes; whether the erratum needs one after this DSB is not known"
    ),
    "missing": "no repeat as the CPU's next TLBI",
    "cut": "the rows end before the CPU's next TLBI (a run's last ones): not known",
    "not-patched": "none, before the log's first repeat (the workaround not patched in yet)",
}
COMPLETION_SCHEMA = {
    "cpu": pl.Int64,
    "ts": pl.Int64,
    "where": pl.String,
    "symbol": pl.String,  # the DSB ISH's
    "completed": pl.String,  # the TLBI it completes
    "outcome": pl.String,  # OUTCOMES
    "between": pl.String,  # repeat-after: the first record's symbol in between
}
_MAINT_KINDS = ("tlbi", "tlbi-nxs", "dsb", "dsb-nxs", "ic")
_STAGE2_ONLY = ("ipa", "ipa-range")  # the repeat is for stage-1 invalidations


def is_repeat() -> pl.Expr:
    """Whether a ground-truth row is the workaround's TLBI: VALE1IS/VALE2IS, Rt = XZR, in
    kernel or hyp text."""
    xzr = (pl.col("insn").cast(pl.Int64) & 0x1F) == XZR
    code = pl.col("where").is_in(["kernel", "hyp"])
    return pl.col("operation").is_in(REPEAT_OPERATIONS) & xzr & code


def instruction() -> pl.Expr:
    """The operation as tables count it: the workaround's TLBIs labelled apart, e.g.
    'TLBI VALE1IS, XZR (REPEAT_TLBI)'."""
    labelled = pl.concat_str(pl.col("operation"), pl.lit(REPEAT_LABEL))
    return pl.when(is_repeat()).then(labelled).otherwise(pl.col("operation"))


def is_repeat_label() -> pl.Expr:
    """Whether an operation (as tables count it: instruction()) is a workaround's TLBI."""
    return pl.col("operation").str.ends_with(REPEAT_LABEL)


def completions(table: pl.DataFrame) -> pl.DataFrame:
    """Each DSB ISH in kernel or hyp text that completes a broadcast stage-1 TLBI (the
    last TLBI on its CPU since the previous such DSB ISH, not itself a repeat), with what
    followed it (COMPLETION_SCHEMA). `table`: ground-truth rows, DSBs included."""
    rows = _stream(table)
    if rows.is_empty():
        return pl.DataFrame(schema=COMPLETION_SCHEMA)
    found = rows.filter("repeat")["ts"].min()
    first = found if found is not None else 1 << 62
    done = rows.filter(pl.col("sync") & pl.col("completes").is_not_null())
    outcome = (
        pl.when(pl.col("next_repeat"))
        .then(pl.lit("repeat"))
        .when(pl.col("next_tlbi_repeat"))
        .then(pl.lit("repeat-after"))
        .when(pl.col("ts") < first)
        .then(pl.lit("not-patched"))
        .when(~pl.col("next_tlbi_known"))
        .then(pl.lit("cut"))
        # A preemptible kernel (7.2's PREEMPT_LAZY) can switch between a flush's TLBI and
        # its sync: __switch_to's dsb(ish) is not the workaround's, so not a contradiction.
        .when(pl.col("symbol") == SWITCH_SYMBOL)
        .then(pl.lit("switched"))
        .otherwise(pl.lit("missing"))
    )
    between = pl.when(outcome == "repeat-after").then(pl.col("next_symbol"))
    return done.select(
        pl.col("cpu").cast(pl.Int64),
        pl.col("ts").cast(pl.Int64),
        "where",
        "symbol",
        completed=pl.col("completes"),
        outcome=outcome,
        between=between,
    )


def _stream(table: pl.DataFrame) -> pl.DataFrame:
    """Each CPU's maintenance records in order, with what completions() needs: sync (a
    DSB ISH of kernel or hyp text), completes (the broadcast stage-1 TLBI it completes,
    else null), the next record's repeat and symbol, whether the next TLBI repeats and
    whether the rows hold a next TLBI at all."""
    code = pl.col("where").is_in(["kernel", "hyp"])
    tlbi = pl.col("kind").is_in(["tlbi", "tlbi-nxs"]) & code
    rows = (
        table.filter(pl.col("kind").is_in(_MAINT_KINDS))
        .sort("cpu", "ts_host", maintain_order=True)
        .with_columns(repeat=is_repeat(), sync=(pl.col("operation") == "DSB ISH") & code)
    )
    broadcast = (pl.col("effective_shareability") != "non-shareable") & ~pl.col("repeat")
    stage1 = ~pl.col("scope").fill_null("").is_in(_STAGE2_ONLY)
    pending = pl.when(tlbi & broadcast & stage1).then(pl.col("operation"))
    # The last TLBI since the previous sync, carried forward within each CPU's segment.
    segment = pl.col("sync").cast(pl.Int32).cum_sum().shift(1, fill_value=0).over("cpu")
    last = pl.when(tlbi).then(pending.fill_null("")).forward_fill().over("cpu", "segment")
    next_tlbi = pl.when(tlbi).then(pl.col("repeat")).shift(-1).backward_fill().over("cpu")
    return (
        rows.with_columns(segment=segment)
        .with_columns(completes=pl.when(pl.col("sync")).then(last.replace("", None)))
        .with_columns(
            next_repeat=pl.col("repeat").shift(-1).over("cpu").fill_null(False),
            next_symbol=pl.col("symbol").shift(-1).over("cpu"),
            next_tlbi_repeat=next_tlbi.fill_null(False),
            next_tlbi_known=next_tlbi.is_not_null(),
        )
    )


def completion_counts(done: pl.DataFrame) -> pl.DataFrame:
    """Completions per where, outcome and the completing DSB's function."""
    function = pl.col("symbol").str.split("+").list.first().alias("function")
    return (
        done.group_by("where", "outcome", function)
        .agg(pl.len().alias("count"))
        .sort("where", "outcome", "function", nulls_last=True)
    )


def missing_line(done: pl.DataFrame) -> str | None:
    """A contradiction when completions lack their repeat once it is patched in (the
    workaround did not run there), else None."""
    missing = done.filter(pl.col("outcome") == "missing")
    if missing.is_empty():
        return None
    cpus = ", ".join(str(c) for c in sorted(set(missing["cpu"].to_list())))
    return (
        f"REPEAT_TLBI workaround: {missing.height} DSB ISH completing a broadcast stage-1 "
        f"TLBI once it is patched in are not followed by the repeat TLBI (CPU {cpus}): the "
        "workaround did not run there"
    )


def completion_line(done: pl.DataFrame, repeats: int) -> str | None:
    """One sentence of the completions' outcomes against the `repeats` (workaround TLBIs)
    counted (None when no completion was followed by one: no workaround, or not run)."""
    by = dict(done.group_by("outcome").len().iter_rows())
    followed = by.get("repeat", 0) + by.get("repeat-after", 0)
    if not followed:
        return None
    early = by.get("not-patched", 0)
    before = (
        f"; {early} before the first repeat have none (patched in once the CPUs are up)"
        if early
        else ""
    )
    # The rows are the runs' only: a completion in a run's last instructions can read as
    # missing, a repeat just inside the next run as unfollowed; the line says its scope.
    return (
        f"REPEAT_TLBI workaround, in the bundle's runs: {by.get('repeat', 0)} DSB ISH "
        "completing a broadcast "
        f"stage-1 TLBI are followed directly by the repeat TLBI, {by.get('repeat-after', 0)} "
        f"after an interrupt or a switch in between, {by.get('missing', 0)} once it is "
        f"patched in have none ({followed} of the {repeats} repeat TLBIs counted){before}"
        + (f"; {by['cut']} at the rows' end, not known" if by.get("cut") else "")
        + (
            f"; {by['switched']} completed first by a context switch's DSB ISH (__switch_to)"
            " with no repeat after it: not counted as missing, whether the erratum needs"
            " one there is not known"
            if by.get("switched")
            else ""
        )
    )
