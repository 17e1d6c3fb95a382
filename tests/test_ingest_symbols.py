"""`<field>_sym` columns: address fields named from the trace's kallsyms or a given one.

Fixtures are real: tests/fixtures/symbols/capture-cut is a page cut of a raw capture from
the emulated host (kprobes, hrtimers, trace_marker writes) with its kallsyms cut to the
names it needs (tests/fixtures/symbols/README.md); small.v7.dat and small.report.txt are
trace-cmd's own file and report (tests/fixtures/ingest/README.md).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import main
from tracekit.errors import TracekitError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CUT = FIXTURES / "symbols" / "capture-cut"
OTHER_BOOT = FIXTURES / "symbols" / "kallsyms.cut"  # same kernel, another boot (KASLR)
# `function=NAME/0xOFFSET` as trace-cmd report prints hrtimer callbacks.
REPORT_FUNCTION = re.compile(
    r" (hrtimer_start|hrtimer_expire_entry): .*function=([\w.]+)/(0x[0-9a-f]+)"
)


def _copy(tmp_path: Path) -> Path:
    """A writable copy of the capture cut (the cache is written inside it)."""
    dst = tmp_path / "capture"
    shutil.copytree(CUT, dst, ignore=shutil.ignore_patterns(".tracekit-cache"))
    return dst


def test_kprobe_sites_are_named_after_their_probes() -> None:
    """collect names each probe after its function: __probe_ip must resolve to that name."""
    trace = tracekit.open(CUT, use_cache=False)
    assert trace.meta["symbols"] == f"kallsyms copy in {CUT}"
    probes = [n for n in trace.event_names if n.startswith("kvm_") and "__probe" in "".join(
        trace.event(n).columns)]  # fmt: skip
    assert len(probes) >= 6
    for name in probes:
        table = trace.event(name)
        if name.endswith("_ret"):  # kretprobe: the probed function, and where it returned to
            assert set(table["__probe_func_sym"]) == {name.removesuffix("_ret")}
            caller = table["__probe_ret_ip_sym"].cast(pl.String)  # Categorical
            assert caller.str.contains(r"^\w+$").all()
        else:
            assert set(table["__probe_ip_sym"]) == {name}, name


def test_pointer_fields_name_code_and_leave_data_null() -> None:
    """hrtimer callbacks resolve to function names; the hrtimer objects (heap) stay null."""
    table = tracekit.open(CUT, use_cache=False).event("hrtimer_start")
    assert table.schema["function_sym"] == pl.Categorical and table.schema["function"] == pl.UInt64
    assert table["function_sym"].null_count() == 0
    assert set(table["function_sym"]) <= {"tick_sched_timer", "hrtimer_wakeup", "it_real_fn"}
    assert table["hrtimer_sym"].null_count() == table.height  # not code: no name is guessed
    marks = tracekit.open(CUT, use_cache=False).event("print")
    assert (marks["ip_sym"] == "tracing_mark_write").all()  # inside it: no offset, as %ps


def test_names_match_trace_cmd_report() -> None:
    """small.v7.dat's own kallsyms names hrtimer callbacks as trace-cmd report does.

    That file's kallsyms was cut to timer and scheduler lines, so one callback lies
    between two kept symbols; trace-cmd then prints a negative offset from the next one
    (`/0xffff...`) where tracekit names the one below: only exact hits are compared.
    """
    trace = tracekit.open(FIXTURES / "ingest" / "small.v7.dat", use_cache=False)
    report = (FIXTURES / "ingest" / "small.report.txt").read_text()
    exact = 0
    for event in ("hrtimer_start", "hrtimer_expire_entry"):
        printed = [(name, off) for ev, name, off in REPORT_FUNCTION.findall(report) if ev == event]
        ours = trace.event(event)["function_sym"].to_list()
        assert len(ours) == len(printed) > 5
        for sym, (name, offset) in zip(ours, printed, strict=True):
            if offset == "0x0":
                assert sym == name
                exact += 1
    assert exact >= 50


def test_without_kallsyms_the_columns_are_null(tmp_path: Path) -> None:
    """No symbol source: same schema, null names, and meta and the summary say so."""
    capture = _copy(tmp_path)
    (capture / "kallsyms").unlink()
    trace = tracekit.open(capture, use_cache=False)
    assert trace.meta["symbols"] is None
    assert trace.event("hrtimer_start")["function_sym"].null_count() > 0
    assert (
        trace.event("hrtimer_start")["function_sym"].null_count()
        == trace.event("hrtimer_start").height
    )
    assert "symbols: none (no kallsyms copy; give --symbols)" in trace.summary()


def test_given_kallsyms_replaces_the_own_copy(tmp_path: Path) -> None:
    """Another boot's kallsyms (other KASLR offset) names nothing in this trace."""
    trace = tracekit.open(CUT, use_cache=False, symbols=OTHER_BOOT)
    assert trace.meta["symbols"] == f"kallsyms copy {OTHER_BOOT}"
    assert (
        trace.event("hrtimer_start")["function_sym"].null_count()
        == trace.event("hrtimer_start").height
    )


def test_cache_keeps_symbols_and_follows_their_source(tmp_path: Path) -> None:
    """The Parquet cache holds the _sym columns; changing the symbol source re-parses."""
    capture = _copy(tmp_path)
    first = tracekit.open(capture)
    again = tracekit.open(capture)
    assert not first.from_cache and again.from_cache
    assert again.event("hrtimer_start")["function_sym"].equals(
        first.event("hrtimer_start")["function_sym"]
    )
    other = tracekit.open(capture, symbols=OTHER_BOOT)
    assert not other.from_cache and other.meta["symbols"].startswith("kallsyms copy ")
    assert tracekit.open(capture, symbols=OTHER_BOOT).from_cache
    edited = tmp_path / "kallsyms"
    edited.write_text(OTHER_BOOT.read_text() + "ffffffffffff0000 t extra\n")
    assert not tracekit.open(capture, symbols=edited).from_cache
    back = tracekit.open(capture)
    assert not back.from_cache and back.meta["symbols"] == f"kallsyms copy in {capture}"
    (capture / "kallsyms").write_text((CUT / "kallsyms").read_text() + "\n")
    assert not tracekit.open(capture).from_cache  # the own copy is an input like any file


def test_text_trace_refuses_symbols() -> None:
    """A text trace prints names already: giving symbols is a clear error."""
    with pytest.raises(TracekitError, match="symbols are only applied to binary traces"):
        tracekit.open(FIXTURES / "ingest" / "small.trace.txt", use_cache=False, symbols=OTHER_BOOT)


def test_cli_symbols_option(tmp_path: Path) -> None:
    """`tracekit events --symbols` shows the names; a missing file is one clear line."""
    capture = _copy(tmp_path)
    args = ["events", str(capture), "--event", "kvm_free_stage2_pgd", "--format", "csv"]
    out = CliRunner().invoke(main, [*args, "--symbols", str(CUT / "kallsyms")])
    assert out.exit_code == 0, out.output
    assert "__probe_ip_sym" in out.output.splitlines()[0]
    assert ",kvm_free_stage2_pgd" in out.output
    bad = CliRunner().invoke(main, [*args, "--symbols", str(tmp_path / "nope")])
    assert bad.exit_code != 0 and "does not exist" in bad.output
    summary = CliRunner().invoke(main, ["ingest", str(capture)])
    assert f"symbols: kallsyms copy in {capture}" in summary.output


@pytest.mark.slow
def test_vmlinux_names_like_the_kernels_kallsyms() -> None:
    """The debug vmlinux, shifted by the capture's own kallsyms, gives the same names."""
    from tracekit.symbols.fetch import fetch_debug_vmlinux

    release = (FIXTURES / "symbols" / "uname").read_text().strip()
    vmlinux = fetch_debug_vmlinux("bookworm", release, print)
    own = tracekit.open(CUT, use_cache=False)
    from_vmlinux = tracekit.open(CUT, use_cache=False, symbols=vmlinux)
    assert "KASLR shift 0x" in from_vmlinux.meta["symbols"]
    compared = 0
    for name in own.event_names:
        cols = [c for c in own.event(name).columns if c.endswith("_sym")]
        assert own.event(name).select(cols).equals(from_vmlinux.event(name).select(cols)), name
        compared += sum(own.event(name)[c].drop_nulls().len() for c in cols)
    assert compared > 150


def _ps(found: object) -> str | None:
    """A SymbolTable lookup as %ps prints it: the name, and the module in brackets."""
    if found is None:
        return None
    symbol = found.symbol  # type: ignore[attr-defined]
    return f"{symbol.name} [{symbol.module}]" if symbol.module else symbol.name


def test_bulk_index_names_like_the_symbol_table() -> None:
    """The numpy index ingest uses gives what SymbolTable.lookup gives, address by address
    (code, inside functions, in modules, past the image, below it, in the linear map)."""
    import numpy as np

    from tracekit.ingest.symcols import AddressIndex
    from tracekit.symbols.kallsyms import read_kallsyms

    source = FIXTURES / "symbols" / "kallsyms.cut"
    table = read_kallsyms(source)
    index = AddressIndex.from_kallsyms(source.read_text())
    assert index is not None
    probes = {a + d for a in table.addresses for d in (0, 1, 0x40)} | {
        table.addresses[0] - 1,
        table.addresses[-1] + 0x10_0000,
        0xFFFF000012345678,
    }
    addresses = np.array(sorted(probes), dtype=np.uint64)
    expected = [_ps(table.lookup(int(a))) for a in addresses]
    assert index.names_of(addresses) == expected
    assert any(e and "[" in e for e in expected) and None in expected
    shifted = AddressIndex.from_table(table.shifted(0x1000))
    assert shifted.names_of(addresses + np.uint64(0x1000)) == expected


# Every kallsyms copy the fixtures hold (real boots, cut), for the bulk parser.
KALLSYMS_COPIES = [*sorted(FIXTURES.glob("**/kallsyms")), OTHER_BOOT]
# Lines the bulk parser must read as parse_line does: hidden (zero) and `$x` addresses,
# a tab before the module, upper-case hex, short addresses, junk, CRLF, no final newline.
ODD_KALLSYMS = (
    "0000000000000000 T hidden\n"
    "ffff800008010000 T _stext\n"
    "ffff800008010000 t alias_listed_second\n"
    "FFFF800008010040 W Upper\n"
    "zzzz800008010080 T not_hex\n"
    "\n"
    "ffff800008010100 t short_line\r\n"
    "ffff800000001000 d $d\t[9p]\n"
    "ffff800000001000 t p9_first\t[9p]\n"
    "ffff800000001800 T p9_last\t[9p]\n"
    "1000 A tiny\n"
    "ffff800008010200 T no_final_newline"
)


def _probes(addresses: list[int]) -> list[int]:
    """Addresses at, just past, inside and around each symbol, and far outside all."""
    return sorted(
        {a + d for a in addresses for d in (0, 1, 0x40)}
        | {addresses[0] - 1, addresses[-1] + 0x10_0000, 0xFFFF000012345678}
    )


@pytest.mark.parametrize(
    "text",
    [pytest.param(p.read_text(), id=str(p.relative_to(FIXTURES))) for p in KALLSYMS_COPIES]
    + [pytest.param(ODD_KALLSYMS, id="odd-lines")],
)
def test_bulk_kallsyms_parse_names_like_parse_line(text: str) -> None:
    """The numpy kallsyms parser names every address as the line-by-line SymbolTable does,
    on real copies and on odd lines."""
    import numpy as np

    from tracekit.ingest.symcols import AddressIndex
    from tracekit.symbols.kallsyms import parse_kallsyms

    table = parse_kallsyms(text, "test")
    index = AddressIndex.from_kallsyms(text)
    assert index is not None
    assert index.addresses.tolist() == table.addresses
    probes = _probes(table.addresses)
    assert index.names_of(np.array(probes, dtype=np.uint64)) == [
        _ps(table.lookup(a)) for a in probes
    ]


def test_bulk_kallsyms_parse_of_hidden_addresses_is_none() -> None:
    """A copy read without privilege (every address zero) gives no index at all."""
    from tracekit.ingest.symcols import AddressIndex

    assert AddressIndex.from_kallsyms("0000000000000000 T _stext\n0000000000000000 t x\n") is None
    assert AddressIndex.from_kallsyms("") is None


def test_symbol_columns_block_by_block_name_each_symbol_once() -> None:
    """Address columns named in several pieces (blocks, tables, threads) give each row
    the name its own lookup gives, NULL and uncovered addresses null, and the index
    decodes each symbol once whatever the number of pieces."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from tracekit.ingest.symcols import AddressIndex, symbol_column

    text = "".join(f"ffffffff8100{i:04x} T fn_{i}\n" for i in range(0, 0x1000, 0x10))
    text += "ffffffffc0000000 t mod_fn\t[kvm]\n"
    index = AddressIndex.from_kallsyms(text)
    assert index is not None
    rng = np.random.default_rng(5)
    known = 0xFFFFFFFF81000000 + rng.integers(0, 0x1000, 4000).astype(np.uint64)
    odd = np.array([0, 0xFFFFFFFFC0000000, 1, 0xFFFFFFFF81000010], np.uint64)
    pieces = [np.concatenate([known[k::5], odd]) for k in range(5)]
    with ThreadPoolExecutor(2) as pool:
        cols = list(pool.map(lambda p: symbol_column(pl.Series("ip", p), index, "ip_sym"), pieces))
    for piece, col in zip(pieces, cols, strict=True):
        assert col.dtype == pl.Categorical and col.name == "ip_sym"
        expect = index.names_of(piece)
        expect = [None if a == 0 else e for a, e in zip(piece.tolist(), expect, strict=True)]
        assert col.cast(pl.String).to_list() == expect
    assert cols[0].cast(pl.String).to_list()[-4:] == [None, "mod_fn [kvm]", None, "fn_16"]
    named = {v for c in cols for v in c.cast(pl.String).to_list() if v is not None}
    assert len(index.named.series) == len(named) + 1  # each once, after the null
