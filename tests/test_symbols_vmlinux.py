"""Symbols from Debian's real debug vmlinux: hypercalls, offsets, KASLR-shifted names.

The vmlinux is streamed out of linux-image-<release>-dbg (~800 MB download, once) into
the cache by tracekit.symbols.fetch; <release> is the kernel the fixtures were taken
from (tests/fixtures/symbols/uname), the one `tracekit vhost` boots.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.symbols import cache, hypcalls, probeargs
from tracekit.symbols.fetch import dbg_package, fetch_debug_vmlinux
from tracekit.symbols.kallsyms import read_kallsyms
from tracekit.symbols.offsets import offsetof
from tracekit.symbols.resolve import load_table
from tracekit.symbols.vmlinux import NVHE_PREFIX, open_vmlinux

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "symbols"
KALLSYMS = FIXTURES / "kallsyms.cut"
NAME_ADDRESS = re.compile(r"([\w.]+) <([0-9a-f]{16})>")

# The kernel source's enum for the fixtures' release, typed from its headers package.
KVM_ASM_H = FIXTURES / "kvm_asm" / "6.1.176.txt"


def source_enum() -> list[str]:
    """Calls of enum __kvm_host_smccc_func in Linux 6.1.176, from 0, as the fixture says."""
    lines = KVM_ASM_H.read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def vmlinux() -> Path:
    """The debug vmlinux of the fixtures' kernel, fetched into the cache when missing.

    Debian keeps only the current ABI's -dbg package: once bookworm moves past the
    fixtures' kernel, these tests say so and wait for fixtures of the new one (README).
    """
    release = (FIXTURES / "uname").read_text().strip()
    try:
        return fetch_debug_vmlinux("bookworm", release, print)
    except TracekitError as err:
        if "has no arm64 package" not in str(err):
            raise
        pytest.skip(
            f"{dbg_package(release)} has left Debian's mirror: regenerate "
            "tests/fixtures/symbols from the current bookworm kernel (its README says how)"
        )


def test_hypcalls_match_kernel_source(vmlinux: Path) -> None:
    """The DWARF enum gives exactly the 6.1.176 kvm_asm.h list, numbered from 0."""
    assert (FIXTURES / "uname").read_text().strip() == "6.1.0-50-arm64"  # = 6.1.176
    expected = source_enum()
    with open_vmlinux(vmlinux) as opened:
        table = hypcalls.from_vmlinux(opened)
    assert [table.names[n] for n in sorted(table.names)] == expected
    assert sorted(table.names) == list(range(len(expected)))
    assert hypcalls.bundled("6.1.0-50-arm64").names == table.names
    assert cache.load(opened.build_id, "hypcalls") is not None


def test_vmid_offsets(vmlinux: Path) -> None:
    """The VMID is the first member of kvm_s2_mmu and kvm_vmid.id a 64-bit atomic."""
    with open_vmlinux(vmlinux) as opened:
        mmu_vmid = offsetof(opened, "kvm_s2_mmu.vmid")
        vmid_id = offsetof(opened, "kvm_vmid.id")
        nested = offsetof(opened, "kvm_s2_mmu.vmid.id")
        in_kvm = offsetof(opened, "kvm.arch.mmu.vmid.id")
        arch = offsetof(opened, "kvm.arch")
        mmu = offsetof(opened, "kvm_arch.mmu")
    assert (mmu_vmid.offset, vmid_id.offset, vmid_id.size) == (0, 0, 8)
    assert nested.offset == mmu_vmid.offset + vmid_id.offset
    assert in_kvm.offset == arch.offset + mmu.offset + nested.offset > 0


def test_unknown_field_is_clear(vmlinux: Path) -> None:
    """A misspelt field names the struct and the field."""
    out = CliRunner().invoke(main, ["symbols", "offsetof", str(vmlinux), "kvm_vmid.idd"])
    assert out.exit_code == 2
    assert "struct kvm_vmid has no field 'idd'" in out.output


def test_traced_addresses_resolve_like_kallsyms(vmlinux: Path) -> None:
    """Under the KASLR shift, vmlinux names the traced PCs as the kernel's trace did.

    PCs in modules (9p's, here) lie past the image: vmlinux must not name them, and the
    kallsyms copy does, with the module.
    """
    table = load_table(vmlinux, kallsyms=KALLSYMS)
    copy = read_kallsyms(KALLSYMS)
    assert table.shift != 0  # the emulated host boots with KASLR
    pairs = NAME_ADDRESS.findall((FIXTURES / "function-symaddr.txt").read_text())
    assert len(pairs) > 40
    in_modules = 0
    for name, text in pairs:
        address = int(text, 16)
        found, from_copy = table.lookup(address), copy.lookup(address)
        assert from_copy is not None and from_copy.symbol.name == name
        if from_copy.symbol.module:
            in_modules += 1
            assert found is None, (name, str(found))
        else:
            assert found is not None and found.symbol.name == name


def test_every_kallsyms_symbol_resolves_to_itself(vmlinux: Path) -> None:
    """Each address of the kallsyms copy, nVHE ones included, gets kallsyms' own name."""
    table = load_table(vmlinux, kallsyms=KALLSYMS)
    runtime = read_kallsyms(KALLSYMS)
    assert any(s.name.startswith(NVHE_PREFIX) for s in runtime.symbols)
    for symbol in runtime.symbols:
        if symbol.module:
            continue
        found = table.lookup(symbol.address)
        assert found is not None and (found.symbol.name, found.offset) == (symbol.name, 0)


def test_probe_args_cli(vmlinux: Path, tmp_path: Path) -> None:
    """probe-args writes a file collect can read, with the VMID read through x0."""
    output = tmp_path / "probe-args"
    out = CliRunner().invoke(main, ["symbols", "probe-args", str(vmlinux), "-o", str(output)])
    assert out.exit_code == 0, out.output
    args = probeargs.read_probe_args(output)
    assert args["kvm_arm_vmid_update"] == ["vmid=+0(%x0):u64"]
    assert args["kvm_free_stage2_pgd"] == ["vmid=+0(%x0):u64"]
    with open_vmlinux(vmlinux) as opened:
        assert f"# build-id {opened.build_id}\n" in output.read_text()
