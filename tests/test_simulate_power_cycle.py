"""A CPU power cycle as the machine's own instruction: the kernel's CPU entry after
PSCI CPU_ON (secondary_entry, run with the MMU off, so at its physical address), found
by the plugin at the Image's load address plus the symbol's kallsyms offset. The model
choice `cpu-on`, its plugin form, the log, the /proc/iomem check, the Image's load
address, predictions that differ from brief-literal's, and the plugin run for real
under qemu-user (a function named secondary_entry stands in for the kernel's entry)."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from bundlegen import Spec, generate
from test_simulate import GOOD, ON, PRELUDE, _simulated, built, needs_qemu_user  # noqa: F401

from tracekit.analysis.conditions import Condition
from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleSimulation, load_bundle
from tracekit.report.assemble import build_report
from tracekit.report.sections import decision, predictions, simulated
from tracekit.simulate.expected import paying_windows
from tracekit.simulate.model import CPU_ENTRY_SYMBOL, load_model, parse_model, plugin_form
from tracekit.simulate.predict import ABSENT, PRESENT, predict
from tracekit.simulate.simlog import (
    CpuEntry,
    SimEvent,
    cpu_entry_mistakes,
    cpu_entry_warnings,
    parse_sim_log,
    power_on_mistakes,
    power_on_warnings,
)
from tracekit.symbols.kallsyms import kallsyms_omission
from tracekit.vhost import groundtruth, runner
from tracekit.vhost.image import IMAGE_RECORD, VhostImage
from tracekit.vhost.kernels import parse_kernel_spec
from tracekit.vhost.qemu import VIRT_RAM_BASE, ImageLoad, image_load, kernel_text_pa
from tracekit.vhost.runner import IOMEM, KALLSYMS, SIM_FORM, SIM_LOG, VhostConfig

POWER = GOOD.replace('["alle1-local"]', '["cpu-on"]')
LOAD = ImageLoad(0x40200000, 0x40210000)  # where QEMU 7.2 loads both of Debian's Images
SYMS = Path("/out/vhost-kallsyms.txt")


def _header(text_offset: int, image_size: int) -> bytes:
    """An arm64 Image's first 64 bytes (Documentation/arch/arm64/booting.rst)."""
    head = bytearray(64)
    head[8:16] = text_offset.to_bytes(8, "little")
    head[16:24] = image_size.to_bytes(8, "little")
    head[56:60] = b"ARM\x64"
    return bytes(head)


def _pe_image(base_of_code: int, pe: int = 0x40) -> bytes:
    """An Image header whose PE32+ optional header gives BaseOfCode (efi-header.S's
    layout: `PE\\0\\0`, the 20-byte COFF header, then the optional header)."""
    head = bytearray(_header(0, 0x2500000) + bytes(4096 - 64))
    head[60:64] = pe.to_bytes(4, "little")
    head[pe : pe + 4] = b"PE\0\0"
    head[pe + 24 : pe + 26] = (0x20B).to_bytes(2, "little")
    head[pe + 44 : pe + 48] = base_of_code.to_bytes(4, "little")  # BaseOfCode
    head[pe + 56 : pe + 60] = (0x10000).to_bytes(4, "little")  # SectionAlignment
    head[pe + 84 : pe + 88] = base_of_code.to_bytes(4, "little")  # SizeOfHeaders
    return bytes(head)


def test_stext_is_the_pe_headers_base_of_code_above_text() -> None:
    """Both of Debian's Images (bookworm 6.1.176, trixie 6.12.117: BaseOfCode 0x10000, read
    from their vmlinuz) put _stext 64 KiB above _text; another BaseOfCode is followed; an
    Image without a PE header (no CONFIG_EFI) has a head of one SEGMENT_ALIGN; a PE header
    cut short is one line."""
    assert image_load(_pe_image(0x10000)) == ImageLoad(0x40200000, 0x40210000)
    assert image_load(_pe_image(0x20000)).stext_pa == 0x40220000
    assert image_load(_header(0, 0x2500000)) == ImageLoad(0x40200000, 0x40210000)
    for cut in (100, 66):
        with pytest.raises(TracekitError, match="not there or is cut short"):
            image_load(_pe_image(0x10000)[:cut])
    with pytest.raises(TracekitError, match="not there or is cut short"):
        image_load(_pe_image(0x10000).replace(b"PE\0\0", b"XX\0\0"))
    with pytest.raises(TracekitError, match="not there or is cut short"):
        image_load(_header(0, 0x2500000)[:60] + (0x2000).to_bytes(4, "little"))
    odd = bytearray(_pe_image(0x10000))
    odd[0x40 + 84 : 0x40 + 88] = (0x1000).to_bytes(4, "little")
    with pytest.raises(TracekitError, match="SizeOfHeaders 0x1000"):
        image_load(bytes(odd))


def test_the_image_loads_where_qemu_7_2_puts_it() -> None:
    """text_offset 0 (every kernel since 5.8) lands 2 MiB above RAM, a large offset at
    itself, an image_size of 0 at 0x80000; a file without the magic is one line."""
    assert kernel_text_pa(_header(0, 0x2500000)) == VIRT_RAM_BASE + 0x200000 == 0x40200000
    assert kernel_text_pa(_header(0x80000, 0x2500000)) == VIRT_RAM_BASE + 0x80000
    assert kernel_text_pa(_header(0x80000, 0)) == VIRT_RAM_BASE + 0x80000
    assert kernel_text_pa(_header(0, 1), ram_base=0x80000000) == 0x80200000
    with pytest.raises(TracekitError, match="not an arm64 Image"):
        kernel_text_pa(b"MZ" + bytes(62))


def test_cpu_on_is_a_clearing_choice_that_needs_the_boot() -> None:
    """`cpu-on` validates; its form clears by the entry at TEXT_PA + offset; without the
    kallsyms or the load address it is refused in one line; other models log power-ons
    whenever both are known."""
    model = parse_model(POWER, "m.toml")
    assert model.clears_by("cpu-on") and not model.clears_by("alle1-local")
    form = plugin_form(model, "nvhe", SYMS, load=LOAD)
    assert f"clear cpu-on\ncpu-entry {SYMS} 0x40200000 0x40210000 {CPU_ENTRY_SYMBOL}\n" in form
    for kallsyms, load in ((None, LOAD), (SYMS, None), (Path("/a b"), LOAD)):
        with pytest.raises(TracekitError, match="a power cycle clears it"):
            plugin_form(model, "nvhe", kallsyms, load=load)
    brief = plugin_form(load_model("brief-literal"), "nvhe", SYMS, [3], LOAD)
    assert f"cpu-entry {SYMS} 0x40200000 0x40210000 secondary_entry\n" in brief
    assert "clear cpu-on" not in brief
    assert "cpu-entry" not in plugin_form(load_model("holder-only"), "nvhe")
    with pytest.raises(TracekitError, match=r"\[clear\] by: 'cpu-off'; use any of: .*cpu-on"):
        parse_model(POWER.replace("cpu-on", "cpu-off"), "m.toml")
    shipped = load_model("power-cycle")
    assert shipped.clears == ("cpu-on",) and shipped.trigger == "sctlr-write"


LOG5 = """tksim-log 5
model power-cycle 0123456789abcdef
clock 1
cpu-entry-at secondary_entry 0x41f244b0 0x40200000
create 100 1 1 0x4000015c
cpu-on 200 1 1 0x41f244b0
cpu-on 300 2 0 0x41f244b0
vcpu 1 creates 1 clears 1 delayed 0 injected_ns 0 actual_ns 0 spans 0 span_ns 0 \
waited_spans 0 waited_ns 0 dose 0 bcasts 0 pays 0 owed 0 asked_ns 0 paid_ns 0 \
paid_actual_ns 0 wakes 0 spared 0 entries 1
complete 1
"""
LOG6 = LOG5.replace("tksim-log 5", "tksim-log 6").replace(
    "0x41f244b0 0x40200000\n", "0x41f244b0 0x40200000 0x40210000 _text\n"
)
# Session 16's bookworm boot (6.1.0-50-arm64, nVHE, 4 x A76, power-cycle; docs/simulate.md
# "Measured on 6.1"): no _text in kallsyms, the entry found from _stext 64 KiB above the
# load address, secondary_entry in .text, Kernel code [_stext, __init_begin).
LOG6_61 = LOG6.replace(
    "0x41f244b0 0x40200000 0x40210000 _text", "0x40ef02c8 0x40200000 0x40210000 _stext"
)
SYMBOLS_61 = {
    "_stext": 0xFFFFC8B56C010000,
    "secondary_entry": 0xFFFFC8B56CCF02C8,
    "__init_begin": 0xFFFFC8B56D660000,
}
IOMEM_61 = "40000000-bfffffff : System RAM\n  40210000-4185ffff : Kernel code\n"
# The s14-sim-1 boot's kallsyms (6.12.117, nvhe-a76-sim) and /proc/iomem: secondary_entry
# in .rodata.text, below __init_begin (its Kernel code end + 1).
SYMBOLS_612 = {
    "_text": 0xFFFFCE36A5600000,
    "_stext": 0xFFFFCE36A5610000,
    "secondary_entry": 0xFFFFCE36A73244B0,
    "__init_begin": 0xFFFFCE36A7330000,
}
IOMEM_612 = "40000000-bfffffff : System RAM\n  40200000-41f2ffff : Kernel code\n"


def test_the_log_says_which_vcpu_powered_on_and_whether_it_cleared() -> None:
    """Format 5: the cpu-on events, the entry's PA and load address, the entries key; a
    format 4 line set has no entries (0)."""
    log = parse_sim_log(LOG5)
    assert log.cpu_entry == CpuEntry("secondary_entry", 0x41F244B0, 0x40200000, 0, "_text")
    assert parse_sim_log(LOG6).cpu_entry == replace(log.cpu_entry, stext_pa=0x40210000)
    assert parse_sim_log(LOG6_61).cpu_entry.anchor_pa() == 0x40210000
    with pytest.raises(TracekitError, match="bad line 'cpu-entry-at"):
        parse_sim_log(LOG6.replace(" _text\n", " _etext\n"))
    with pytest.raises(TracekitError, match="bad line 'cpu-entry-at"):
        parse_sim_log(LOG6.replace("tksim-log 6", "tksim-log 5"))
    assert [(e.vcpu, e.value) for e in log.power_ons()] == [(1, 1), (2, 0)]
    assert log.power_ons(2) == [SimEvent("cpu-on", 300, 2, 0, 0x41F244B0)]
    assert log.vcpus[1]["entries"] == 1
    assert "2 power-ons seen at secondary_entry 0x41f244b0 (1 cleared; from _text at" in (
        log.summary()
    )
    unresolved = LOG5.replace("secondary_entry 0x41f244b0 0x4", "unresolved 0x0 0x4")
    assert "CPU entry NOT found (Image at 0x40200000)" in parse_sim_log(unresolved).summary()
    with pytest.raises(TracekitError, match="bad vcpu line"):
        parse_sim_log(LOG5.replace(" entries 1", ""))
    # Only a clearing power-on ends that vCPU's paying window.
    windows = paying_windows(log.events, 3, scope_every=False)
    assert windows[1] == [(100, 200)] and windows[2] == []


def test_the_entry_is_checked_against_proc_iomem() -> None:
    """6.12: the entry is right; a load address 2 MiB off, or 64 KiB low (where _stext's
    PA would be Kernel code's start, which the start alone cannot tell from _text's: the
    end, __init_begin's PA, can), an entry off by one instruction, and an iomem read
    without root (zeros) are named; a BaseOfCode that disagrees with kallsyms only warns
    (the plugin anchored on _text and never used it)."""
    log = parse_sim_log(LOG6)
    assert cpu_entry_mistakes(log, IOMEM_612, SYMBOLS_612) == []
    assert cpu_entry_warnings(log, SYMBOLS_612) == []
    off = IOMEM_612.replace("40200000-41f2ffff", "40400000-4212ffff")
    assert cpu_entry_mistakes(log, off, SYMBOLS_612)[0].startswith("Kernel code starts at 0x404")
    low = parse_sim_log(
        LOG6.replace("0x41f244b0 0x40200000 0x40210000", "0x41f144b0 0x401f0000 0x40200000")
    )
    assert cpu_entry_mistakes(low, IOMEM_612, SYMBOLS_612) == [
        "Kernel code ends at 0x41f2ffff, not below where _text at 0x401f0000 puts __init_begin"
    ]
    shifted = parse_sim_log(LOG6.replace("0x41f244b0 0x4", "0x41f244b4 0x4"))
    assert cpu_entry_mistakes(shifted, IOMEM_612, SYMBOLS_612) == [
        "secondary_entry at 0x41f244b4 is not _text's PA + (secondary_entry - _text)"
    ]
    zeros = "00000000-00000000 : System RAM\n  00000000-00000000 : Kernel code\n"
    assert "read it as root" in cpu_entry_mistakes(log, zeros, SYMBOLS_612)[0]
    wide = parse_sim_log(LOG6.replace("0x40210000 _text", "0x40220000 _text"))
    assert cpu_entry_mistakes(wide, IOMEM_612, SYMBOLS_612) == []
    assert "would be watched in the wrong place" in cpu_entry_warnings(wide, SYMBOLS_612)[0]
    # Format 5 (no STEXT_PA): the same checks from _text.
    assert cpu_entry_mistakes(parse_sim_log(LOG5), IOMEM_612, SYMBOLS_612) == []


def test_on_6_1_the_stext_anchor_is_checked_exactly_against_proc_iomem() -> None:
    """6.1 (no _text in kallsyms): the plugin's _stext PA must be Kernel code's start
    itself (setup.c:224 `__pa_symbol(_stext)`) and its end __init_begin's; an entry
    outside Kernel code, or from a misplaced anchor, is named; so is an unresolved entry,
    with the reason kallsyms gives."""
    log = parse_sim_log(LOG6_61)
    assert cpu_entry_mistakes(log, IOMEM_61, SYMBOLS_61) == []
    assert cpu_entry_mistakes(log, IOMEM_61.replace("40210000", "40200000"), SYMBOLS_61) == [
        "Kernel code starts at 0x40200000, not where _stext at 0x40210000 puts _stext"
    ]
    assert cpu_entry_mistakes(log, IOMEM_61, {}) == [
        "the boot's kallsyms has no _stext, the plugin's anchor"
    ]
    shifted = parse_sim_log(LOG6_61.replace("0x40ef02c8 0x4", "0x40ef02cc 0x4"))
    assert cpu_entry_mistakes(shifted, IOMEM_61, SYMBOLS_61) == [
        "secondary_entry at 0x40ef02cc is not _stext's PA + (secondary_entry - _stext)"
    ]
    short = IOMEM_61.replace("4185ffff", "40e0ffff")
    assert cpu_entry_mistakes(log, short, {"_stext": SYMBOLS_61["_stext"]}) == [
        "secondary_entry at 0x40ef02c8 is outside Kernel code"
    ]
    unresolved = parse_sim_log(LOG6_61.replace("secondary_entry 0x40ef02c8", "unresolved 0x0"))
    no_entry = {"_stext": SYMBOLS_61["_stext"], "__init_begin": SYMBOLS_61["__init_begin"]}
    assert (
        "kallsyms does not list secondary_entry" in cpu_entry_mistakes(unresolved, "", no_entry)[0]
    )
    assert "neither anchor" in cpu_entry_mistakes(unresolved, "", {"x": 1})[0]


def _condition(kernel: str, after: str) -> Condition:
    """The protocol's nVHE mmu-on condition on `kernel`, `after` its after-guest action."""
    return replace(ON, kernel=kernel, after_guest=after)


def test_power_cycle_and_brief_literal_differ_where_a_power_on_runs_no_alle1() -> None:
    """6.1 hotplug (no EL2 invalidation, a power cycle): power-cycle absent, brief-literal
    present; 6.12 hotplug (ALLE1 and a power cycle): both absent; 6.1 rollover (ALLE1IS,
    no power cycle): the reverse of 6.1's hotplug; another CPU's hotplug clears neither."""
    power, brief = load_model("power-cycle"), load_model("brief-literal")
    cases = {
        ("6.1.0-50-arm64", "hotplug"): (ABSENT, PRESENT),
        ("6.12.117+deb13-arm64", "hotplug"): (ABSENT, ABSENT),
        ("6.1.0-50-arm64", "rollover"): (PRESENT, ABSENT),
        ("6.1.0-50-arm64", "hotplug-other"): (PRESENT, PRESENT),
        ("6.12.117+deb13-arm64", "hotplug-other"): (PRESENT, PRESENT),
    }
    for (kernel, after), expected in cases.items():
        condition = _condition(kernel, after)
        got = (predict(power, condition).verdict, predict(brief, condition).verdict)
        assert got == expected, (kernel, after)
    assert "power cycle" in predict(power, _condition("6.1.0-50-arm64", "hotplug")).why


# The kernel's CPU entry under qemu-user: after the clock marker (the plugin reads the
# kallsyms file and retranslates), `secondary_entry` runs once holding nothing, then
# the marker creates the state, 5 broadcast completions pay, secondary_entry runs again
# (the power-on), and 5 more completions follow.
ENTRY_PROGRAM = (
    PRELUDE
    + r"""
#include <unistd.h>
__attribute__((noinline)) void secondary_entry(void) { __asm__ volatile("nop"); }
static void batch(int n) {
	for (int i = 0; i < n; i++) __asm__ volatile("tlbi vmalle1is\n dsb ish" ::: "memory");
}
int main(void) {
	struct sigaction sa = { .sa_sigaction = skip, .sa_flags = SA_SIGINFO };
	sigaction(SIGILL, &sa, NULL);
	__asm__ volatile("hint #0x77");
	usleep(100000);
	secondary_entry();
	__asm__ volatile("hint #0x76");
	batch(5);
	secondary_entry();
	batch(5);
	return 0;
}
"""
)


def _run_entry(built: Path, tmp: Path, model: str, skew: int, anchor: str = "_text") -> str:  # noqa: F811
    """Run ENTRY_PROGRAM under the plugin, its kallsyms placing secondary_entry as far
    above a made-up `anchor` (_text, or _stext as 6.1's kallsyms) as the function is above
    that anchor's load address given (off by `skew` bytes); the simulation log's text."""
    source, binary = tmp / "e.c", tmp / "e"
    source.write_text(ENTRY_PROGRAM)
    gcc = ["aarch64-linux-gnu-gcc", "-O2", "-static", "-o", str(binary), str(source)]
    subprocess.run(gcc, check=True)
    nm = subprocess.run(["aarch64-linux-gnu-nm", str(binary)], capture_output=True, text=True)
    func = next(int(w[0], 16) for w in map(str.split, nm.stdout.splitlines())
                if w[-1] == CPU_ENTRY_SYMBOL)  # fmt: skip
    text_va, text_pa = 0xFFFF800008000000, func - 0x1230
    kallsyms = tmp / "kallsyms.txt"
    kallsyms.write_text(
        f"{text_va:016x} T {anchor}\n{text_va + func - text_pa:016x} T {CPU_ENTRY_SYMBOL}\n"
    )
    # The other anchor's PA is 64 KiB away, wrong by construction: never the one used.
    load = ImageLoad(text_pa + skew, text_pa + 0x10000 + skew)
    if anchor == "_stext":
        load = ImageLoad(text_pa - 0x10000 + skew, text_pa + skew)
    form = plugin_form(parse_model(model, "t.toml"), "nvhe", kallsyms, load=load)
    (tmp / "model.txt").write_text(form)
    args = f"out={tmp / 'gt.tkgt'},limit=65536,sim={tmp / 'model.txt'},simlog={tmp / 'sim.txt'}"
    done = subprocess.run(
        ["qemu-aarch64", "-plugin", f"{built / groundtruth.PLUGIN},{args}", str(binary)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return (tmp / "sim.txt").read_text()


@needs_qemu_user
def test_the_plugin_clears_at_the_kernels_cpu_entry(built: Path, tmp_path: Path) -> None:  # noqa: F811
    """cpu-on: both entries logged on vCPU 0 at the function's address, the second one
    clearing, so 5 completions pay, not 10; an issuer-only model cleared by ALLE1 watches no
    entry and clears nothing (10 pay); a load address 2 MiB off finds no entry at all."""
    log = parse_sim_log(_run_entry(built, tmp_path, POWER, 0))
    assert log.complete and log.cpu_entry is not None
    entry = log.cpu_entry.pa
    assert log.cpu_entry.anchor == "_text"
    assert [(e.kind, e.vcpu, e.value) for e in log.events] == [
        ("cpu-on", 0, 0),
        ("create", 0, 1),
        ("cpu-on", 0, 1),
    ]
    assert {e.vaddr for e in log.power_ons()} == {entry}
    cpu = log.vcpus[0]
    assert (cpu["entries"], cpu["clears"], cpu["delayed"]) == (2, 1, 5)
    # An issuer-only model cleared by ALLE1 gets no cpu-entry line (its boot's clock
    # markers stay free of kallsyms reads): no entry watched, nothing cleared, 10 pay.
    log = parse_sim_log(_run_entry(built, tmp_path, GOOD, 0))
    assert log.cpu_entry is None and log.power_ons() == [] and log.vcpus[0]["delayed"] == 10
    log = parse_sim_log(_run_entry(built, tmp_path, POWER, 0x200000))
    assert log.power_ons() == [] and log.vcpus[0]["delayed"] == 10


@needs_qemu_user
def test_without_text_the_plugin_anchors_on_stext(built: Path, tmp_path: Path) -> None:  # noqa: F811
    """Debian 6.1's kallsyms (no _text): the entry is found from _stext at STEXT_PA, the
    second entry clears (5 pay, not 10); an STEXT_PA 64 KiB off finds no entry."""
    log = parse_sim_log(_run_entry(built, tmp_path, POWER, 0, anchor="_stext"))
    assert log.cpu_entry is not None and log.cpu_entry.anchor == "_stext"
    assert {e.vaddr for e in log.power_ons()} == {log.cpu_entry.pa}
    assert (log.vcpus[0]["entries"], log.vcpus[0]["delayed"]) == (2, 5)
    log = parse_sim_log(_run_entry(built, tmp_path, POWER, 0x10000, anchor="_stext"))
    assert log.power_ons() == [] and log.vcpus[0]["delayed"] == 10


# The kernel log before the command (the boot's three secondaries) and after it, where
# CPU1 and CPU2 were each hotplugged once (the power-ons of LOG6_61's cpu-on events).
BOOTED = "CPU{0}: Booted secondary processor 0x000000000{0} [0x414fd0b1]\n"
BOOT_DMESG_61 = (
    "[    0.000000] Booting Linux on physical CPU 0x0000000000 [0x414fd0b1]\n"
    + "".join(f"[    0.14{n}] " + BOOTED.format(n) for n in (1, 2, 3))
)
DMESG_61 = BOOT_DMESG_61 + "".join(
    f"[    6.4{n}] psci: CPU{n} killed (polled 0 ms)\n[    7.6{n}] " + BOOTED.format(n)
    for n in (1, 2)
)


def _boot_out(
    tmp_path: Path, model: str, log: str | None, iomem: str, dmesg: str | None = DMESG_61
) -> Path:
    """A boot's --out as `vhost run` leaves it (and a bundle's groundtruth/ holds it): the
    plugin's form of `model`, its log, /proc/iomem, kallsyms and the kernel log before
    and after the command (`dmesg`: after; None: neither file)."""
    for name, text in ((runner.BOOT_DMESG, BOOT_DMESG_61), (runner.DMESG, dmesg)):
        (tmp_path / name).unlink(missing_ok=True)
        if dmesg is not None:
            (tmp_path / name).write_text(text)
    form = plugin_form(load_model(model), "nvhe", tmp_path / KALLSYMS, [3], LOAD)
    (tmp_path / SIM_FORM).write_text(form)
    (tmp_path / SIM_LOG).unlink(missing_ok=True)
    if log is not None:
        (tmp_path / SIM_LOG).write_text(log)
    (tmp_path / IOMEM).write_text(iomem)
    # As 6.1's: the first IRQ handler shares _stext's address and is listed first (a
    # SymbolTable keeps one name per address: the check must read every line).
    aliased = f"{SYMBOLS_61['_stext']:016x} t bcm2835_handle_irq\n"
    (tmp_path / KALLSYMS).write_text(
        aliased
        + "".join(f"{a:016x} T {n}\n" for n, a in SYMBOLS_61.items())
        + "ffff80000a000000 t x\n"
    )
    return tmp_path


@pytest.mark.parametrize("model", ["power-cycle", "brief-literal"])
def test_vhost_run_checks_the_cpu_entry_against_the_boot(tmp_path: Path, model: str) -> None:
    """`vhost run` itself checks the entry against the boot: a note when it agrees; when it
    does not, or the plugin left no log, a note naming why and, for a model cleared by
    cpu-on (its clearing did not happen as it says), status 3, not the command's; the
    command's own status kept for the others."""
    result = replace(_RESULT, out_dir=tmp_path, notes=[])
    out = _boot_out(tmp_path, model, LOG6_61, IOMEM_61)
    check = runner.cpu_entry_check(out)
    assert check is not None and check.mistakes == [] and check.cpu_on == (model == "power-cycle")
    assert check.power_ons == 2  # CPU1's and CPU2's re-plugs, each seen
    assert runner._checked_cpu_entry(out, result) == 0
    assert "is where this boot's /proc/iomem and kallsyms put" in result.notes[-1]
    assert "; the plugin saw there each of the 2 power-on(s) the kernel logged" in result.notes[-1]
    uncounted = runner.cpu_entry_check(_boot_out(tmp_path, model, LOG6_61, IOMEM_61, None))
    assert uncounted is not None and uncounted.mistakes == [] and uncounted.power_ons is None
    assert "power-ons not counted" in uncounted.lines()[-1]
    cpu_on = model == "power-cycle"
    # Watched in the right place, but a power-on the kernel logged was not seen there, or
    # one was seen that the kernel did not log.
    unseen = DMESG_61 + "[    9.3] psci: CPU3 killed (polled 0 ms)\n[    9.9] " + BOOTED.format(3)
    unlogged = DMESG_61.rpartition("[    6.42]")[0]
    for log, iomem, dmesg, why in (
        (LOG6_61, IOMEM_61.replace("40210000", "40200000"), DMESG_61,
         "Kernel code starts at 0x40200000"),
        (None, IOMEM_61, DMESG_61, "the plugin's log is unreadable"),
        (re.sub("cpu-entry-at .*\n", "", LOG6_61), IOMEM_61, DMESG_61, "no cpu-entry-at line"),
        (LOG6_61, IOMEM_61, unseen, "the kernel brought vCPU 3 (MPIDR 0x3) up 1 time(s) "
         "during the command (its 'Booted secondary processor' lines), the plugin saw 0 "
         "entries at secondary_entry"),
        (LOG6_61, IOMEM_61, unlogged, "brought vCPU 2 (MPIDR 0x2) up 0 time(s)"),
        (LOG6_61, IOMEM_61, unlogged + "[ 6.5] CPU2: failed to come online\n",
         "the plugin saw 1 entries at secondary_entry; dmesg has 1 'failed to come online'"),
    ):  # fmt: skip
        result = replace(_RESULT, out_dir=tmp_path, notes=[])
        out = _boot_out(tmp_path, model, log, iomem, dmesg)
        status = runner._checked_cpu_entry(out, result)
        assert why in result.notes[0], result.notes
        assert result.notes[0].startswith(
            "simulation: NOT AS MODELLED" if cpu_on else "simulation: power-ons were not watched"
        )
        assert status == (runner.SIMULATION_NOT_APPLIED if cpu_on else 0)
    out = _boot_out(tmp_path, model, LOG6_61, IOMEM_61)
    failed = replace(_RESULT, exit_status=1, out_dir=tmp_path, notes=[])
    assert runner._checked_cpu_entry(out, failed) == 1
    assert runner.cpu_entry_check(_boot_out(tmp_path, "holder-only", LOG6_61, IOMEM_61)) is None


def test_a_bundle_simulated_not_as_modelled_tests_no_model(tmp_path: Path) -> None:
    """The bundle's groundtruth/ copy of a failed cpu-on check: its simulation says NOT AS
    MODELLED, so the report leaves it out of the model predictions."""
    gt = tmp_path / runner.GT_BUNDLE_DIR
    gt.mkdir()
    _boot_out(gt, "power-cycle", LOG6_61, IOMEM_61.replace("40210000", "40200000"))
    check = runner.cpu_entry_check(gt)
    assert check is not None and check.cpu_on and check.mistakes
    simulation = BundleSimulation("", parse_sim_log(LOG6_61), None, check)
    assert simulation.not_as_modelled()
    assert not replace(
        simulation, entry=runner.cpu_entry_check(_boot_out(gt, "power-cycle", LOG6_61, IOMEM_61))
    ).not_as_modelled()


_RESULT = runner.VhostResult(
    exit_status=0,
    kvm_mode="nvhe",
    kvm_mode_requested="nvhe",
    kernel="bookworm",
    kernel_release="6.1.0-50-arm64",
    dev_kvm=True,
    out_dir=Path("."),
    console_log=Path("c"),
    boot_dmesg=Path("d"),
)


def test_reports_of_a_bundle_not_as_modelled_say_so_and_test_no_model(tmp_path: Path) -> None:
    """Two generated emulated bundles of one condition under power-cycle, each with its
    boot's files in groundtruth/: both watched right, they pool (one decision-table row
    of 2+2 boots) and the model predictions take them; one watched wrong, the report's
    first line says NOT AS MODELLED with the model and how many bundles, its
    simulated-effect section says why, it pools with nothing (a decision-table row of
    its own, marked) and the model predictions leave it out."""
    label = "power-cycle@0123456789abcdef"
    bundles = [generate(tmp_path / name, Spec(runs=4, seed=i)) for i, name in enumerate("ab")]
    for bundle in bundles:
        _simulated(bundle, label)
        (bundle / runner.GT_BUNDLE_DIR).mkdir()
        _boot_out(bundle / runner.GT_BUNDLE_DIR, "power-cycle", LOG6_61, IOMEM_61)
    applied = [load_bundle(b) for b in bundles]
    table = decision.section(applied)
    assert table is not None
    assert [n for _, n in table.tables[0].frame.select("condition", "n").rows()] == ["2+2 boots"]
    assert predictions.section(applied) is not None
    assert not any("NOT AS MODELLED" in line for line in build_report(applied).warnings)
    wrong = IOMEM_61.replace("40210000", "40200000")
    _boot_out(bundles[1] / runner.GT_BUNDLE_DIR, "power-cycle", LOG6_61, wrong)
    data = [load_bundle(b) for b in bundles]
    section = simulated.section(data)
    assert section is not None
    assert any(line.startswith("b: NOT AS MODELLED") for line in section.findings), section
    first = build_report(data).warnings[1]
    assert first.startswith(f"SIMULATED EFFECT ({label})")
    assert f"NOT AS MODELLED: {label} in 1 bundle(s)" in first, first
    table = decision.section(data)
    assert table is not None
    rows = dict(table.tables[0].frame.select("condition", "n").rows())
    assert rows == {label: "4+4 runs", f"{label} (NOT AS MODELLED)": "4+4 runs"}, rows
    tested = predictions.section(data)
    assert tested is not None
    assert any(u.startswith("b: left out of the model predictions") for u in tested.unknowns)
    assert not any(u.startswith("a: left out") for u in tested.unknowns)


def test_an_end_check_that_could_not_run_is_said() -> None:
    """Without __init_begin in kallsyms only the start is checked, which on 6.12 leaves a
    64 KiB blind spot: a warning says so (not a mistake: the entry may be right)."""
    no_end = {k: v for k, v in SYMBOLS_612.items() if k != "__init_begin"}
    log = parse_sim_log(LOG6)
    assert cpu_entry_mistakes(log, IOMEM_612, no_end) == []
    assert cpu_entry_warnings(log, no_end) == [
        "kallsyms has no __init_begin: Kernel code's end was not checked, only its start"
    ]
    assert cpu_entry_warnings(log, SYMBOLS_612) == []


def test_power_ons_the_kernel_log_cannot_count_are_said() -> None:
    """No kernel log (a bundle from before it was kept) or one that wrapped (its first
    line is not the boot CPU's): the power-ons are not counted, a warning says why, no
    mistake; an entry never found is not counted either (its own mistake says why)."""
    log = parse_sim_log(LOG6_61)
    assert power_on_mistakes(log, BOOT_DMESG_61, DMESG_61) == []
    assert power_on_warnings(log, BOOT_DMESG_61, DMESG_61) == []
    wrapped = DMESG_61.partition("\n")[2]
    for before, after, why in ((None, DMESG_61, "it has none from before the command"),
                               (BOOT_DMESG_61, None, "it has none from after the command"),
                               (BOOT_DMESG_61, wrapped, "the buffer wrapped")):  # fmt: skip
        assert power_on_mistakes(log, before, after) == []
        assert why in power_on_warnings(log, before, after)[0]
    unresolved = parse_sim_log(LOG6_61.replace("secondary_entry 0x40ef02c8", "unresolved 0x0"))
    assert power_on_mistakes(unresolved, BOOT_DMESG_61, "") == []
    assert power_on_warnings(unresolved, None, None) == []


# Offsets from the System.map of tracekit's CI builds (docs/simulate.md): 6.12 puts
# secondary_entry in .rodata.text, between _etext and _sinittext; 6.1 in .text.
MAP_612 = {
    "_text": 0xFFFF800080000000,
    "_stext": 0xFFFF800080010000,
    "_etext": 0xFFFF800080630000,
    "secondary_entry": 0xFFFF8000807B9478,
    "_sinittext": 0xFFFF8000807C0000,
    "_einittext": 0xFFFF800080803608,
}
MAP_61 = {
    "_text": 0xFFFF800008000000,
    "_stext": 0xFFFF800008010000,
    "secondary_entry": 0xFFFF80000859A290,
    "_etext": 0xFFFF8000085A0000,
    "_sinittext": 0xFFFF800008710000,
    "_einittext": 0xFFFF800008741718,
}


def _built_image(tmp_path: Path, system_map: dict[str, int], config: str) -> VhostImage:
    """An image record naming a kernel build whose System.map and .config are these."""
    here = tmp_path / str(len(list(tmp_path.iterdir())))  # one of its own per call
    build, image = here / "build", here / "image"
    for directory in (build, image):
        directory.mkdir(parents=True)
    (build / "System.map").write_text("".join(f"{a:016x} T {n}\n" for n, a in system_map.items()))
    (build / ".config").write_text(config)
    (image / IMAGE_RECORD).write_text(json.dumps({"build_dir": str(build)}))
    return VhostImage(image, parse_kernel_spec("trixie:tk-ci"), "6.12.117-tk", [])


def test_a_cpu_on_model_is_refused_before_the_boot_where_kallsyms_drops_the_entry(
    tmp_path: Path,
) -> None:
    """trixie:tk-ci (6.12, no CONFIG_KALLSYMS_ALL): its kallsyms will not list
    secondary_entry, so a cpu-on model is refused in one line naming why and what to
    boot instead; with KALLSYMS_ALL, on 6.1's layout, for a model that does not clear by
    cpu-on, or on a Debian kernel (no build of tracekit's: checked after the run) it
    boots."""
    config = "CONFIG_KALLSYMS=y\n# CONFIG_KALLSYMS_SELFTEST is not set\n"
    power = VhostConfig(kernel="trixie:tk-ci", simulate="power-cycle")
    with pytest.raises(TracekitError) as refused:
        runner._refuse_unwatchable_entry(power, _built_image(tmp_path, MAP_612, config))
    said = str(refused.value)
    assert "\n" not in said and "trixie:tk-ci's kallsyms will not list secondary_entry" in said
    assert "without CONFIG_KALLSYMS_ALL" in said and "(0xffff8000807b9478) lies in neither" in said
    assert "use --kernel bookworm, trixie or bookworm:tk-ci" in said
    for image, model in (
        (_built_image(tmp_path, MAP_612, config + "CONFIG_KALLSYMS_ALL=y\n"), "power-cycle"),
        (_built_image(tmp_path, MAP_61, config), "power-cycle"),
        (_built_image(tmp_path, MAP_612, config), "brief-literal"),
        (VhostImage(tmp_path / "debian", parse_kernel_spec("trixie"), "6.12", []), "power-cycle"),
    ):
        runner._refuse_unwatchable_entry(replace(power, simulate=model), image)
    no_entry = {n: a for n, a in MAP_61.items() if n != CPU_ENTRY_SYMBOL}
    text = "".join(f"{a:016x} T {n}\n" for n, a in no_entry.items())
    assert (
        kallsyms_omission(text, CPU_ENTRY_SYMBOL, True) == "its System.map has no secondary_entry"
    )


def test_an_entry_unwatched_for_want_of_the_irq_entries_says_so() -> None:
    """The plugin watches nothing until every IRQ entry resolves: a log whose IRQ entries
    were not all found, or where no clock marker ran, has its CPU entry unresolved for
    that reason, named so, not as a kallsyms without the entry."""
    unresolved = LOG6_61.replace("secondary_entry 0x40ef02c8", "unresolved 0x0")
    irq = "pay-at el1h_64_irq_handler 0xffffc8b56cccc934\npay-at el0t_64_irq_handler 0x0\n"
    failed = parse_sim_log(unresolved.replace("clock 1\n", "clock 1\n" + irq))
    why = cpu_entry_mistakes(failed, IOMEM_61, SYMBOLS_61)
    assert why == [
        "the plugin never found the IRQ entries el0t_64_irq_handler in kallsyms, so it "
        "watched nothing, no CPU entry either (Image at 0x40200000)"
    ]
    early = parse_sim_log(unresolved.replace("clock 1\n", "clock 1\npay-at unresolved 0x0\n"))
    assert cpu_entry_mistakes(early, IOMEM_61, SYMBOLS_61)[0].startswith("no clock marker ran")
    assert (
        "never found the CPU entry"
        in cpu_entry_mistakes(parse_sim_log(unresolved), IOMEM_61, SYMBOLS_61)[0]
    )


def test_a_bundle_gets_both_kernel_logs_and_counts_the_power_ons_again(tmp_path: Path) -> None:
    """`vhost run` copies the boot's files into a bundle it left, the kernel log after the
    command with them: the bundle's own check counts the same 2 power-ons the run did."""
    out = _boot_out(tmp_path, "power-cycle", LOG6_61, IOMEM_61)
    bundle = generate(out / "cell", Spec(runs=2))
    _simulated(bundle, "power-cycle@0123456789abcdef")
    assert runner.add_to_bundles(out) == [bundle]
    assert (bundle / runner.GT_BUNDLE_DIR / runner.DMESG).is_file()
    simulation = load_bundle(bundle).simulation()
    assert simulation is not None and simulation.entry is not None
    assert simulation.entry.mistakes == [] and simulation.entry.power_ons == 2
