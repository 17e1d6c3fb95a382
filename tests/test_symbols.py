"""Symbols without the big debug vmlinux: kallsyms copies, tables, probe-args, errors, guests.

The kallsyms copy and function trace are real (tests/fixtures/symbols/README.md); the
foreign and stripped ELFs are real binaries (this Python, the cross-built reproducer).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.symbols import hypcalls, probeargs
from tracekit.symbols.kallsyms import kaslr_shift, parse_kallsyms, parse_line, read_kallsyms
from tracekit.symbols.resolve import load_table, parse_address
from tracekit.symbols.table import Symbol, SymbolTable
from tracekit.symbols.vmlinux import open_vmlinux

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "symbols"
KALLSYMS = FIXTURES / "kallsyms.cut"
TRACE = FIXTURES / "function-symaddr.txt"
REPRODUCER = Path(__file__).resolve().parent.parent / "reproducer"
CROSS = "aarch64-linux-gnu-"
NAME_ADDRESS = re.compile(r"([\w.]+) <([0-9a-f]{16})>")


def traced_pairs() -> list[tuple[str, int]]:
    """(kernel's name, address) pairs the function tracer printed with sym-addr."""
    return [(name, int(addr, 16)) for name, addr in NAME_ADDRESS.findall(TRACE.read_text())]


@pytest.fixture(scope="module")
def reproducer_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cross-build the reproducer (VMM and guests) into a temporary directory."""
    if shutil.which(CROSS + "gcc") is None:
        pytest.skip("aarch64-linux-gnu-gcc is missing (Debian package gcc-aarch64-linux-gnu)")
    out = tmp_path_factory.mktemp("reproducer")
    subprocess.run(
        ["make", "-C", str(REPRODUCER), f"CROSS_COMPILE={CROSS}", f"O={out}"],
        check=True,
        capture_output=True,
    )
    return out


def test_kallsyms_names_match_the_kernels_own_trace() -> None:
    """Every traced address resolves to the name the kernel printed for it."""
    table = read_kallsyms(KALLSYMS)
    pairs = traced_pairs()
    assert len(pairs) > 40
    for name, address in pairs:
        found = table.lookup(address)
        assert found is not None and found.symbol.name == name, (hex(address), name, found)


def test_alias_choice_follows_kallsyms_order() -> None:
    """At one address, strong beats weak and fewer leading underscores win."""
    table = SymbolTable(
        [
            Symbol(0x1000, "__irqentry_text_start"),
            Symbol(0x1000, "_stext"),
            Symbol(0x2000, "weak_one", weak=True),
            Symbol(0x2000, "__strong_one"),
        ]
    )
    assert str(table.lookup(0x1004)) == "_stext+0x4"
    assert str(table.lookup(0x2000)) == "__strong_one"
    assert table.lookup(0xFFF) is None
    assert table.address_of("__irqentry_text_start") == 0x1000


def test_kaslr_shift_moves_link_addresses_to_run_time() -> None:
    """A table at link addresses, shifted by the kallsyms displacement, names run-time PCs."""
    runtime = read_kallsyms(KALLSYMS)
    shift = 0xFFFFC116C2410000 - 0xFFFF800008010000
    every = [parse_line(line) for line in KALLSYMS.read_text().splitlines()]
    linked = SymbolTable(
        (Symbol(s.address - shift, s.name, s.weak, s.module) for s in every if s), ranked=False
    )
    assert kaslr_shift(runtime, linked) == shift
    moved = linked.shifted(shift)
    for name, address in traced_pairs():
        assert moved.lookup(address).symbol.name == name  # type: ignore[union-attr]


def test_kaslr_needs_a_shared_anchor() -> None:
    """Without _text/_stext/start_kernel in both, the shift is refused, not guessed."""
    with pytest.raises(TracekitError, match="share none of"):
        kaslr_shift(read_kallsyms(KALLSYMS), SymbolTable([Symbol(0x10, "other")]))


def test_zeroed_kallsyms_is_a_clear_error(tmp_path: Path) -> None:
    """A kallsyms copy read without privilege (all zeros) says how to take it."""
    copy = tmp_path / "kallsyms"
    copy.write_text("0000000000000000 T _stext\n0000000000000000 t foo\n")
    with pytest.raises(TracekitError, match="kptr_restrict"):
        read_kallsyms(copy)


def test_resolve_cli_on_kallsyms() -> None:
    """`tracekit symbols resolve KALLSYMS ADDR` prints name+offset per address."""
    name, address = traced_pairs()[0]
    out = CliRunner().invoke(
        main, ["symbols", "resolve", str(KALLSYMS), f"{address + 8:x}", "0x10"]
    )
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert re.fullmatch(rf"{address + 8:016x} {name}\+0x[0-9a-f]+", lines[0])
    assert lines[1] == f"{0x10:016x} ?"


def test_bad_address_is_one_line_error() -> None:
    """A non-hex address is a TracekitError naming it."""
    with pytest.raises(TracekitError, match="'zz'"):
        parse_address("zz")


def test_foreign_architecture_is_refused() -> None:
    """This machine's own Python binary (x86-64) is not taken for a vmlinux."""
    with pytest.raises(TracekitError, match="not AArch64"):
        open_vmlinux(sys.executable)


def test_not_an_elf_is_refused(tmp_path: Path) -> None:
    """A file that is neither ELF nor kallsyms gives one clear line."""
    junk = tmp_path / "vmlinux"
    junk.write_bytes(b"\x7fELF" + b"\0" * 8)
    with pytest.raises(TracekitError, match="not an ELF file"):
        open_vmlinux(junk)


def test_stripped_arm64_is_refused(reproducer_build: Path, tmp_path: Path) -> None:
    """An arm64 ELF without .symtab asks for the unstripped or -dbg vmlinux."""
    stripped = tmp_path / "vmm.stripped"
    subprocess.run(
        [CROSS + "strip", "-o", str(stripped), str(reproducer_build / "vmm")], check=True
    )
    with pytest.raises(TracekitError, match=r"stripped \(no \.symtab\)"):
        open_vmlinux(stripped)
    out = CliRunner().invoke(main, ["symbols", "resolve", str(stripped), "ffff800008000000"])
    assert out.exit_code == 2
    assert out.output.count("\n") == 1 and "tracekit: error:" in out.output


def test_vmlinux_without_dwarf_is_refused(reproducer_build: Path, tmp_path: Path) -> None:
    """offsetof on an ELF with symbols but no DWARF says to use the debug vmlinux."""
    no_debug = tmp_path / "vmm.nodebug"
    subprocess.run(
        [CROSS + "strip", "--strip-debug", "-o", str(no_debug), str(reproducer_build / "vmm")],
        check=True,
    )
    out = CliRunner().invoke(main, ["symbols", "offsetof", str(no_debug), "kvm_vmid.id"])
    assert out.exit_code == 2
    assert "no DWARF" in out.output


def test_guest_cli_reports_each_variant(reproducer_build: Path) -> None:
    """`tracekit symbols guest` prints the variant note of every reproducer guest."""
    guests = sorted((reproducer_build / "guests").glob("*.elf"))
    assert len(guests) >= 10
    for guest in guests:
        out = CliRunner().invoke(main, ["symbols", "guest", str(guest)])
        assert out.exit_code == 0, out.output
        assert f"variant: {guest.stem}\n" in out.output
        assert re.search(r"^entry: 0x4[0-9a-f]{7}$", out.output, re.M)
        assert re.search(r"^load: 0x4[0-9a-f]{7}-0x4[0-9a-f]{7} \(\d+ bytes\)$", out.output, re.M)


def test_bundled_hypcalls_and_ids() -> None:
    """The bundled 6.1 table names full SMCCC IDs and bare numbers alike."""
    table = hypcalls.bundled("6.1.0-50-arm64")
    assert table.name_of(0xC600000C) == "__kvm_vcpu_run"
    assert table.name_of(15) == "__kvm_tlb_flush_vmid"
    assert table.name_of(0xC6000063) is None
    with pytest.raises(TracekitError, match="no bundled hypercall table"):
        hypcalls.bundled("5.10.0-30-arm64")


def test_hypcalls_cli_bundled() -> None:
    """`hypcalls --release` prints the source, then ID, number and name per call."""
    out = CliRunner().invoke(main, ["symbols", "hypcalls", "--release", "6.1.0-50-arm64"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("# source: bundled table for Linux 6.1")
    assert "0xc600000f  15 __kvm_tlb_flush_vmid\n" in out.output


def test_probe_args_round_trip() -> None:
    """What render writes, parse reads back unchanged."""
    args = {"kvm_arm_vmid_update": ["vmid=+0(%x0):u64"], "f": ["a=+16(%x1):u32", "b=+8(%x1):u8"]}
    text = probeargs.render(args, "abc", ["gone"])
    assert "# skipped gone: not in this kernel\n" in text
    assert probeargs.parse(text) == args


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kvm_arm_vmid_update vmid=+0(%x0):u64\n", "first line"),
        (f"{probeargs.HEADER}\nkvm_arm_vmid_update vmid=+0($arg1):u64\n", ":2: expected"),
        (f"{probeargs.HEADER}\n# c\nkvm_arm_vmid_update\n", ":3: expected"),
        (f"{probeargs.HEADER}\nf vmid=+0(%x9):u64\n", ":2: expected"),
    ],
)
def test_probe_args_bad_lines(text: str, message: str) -> None:
    """Each malformed probe-args file is refused with its line number."""
    with pytest.raises(TracekitError, match=re.escape(message)):
        probeargs.parse(text, "file")


def test_load_table_missing_file(tmp_path: Path) -> None:
    """A missing symbol source is one clear error."""
    with pytest.raises(TracekitError, match="does not exist"):
        load_table(tmp_path / "nope")


def test_kallsyms_names_nothing_outside_what_it_covers() -> None:
    """Past the image or a module's last symbol, or below, an address has no name;
    mapping symbols ($x) are never names."""
    text = "\n".join(
        [
            "ffff800008010000 T _stext",
            "ffff800008010100 T schedule",
            "ffff800008020000 T _einittext",
            "ffff800000f00000 t $x\t[9p]",
            "ffff800000f00000 t v9fs_mount\t[9p]",
            "ffff800000f00800 d v9fs_fs_type\t[9p]",
        ]
    )
    table = parse_kallsyms(text, "test")
    assert str(table.lookup(0xFFFF800008010104)) == "schedule+0x4"
    assert table.lookup(0xFFFF800008020001) is None  # past the image: vmalloc, say
    assert table.lookup(0xFFFF000012345678) is None  # the linear map: heap objects
    assert str(table.lookup(0xFFFF800000F00010)) == "v9fs_mount+0x10 [9p]"
    assert table.lookup(0xFFFF800000F00900) is None  # past the module's last symbol
    assert table.shifted(0).lookup(0xFFFF800008020001) is None
