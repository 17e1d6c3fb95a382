"""Bundled hypercall tables against the kernel sources' enum, per kernel series.

The expected lists are tests/fixtures/symbols/kvm_asm/<release>.txt: the enum
__kvm_host_smccc_func of that release's arch/arm64/include/asm/kvm_asm.h, typed out by
hand from Debian's linux-headers-<release>-common package (each file says which, with its
SHA256). The DWARF side, for 6.1, is in tests/test_symbols_vmlinux.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.errors import TracekitError
from tracekit.symbols import hypcalls
from tracekit.symbols.hypcall_tables import BUNDLED

KVM_ASM = Path(__file__).resolve().parent / "fixtures" / "symbols" / "kvm_asm"
RELEASES = {"6.1": "6.1.176", "6.12": "6.12.117", "7.2": "7.2.13"}


def source_enum(release: str) -> list[str]:
    """The calls of one release's enum, in order from 0, as the fixture lists them."""
    lines = (KVM_ASM / f"{release}.txt").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.parametrize("series", sorted(BUNDLED))
def test_bundled_table_is_the_sources_enum(series: str) -> None:
    """Every bundled series has a sourced fixture and equals it, name for name."""
    assert series in RELEASES, f"bundled series {series} has no sourced fixture"
    expected = source_enum(RELEASES[series])
    table = hypcalls.bundled(RELEASES[series])
    assert [table.names[n] for n in range(len(expected))] == expected
    assert len(table.names) == len(expected)


def test_numbering_moves_between_series() -> None:
    """The same call has different numbers across series: why a table per series exists."""
    numbers = {s: hypcalls.bundled(r).names for s, r in RELEASES.items()}
    run = {s: next(n for n, name in names.items() if name == "__kvm_vcpu_run")
           for s, names in numbers.items()}  # fmt: skip
    assert run == {"6.1": 12, "6.12": 12, "7.2": 9}
    assert hypcalls.bundled("7.2.13+deb14-arm64").name_of(0xC6000000 | 9) == "__kvm_vcpu_run"


def test_markers_are_not_calls() -> None:
    """7.x's MARKER() enumerators share the next call's value and must not replace it.

    The values follow the MARKER macro of 7.2's kvm_asm.h (`m, __after_##m = m - 1`).
    """
    calls = source_enum("7.2.13")[1:]
    values: dict[str, int] = {}
    number = 1
    for call in calls:
        if call == "__pkvm_prot_finalize":
            values["__KVM_HOST_SMCCC_FUNC_MIN_PKVM"] = number
            values["__after___KVM_HOST_SMCCC_FUNC_MIN_PKVM"] = number - 1
        values[f"__KVM_HOST_SMCCC_FUNC_{call}"] = number
        number += 1
    values["__KVM_HOST_SMCCC_FUNC_MAX"] = number
    names = hypcalls.from_enumerators(values)
    assert [names[n] for n in sorted(names)] == source_enum("7.2.13")


def test_unknown_series_is_a_clear_error() -> None:
    """A series without a table names the known ones and the way out."""
    with pytest.raises(TracekitError, match=r"series 5\.10; known: 6\.1, 6\.12, 7\.2"):
        hypcalls.bundled("5.10.0-30-arm64")
