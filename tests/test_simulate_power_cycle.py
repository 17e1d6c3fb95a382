"""A CPU power cycle as the machine's own instruction: the kernel's CPU entry after
PSCI CPU_ON (secondary_entry, run with the MMU off, so at its physical address), found
by the plugin at the Image's load address plus the symbol's kallsyms offset. The model
choice `cpu-on`, its plugin form, the log, the /proc/iomem check, the Image's load
address, predictions that differ from brief-literal's, and the plugin run for real
under qemu-user (a function named secondary_entry stands in for the kernel's entry)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from test_simulate import GOOD, ON, PRELUDE, built, needs_qemu_user  # noqa: F401

from tracekit.analysis.conditions import Condition
from tracekit.errors import TracekitError
from tracekit.simulate.expected import paying_windows
from tracekit.simulate.model import CPU_ENTRY_SYMBOL, load_model, parse_model, plugin_form
from tracekit.simulate.predict import ABSENT, PRESENT, predict
from tracekit.simulate.simlog import SimEvent, cpu_entry_mistakes, parse_sim_log
from tracekit.vhost import groundtruth
from tracekit.vhost.qemu import VIRT_RAM_BASE, kernel_text_pa

POWER = GOOD.replace('["alle1-local"]', '["cpu-on"]')
SYMS = Path("/out/vhost-kallsyms.txt")


def _header(text_offset: int, image_size: int) -> bytes:
    """An arm64 Image's first 64 bytes (Documentation/arch/arm64/booting.rst)."""
    head = bytearray(64)
    head[8:16] = text_offset.to_bytes(8, "little")
    head[16:24] = image_size.to_bytes(8, "little")
    head[56:60] = b"ARM\x64"
    return bytes(head)


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
    form = plugin_form(model, "nvhe", SYMS, text_pa=0x40200000)
    assert f"clear cpu-on\ncpu-entry {SYMS} 0x40200000 {CPU_ENTRY_SYMBOL}\n" in form
    for kallsyms, text_pa in ((None, 0x40200000), (SYMS, None), (Path("/a b"), 0x40200000)):
        with pytest.raises(TracekitError, match="a power cycle clears it"):
            plugin_form(model, "nvhe", kallsyms, text_pa=text_pa)
    brief = plugin_form(load_model("brief-literal"), "nvhe", SYMS, [3], 0x40200000)
    assert f"cpu-entry {SYMS} 0x40200000 secondary_entry\n" in brief
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
# The s14-sim-1 boot's kallsyms (6.12.117, nvhe-a76-sim): _text and secondary_entry.
SYMBOLS_612 = {
    "_text": 0xFFFFCE36A5600000,
    "_stext": 0xFFFFCE36A5610000,
    "secondary_entry": 0xFFFFCE36A73244B0,
}


def test_the_log_says_which_vcpu_powered_on_and_whether_it_cleared() -> None:
    """Format 5: the cpu-on events, the entry's PA and load address, the entries key; a
    format 4 line set has no entries (0)."""
    log = parse_sim_log(LOG5)
    assert log.cpu_entry == ("secondary_entry", 0x41F244B0, 0x40200000)
    assert [(e.vcpu, e.value) for e in log.power_ons()] == [(1, 1), (2, 0)]
    assert log.power_ons(2) == [SimEvent("cpu-on", 300, 2, 0, 0x41F244B0)]
    assert log.vcpus[1]["entries"] == 1
    assert "2 power-ons seen at secondary_entry 0x41f244b0 (1 cleared)" in log.summary()
    unresolved = LOG5.replace("secondary_entry 0x41f244b0 0x4", "unresolved 0x0 0x4")
    assert "CPU entry NOT found (Image at 0x40200000)" in parse_sim_log(unresolved).summary()
    with pytest.raises(TracekitError, match="bad vcpu line"):
        parse_sim_log(LOG5.replace(" entries 1", ""))
    # Only a clearing power-on ends that vCPU's paying window.
    windows = paying_windows(log.events, 3, scope_every=False)
    assert windows[1] == [(100, 200)] and windows[2] == []


def test_the_entry_is_checked_against_proc_iomem() -> None:
    """6.12's Kernel code starts at _text's PA, 6.1's at _stext's: both agree with the
    log's load address; a load address 2 MiB off, an entry off by one instruction, or an
    iomem read without root (zeros) is named."""
    log = parse_sim_log(LOG5)
    iomem = "40000000-bfffffff : System RAM\n  40210000-4127ffff : Kernel code\n"
    assert cpu_entry_mistakes(log, iomem, SYMBOLS_612) == []
    iomem_612 = iomem.replace("40210000", "40200000")
    assert cpu_entry_mistakes(log, iomem_612, SYMBOLS_612) == []
    off = iomem.replace("40210000", "40410000")
    assert cpu_entry_mistakes(log, off, SYMBOLS_612)[0].startswith("Kernel code starts at 0x404")
    shifted = parse_sim_log(LOG5.replace("0x41f244b0 0x4", "0x41f244b4 0x4"))
    assert cpu_entry_mistakes(shifted, iomem, SYMBOLS_612) == [
        "secondary_entry at 0x41f244b4 is not _text's PA + (secondary_entry - _text)"
    ]
    zeros = "00000000-00000000 : System RAM\n  00000000-00000000 : Kernel code\n"
    assert "read it as root" in cpu_entry_mistakes(log, zeros, SYMBOLS_612)[0]


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


def _run_entry(built: Path, tmp: Path, model: str, skew: int) -> str:  # noqa: F811
    """Run ENTRY_PROGRAM under the plugin, its kallsyms placing secondary_entry as far
    above a made-up _text as the function is above the load address given (off by
    `skew` bytes); the simulation log's text."""
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
        f"{text_va:016x} T _text\n{text_va + func - text_pa:016x} T {CPU_ENTRY_SYMBOL}\n"
    )
    form = plugin_form(parse_model(model, "t.toml"), "nvhe", kallsyms, text_pa=text_pa + skew)
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
    entry = log.cpu_entry[1]
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
