"""Simulated mechanisms: model validation, the plugin form, and the plugin's simulation
run for real under QEMU 7.2's user-mode emulator (same TCG and plugin API as
qemu-system, so no boot): a program creates the state with the guest's MMU-on marker
or an SCTLR_EL1 write, clears it with TLBI ALLE1, and times broadcast TLBI+DSB loops.
TLBIs and MSR SCTLR_EL1 UNDEF at EL0; the exec callback runs as the instruction starts,
so the plugin sees them, and the program's SIGILL handler steps over them."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import VHOST_CONFIGS
from report_bundles import edit_manifest, make_bundle

from tracekit.analysis.compare import PRESENT
from tracekit.analysis.conditions import Condition, bundle_condition
from tracekit.analysis.decision import condition_effects
from tracekit.analysis.runs import metric_values, run_metrics
from tracekit.campaign.cells import expand_cells
from tracekit.campaign.command import check_board_plan, vhost_settings
from tracekit.campaign.plan import parse_plan
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.host.facts import simulated_model
from tracekit.ingest.bundle import BundleData, load_bundle
from tracekit.report.assemble import build_report
from tracekit.report.render import render
from tracekit.report.sections import predictions, simulated
from tracekit.simulate.expected import (
    OPEN,
    broadcast_completions,
    charged_completions,
    completion_spans,
    expected_increase_ns,
    paying_windows,
    per_call,
    probe_account,
)
from tracekit.simulate.model import (
    GUEST_WINDOW,
    IRQ_ENTRY_SYMBOLS,
    load_model,
    model_source,
    parse_model,
    plugin_form,
    shipped_models,
)
from tracekit.simulate.predict import (
    OBSERVABLES,
    PROBE,
    PROBE_GUEST,
    RT_WAKEUPS,
    VERDICT_METRIC,
    check_model,
    predict,
    predict_plan,
)
from tracekit.simulate.simlog import (
    RESPONDER_KEYS,
    VCPU_KEYS,
    WAKE_KEYS,
    SimEvent,
    parse_sim_log,
    read_sim_log,
)
from tracekit.vhost import groundtruth
from tracekit.vhost.qemu import ImageLoad
from tracekit.vhost.runner import (
    GT_BUNDLE_DIR,
    KALLSYMS,
    SIM_FORM,
    SIM_LOG,
    SIM_SOURCE,
    VhostConfig,
    prepare_simulation,
)
from tracekit.vhost.runner import run as run_vhost

GOOD = """
format = 1
name = "m"
summary = "s"
[create]
trigger = "mmu-on-marker"
[clear]
by = ["alle1-local"]
[cost]
where = "holder"
fixed_ns = 100000
"""


def test_shipped_models_load_and_differ() -> None:
    """At least four models plus the null one ship, each valid and each different."""
    names = shipped_models()
    assert "null" in names and "brief-literal" in names and len(names) >= 5
    models = [load_model(n) for n in names]
    assert len({m.digest for m in models}) == len(models)
    brief = load_model("brief-literal")
    assert (brief.trigger_kind, brief.kvm_modes, brief.where) == ("instruction", ("nvhe",), "every")
    assert brief.clears_by("alle1-local") and brief.clears_by("alle1is")
    assert load_model("null").cost_ns(5) == 0 or load_model("null").trigger == "none"


def test_each_mistake_is_one_line() -> None:
    """Three mistakes, three lines, each naming its key; no traceback."""
    bad = GOOD.replace('"mmu-on-marker"', '"sctlr"').replace("100000", "-1")
    bad = bad.replace('["alle1-local"]', '["alle1", "nothing"]')
    with pytest.raises(TracekitError) as err:
        parse_model(bad, "bad.toml")
    lines = str(err.value).splitlines()
    assert [line.split(":")[1].strip() for line in lines[:-1]] == [
        "[create] trigger",
        "[clear] by",
        "[clear] by",
        "[cost] fixed_ns",
    ]
    with pytest.raises(TracekitError, match=r"bad.toml: \[cost\] where: missing"):
        parse_model(GOOD.replace('where = "holder"', ""), "bad.toml")
    with pytest.raises(TracekitError, match=r"colour: unknown key"):
        parse_model(GOOD + 'colour = "red"\n', "bad.toml")
    with pytest.raises(TracekitError, match=r"fixed_ns: must be an integer"):
        parse_model(GOOD.replace("100000", "true"), "bad.toml")
    with pytest.raises(TracekitError, match="no model 'nope'"):
        load_model("nope")


def test_the_responders_keys_go_with_their_choice() -> None:
    """on = issuer takes no responder key; responders/all need all three, each bounded,
    and a cap below one completion's cost is refused."""
    with pytest.raises(TracekitError, match=r"\[cost\] cap_ns: only with on"):
        parse_model(GOOD + "cap_ns = 5\n", "m.toml")
    with pytest.raises(TracekitError) as err:
        parse_model(GOOD + 'on = "all"\nresponder_ns = 2000000000\n', "m.toml")
    assert str(err.value).splitlines()[:3] == [
        "m.toml: [cost] window_ns: missing (on = 'all')",
        "m.toml: [cost] cap_ns: missing (on = 'all')",
        "m.toml: [cost] responder_ns: must be 0..1000000000 ns",
    ]
    low = GOOD + 'on = "responders"\nresponder_ns = 10\nwindow_ns = 10\ncap_ns = 5\n'
    with pytest.raises(TracekitError, match="cap_ns: below responder_ns"):
        parse_model(low, "m.toml")
    with pytest.raises(TracekitError, match=r"\[cost\] on: 'both'; use one of"):
        parse_model(GOOD + 'on = "both"\n', "m.toml")
    only = parse_model(low.replace("cap_ns = 5", "cap_ns = 25"), "m.toml")
    assert (only.cost_ns(1), only.responder_cost_ns(2), only.responder_cost_ns(9)) == (0, 20, 25)
    with pytest.raises(TracekitError, match=r"\[cost\] pay_when: only with on"):
        parse_model(GOOD + 'pay_when = "wake"\n', "m.toml")
    with pytest.raises(TracekitError, match=r"\[cost\] pay_when: 'idle'; use one of: wake, irq"):
        parse_model(low.replace("cap_ns = 5", 'cap_ns = 25\npay_when = "idle"'), "m.toml")
    assert (only.pay_when, load_model("brief-literal").pay_when) == ("irq", "wake")
    with pytest.raises(TracekitError, match=r"\[cost\] responders: only with on"):
        parse_model(GOOD + 'responders = "isolated"\n', "m.toml")
    some = low.replace("cap_ns = 5", "cap_ns = 25")
    for bad, says in [
        ('"rt"', "'rt'; use others or isolated, or CPUs"),
        ("[]", "a list must hold distinct CPU numbers"),
        ("[3, 3]", "a list must hold distinct CPU numbers"),
        ('["3"]', "a list must hold distinct CPU numbers"),
        ("[256]", "CPU numbers must be 0..255"),
        ("3", "must be a string or a list"),
    ]:
        with pytest.raises(TracekitError, match=re.escape(f"[cost] responders: {says}")):
            parse_model(some + f"responders = {bad}\n", "m.toml")
    assert parse_model(some + "responders = [3, 1]\n", "m.toml").responders == (1, 3)
    assert (only.responders, load_model("brief-literal").responders) == ("others", "isolated")


def test_plugin_form_follows_the_boot_mode() -> None:
    """A model limited to nVHE creates nothing in a VHE boot; the hash travels along."""
    brief, syms = load_model("brief-literal"), Path("/out/vhost-kallsyms.txt")
    nvhe, vhe = plugin_form(brief, "nvhe", syms, [3]), plugin_form(brief, "vhe", syms, [3])
    assert f"create sctlr {GUEST_WINDOW[0]:#x} {GUEST_WINDOW[1]:#x}" in nvhe
    assert "create none" in vhe and "create sctlr" not in vhe
    assert f"model brief-literal {brief.digest}" in vhe
    assert "clear alle1is" in plugin_form(load_model("rollover-only"), "nvhe")
    assert "clear alle1-local" not in plugin_form(load_model("rollover-only"), "nvhe")
    assert "pay all" in nvhe and "responder_ns 300000000" in nvhe
    assert "pay issuer" in plugin_form(load_model("null"), "nvhe")
    with pytest.raises(TracekitError, match="needs the boot's kallsyms"):
        plugin_form(brief, "nvhe")
    # brief-literal's responders are the isolated CPUs: the boot's isolcpus= names them.
    assert "responder-cpus 3\n" in nvhe
    with pytest.raises(
        TracekitError, match=re.escape("isolates none: add e.g. --append 'isolcpus=3'")
    ):
        plugin_form(brief, "nvhe", syms)
    every = replace(brief, responders="others")
    assert "responder-cpus" not in plugin_form(every, "nvhe", syms, [3])
    assert "responder-cpus 0 2\n" in plugin_form(replace(brief, responders=(0, 2)), "nvhe", syms)


# Both test programs: SIGILL steps over the EL1/EL2-only instructions; the virtual
# counter times what they do.
PRELUDE = r"""
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
static void skip(int sig, siginfo_t *si, void *uc) {
	(void)sig; (void)si; ((ucontext_t *)uc)->uc_mcontext.pc += 4;
}
static uint64_t cnt(void) {
	uint64_t v; __asm__ volatile("isb; mrs %0, cntvct_el0" : "=r"(v)); return v;
}
static uint64_t freq(void) {
	uint64_t v; __asm__ volatile("mrs %0, cntfrq_el0" : "=r"(v)); return v;
}
"""
# A program that times broadcast TLBI+DSB loops: before, after creating the state, after
# clearing it. argv[1]: loop length; argv[2]: "mark" (HINT #0x76) or "sctlr".
PROGRAM = (
    PRELUDE
    + r"""
static uint64_t loop(int n) {
	uint64_t t = cnt();
	for (int i = 0; i < n; i++) __asm__ volatile("tlbi vmalle1is\n dsb ish" ::: "memory");
	return (cnt() - t) * 1000000000ull / freq();
}
extern void sctlr_at(void);
int main(int argc, char **argv) {
	struct sigaction sa = { .sa_sigaction = skip, .sa_flags = SA_SIGINFO };
	int n = atoi(argv[1]);
	sigaction(SIGILL, &sa, NULL);
	printf("before %llu\n", (unsigned long long)loop(n));
	if (strcmp(argv[2], "mark") == 0) __asm__ volatile("hint #0x76");
	else sctlr_at();
	printf("held %llu\n", (unsigned long long)loop(n));
	__asm__ volatile("tlbi alle1");
	printf("cleared %llu\n", (unsigned long long)loop(n));
	return 0;
}
"""
)
# MSR SCTLR_EL1 placed at the guest window's address (the trigger fires only there).
SCTLR_AT = """
.section .guestwin, "ax"
.globl sctlr_at
sctlr_at:
    msr sctlr_el1, x0
    ret
"""


@functools.cache
def _cached_header() -> Path | None:
    """The installed QEMU's plugin header, fetched from Debian's qemu source and cached as
    `vhost build --ground-truth` does (CI's cold cache too: these tests run before any
    boot); None where it cannot be (no apt state for the host's suite, no network)."""
    try:
        return groundtruth.fetch_header(groundtruth.installed_qemu(), lambda _message: None)
    except TracekitError:
        return None


needs_qemu_user = pytest.mark.skipif(
    shutil.which("qemu-aarch64") is None
    or shutil.which("aarch64-linux-gnu-gcc") is None
    or _cached_header() is None,
    reason="needs qemu-user (qemu-aarch64), the cross gcc and QEMU's plugin header (fetched "
    "from Debian's qemu source; that failed)",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin and the test program, built once."""
    tmp = tmp_path_factory.mktemp("tksim")
    header = _cached_header()
    assert header is not None
    make = ["make", "-s", "-C", str(groundtruth.plugin_source_dir())]
    subprocess.run([*make, f"QEMU_PLUGIN_INCLUDE={header.parent}", f"O={tmp}"], check=True)
    (tmp / "p.c").write_text(PROGRAM)
    (tmp / "s.S").write_text(SCTLR_AT)
    gcc = ["aarch64-linux-gnu-gcc", "-O2", "-static", "-o", str(tmp / "p")]
    place = f"-Wl,--section-start=.guestwin={GUEST_WINDOW[0] + 0x1000:#x}"
    subprocess.run([*gcc, place, str(tmp / "p.c"), str(tmp / "s.S")], check=True)
    return tmp


def _run(built: Path, tmp: Path, model: str, how: str, n: int) -> tuple[dict[str, int], Path]:
    """Run the program under the plugin with `model` (TOML); its three timings and log."""
    (tmp / "model.txt").write_text(plugin_form(parse_model(model, "t.toml"), "nvhe"))
    args = f"out={tmp / 'gt.tkgt'},limit=65536,sim={tmp / 'model.txt'},simlog={tmp / 'sim.txt'}"
    done = subprocess.run(
        [
            "qemu-aarch64",
            "-plugin",
            f"{built / groundtruth.PLUGIN},{args}",
            str(built / "p"),
            str(n),
            how,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    times = {k: int(v) for k, v in (line.split() for line in done.stdout.splitlines())}
    return times, tmp / "sim.txt"


@needs_qemu_user
def test_the_delay_is_real_time_on_the_holder_until_alle1(built: Path, tmp_path: Path) -> None:
    """Created by the marker, 100 us on each of 200 broadcast completions (the program's
    own clock sees >= 20 ms more), none after TLBI ALLE1 on the same vCPU (counted: the
    time of the other loops depends on this shared machine's load)."""
    times, log_path = _run(built, tmp_path, GOOD, "mark", 200)
    assert times["held"] >= 200 * 100_000
    log = read_sim_log(log_path)
    assert log.complete and log.model.startswith("m@")
    assert [e.kind for e in log.events] == ["create", "clear-local"]
    cpu = log.vcpus[0]
    assert (cpu["creates"], cpu["clears"], cpu["delayed"], cpu["spans"]) == (1, 1, 200, 600)
    assert cpu["injected_ns"] == 200 * 100_000 <= cpu["actual_ns"]


@needs_qemu_user
def test_the_sctlr_trigger_fires_only_in_the_guest_window(built: Path, tmp_path: Path) -> None:
    """MSR SCTLR_EL1 inside the window creates; the null model and a model cleared by
    nothing behave as they say."""
    model = GOOD.replace("mmu-on-marker", "sctlr-write")
    _, log_path = _run(built, tmp_path, model, "sctlr", 50)
    log = read_sim_log(log_path)
    assert (log.events[0].kind, log.events[0].vaddr) == ("create", GUEST_WINDOW[0] + 0x1000)
    permanent = model.replace('["alle1-local"]', '["nothing"]')
    _, log_path = _run(built, tmp_path, permanent, "sctlr", 50)
    assert read_sim_log(log_path).vcpus[0]["delayed"] == 100  # held, then never cleared
    _, log_path = _run(built, tmp_path, load_null(), "mark", 50)
    null = read_sim_log(log_path)
    assert null.events == [] and null.vcpus[0]["delayed"] == 0 and null.vcpus[0]["spans"] == 150


def load_null() -> str:
    """The shipped null model's TOML."""
    from importlib import resources

    return (resources.files("tracekit.simulate") / "models" / "null.toml").read_text()


# Responders under qemu-user: vCPU 0 (the main thread) holds the state and issues
# broadcasts; vCPU 1 (a thread) enters "the IRQ handler" (a function of that name, its
# address in a kallsyms file the test writes) after each batch and times the entry.
# Both responder programs: "the IRQ handlers", broadcast batches, and start(): a clock
# marker (the plugin reads the kallsyms), the state on vCPU 0, the responder thread.
THREADS = (
    PRELUDE
    + r"""
#include <pthread.h>
#include <unistd.h>
__attribute__((noinline)) void el1h_64_irq_handler(void) { __asm__ volatile("nop"); }
__attribute__((noinline)) void el0t_64_irq_handler(void) { __asm__ volatile("nop"); }
static void batch(int n) {
	for (int i = 0; i < n; i++) __asm__ volatile("tlbi vmalle1is\n dsb ish" ::: "memory");
}
static void *responder(void *arg);
static pthread_t start(void) {
	struct sigaction sa = { .sa_sigaction = skip, .sa_flags = SA_SIGINFO };
	pthread_t t;
	sigaction(SIGILL, &sa, NULL);
	__asm__ volatile("hint #0x77");
	usleep(100000);
	__asm__ volatile("hint #0x76");
	pthread_create(&t, NULL, responder, NULL);
	return t;
}
"""
)
RESPONDER_PROGRAM = (
    THREADS
    + r"""
static volatile int phase, done;
static void *responder(void *arg) {
	(void)arg;
	for (int want = 1; want <= 3; want++) {
		while (phase != want) ;
		uint64_t t = cnt();
		el1h_64_irq_handler();
		uint64_t first = (cnt() - t) * 1000000000ull / freq();
		t = cnt();
		el0t_64_irq_handler();
		uint64_t again = (cnt() - t) * 1000000000ull / freq();
		printf("phase%d %llu again%d %llu\n", want, (unsigned long long)first, want,
			(unsigned long long)again);
		fflush(stdout);
		done = want;
	}
	return NULL;
}
int main(void) {
	pthread_t t = start();
	batch(3); phase = 1; while (done != 1) ;
	batch(50); phase = 2; while (done != 2) ;
	batch(3); usleep(600000); phase = 3; while (done != 3) ;
	pthread_join(t, NULL);
	return 0;
}
"""
)
RESPONDERS = GOOD.replace('where = "holder"', 'where = "every"').replace(
    "fixed_ns = 100000",
    'fixed_ns = 0\non = "responders"\nresponder_ns = 2000000\n'
    "window_ns = 300000000\ncap_ns = 30000000",
)


@needs_qemu_user
def test_responders_pay_at_the_irq_entry_within_window_and_cap(built: Path, tmp_path: Path) -> None:
    """The IRQ entry's address comes from the kallsyms file at the first clock marker
    (the plugin then retranslates); another vCPU's entry pays 2 ms for each of 3 recent
    completions, the cap (30 ms) for 50, nothing a second time, nothing for completions
    older than the window (300 ms); the issuer pays nothing (on = responders)."""
    times, log_path = _run_responders(tmp_path, built, RESPONDER_PROGRAM, RESPONDERS)
    assert times["phase1"] >= 6_000_000 and times["phase2"] >= 30_000_000
    assert max(times["again1"], times["again2"], times["phase3"], times["again3"]) < 6_000_000
    log = read_sim_log(log_path)
    assert log.complete and set(log.pay_at) == set(IRQ_ENTRY_SYMBOLS)
    issuer, responder = log.vcpus[0], log.vcpus[1]
    assert (issuer["bcasts"], issuer["delayed"], issuer["pays"]) == (56, 0, 0)
    assert (responder["wakes"], responder["spared"]) == (0, 0)  # pay_when irq: no WFI kept
    assert (responder["pays"], responder["owed"]) == (2, 53)
    assert responder["asked_ns"] == 53 * 2_000_000 and responder["paid_ns"] == 36_000_000
    assert responder["paid_actual_ns"] >= responder["paid_ns"]


# Wake-ups under qemu-user (pay_when = "wake"): the responder (vCPU 1) enters "the IRQ
# handler" once busy (no WFI since its last entry), once after a WFI that came before
# the issuer's batch, once more busy, and once after a WFI that came in the middle of a
# batch (WFI is a NOP in qemu-user; the plugin sees it execute).
WAKE_PROGRAM = (
    THREADS
    + r"""
static volatile int phase, done, asleep;
static void entry(const char *name) {
	uint64_t t = cnt();
	el1h_64_irq_handler();
	printf("%s %llu\n", name, (unsigned long long)((cnt() - t) * 1000000000ull / freq()));
	fflush(stdout);
}
static void *responder(void *arg) {
	(void)arg;
	while (phase != 1) ;
	entry("busy"); done = 1;
	__asm__ volatile("wfi"); asleep = 2;
	while (phase != 2) ;
	entry("wake"); entry("again"); done = 2;
	while (phase != 3) ;
	__asm__ volatile("wfi"); asleep = 3;
	while (phase != 4) ;
	entry("late"); done = 3;
	return NULL;
}
int main(void) {
	pthread_t t = start();
	batch(3); phase = 1; while (done != 1) ;
	while (asleep != 2) ;
	batch(5); phase = 2; while (done != 2) ;
	batch(4); phase = 3; while (asleep != 3) ;
	batch(2); phase = 4; while (done != 3) ;
	pthread_join(t, NULL);
	return 0;
}
"""
)


def _run_responders(
    tmp_path: Path,
    built: Path,
    program: str,
    model: str,
    isolated: tuple[int, ...] = (),
    load: ImageLoad | None = None,
    late: str | None = None,
) -> tuple[dict, Path]:
    """Build `program` (IRQ-handler symbols in a kallsyms file), run it under the plugin
    with `model` (`isolated`: the CPUs isolcpus= would name); its printed timings (ns)
    and the simulation log's path. `late`: a symbol the kallsyms file first lacks; the
    program gets the file's path and a whole copy's, to put in its place."""
    source = tmp_path / "r.c"
    source.write_text(program)
    binary = tmp_path / "r"
    gcc = ["aarch64-linux-gnu-gcc", "-O2", "-static", "-pthread", "-o", str(binary)]
    subprocess.run([*gcc, str(source)], check=True)
    nm = subprocess.run(["aarch64-linux-gnu-nm", str(binary)], capture_output=True, text=True)
    kallsyms, whole = tmp_path / "kallsyms.txt", tmp_path / "kallsyms.whole"
    kallsyms.write_text(nm.stdout)
    argv = []
    if late is not None:
        whole.write_text(nm.stdout)
        kallsyms.write_text("".join(line + "\n" for line in nm.stdout.splitlines()
                                    if not line.endswith(f" {late}")))  # fmt: skip
        argv = [str(kallsyms), str(whole)]
    form = plugin_form(parse_model(model, "t.toml"), "nvhe", kallsyms, isolated, load)
    (tmp_path / "model.txt").write_text(form)
    args = f"out={tmp_path / 'gt.tkgt'},limit=65536,sim={tmp_path / 'model.txt'}"
    args += f",simlog={tmp_path / 'sim.txt'}"
    plugin = f"{built / groundtruth.PLUGIN},{args}"
    done = subprocess.run(
        ["qemu-aarch64", "-plugin", plugin, str(binary), *argv], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    return {k: int(v) for k, v in zip(words[::2], words[1::2], strict=True)}, tmp_path / "sim.txt"


# A first clock marker while the kallsyms file lacks one IRQ handler (found: the other),
# then the whole file in its place, then RESPONDER_PROGRAM's own marker and phases.
RETRY_PROGRAM = RESPONDER_PROGRAM.replace(
    "int main(void) {\n\tpthread_t t = start();",
    "int main(int argc, char **argv) {\n\t(void)argc;\n"
    '\t__asm__ volatile("hint #0x77");\n'
    "\tif (rename(argv[2], argv[1])) return 1;\n"
    "\tpthread_t t = start();",
)


@needs_qemu_user
def test_a_retry_after_a_partial_find_of_the_irq_entries_resolves_them(
    built: Path, tmp_path: Path
) -> None:
    """The first marker finds one of the two IRQ handlers (the file lacks the other), the
    next reads the whole file afresh and finds both: the responder then pays as it does
    when both are there at once (2 payments for 53 completions)."""
    assert 'hint #0x77");\n\tif (rename' in RETRY_PROGRAM
    late = IRQ_ENTRY_SYMBOLS[-1]
    _, log_path = _run_responders(tmp_path, built, RETRY_PROGRAM, RESPONDERS, late=late)
    log = read_sim_log(log_path)
    assert log.complete and set(log.pay_at) == set(IRQ_ENTRY_SYMBOLS), log.pay_at
    assert all(log.pay_at.values()), log.pay_at
    assert (log.vcpus[1]["pays"], log.vcpus[1]["owed"]) == (2, 53)


@needs_qemu_user
def test_a_kallsyms_without_an_anchor_leaves_the_cpu_entry_unresolved_not_the_payments(
    built: Path, tmp_path: Path
) -> None:
    """A kallsyms with neither _text nor _stext (the static test binary's symbols): the CPU
    entry cannot be placed, and that must not stop the responders' payments (the same 2
    payments for 53 completions as without a cpu-entry line)."""
    load = ImageLoad(0, 0x10000)
    _, log_path = _run_responders(tmp_path, built, RESPONDER_PROGRAM, RESPONDERS, load=load)
    assert "cpu-entry " in (tmp_path / "model.txt").read_text()
    log = read_sim_log(log_path)
    assert log.complete and set(log.pay_at) == set(IRQ_ENTRY_SYMBOLS)
    assert log.cpu_entry is not None and log.cpu_entry.symbol == "unresolved"
    assert log.cpu_entry.anchor == "none"
    assert (log.vcpus[1]["pays"], log.vcpus[1]["owed"]) == (2, 53)


@needs_qemu_user
def test_responders_pay_only_when_waking_from_wfi(built: Path, tmp_path: Path) -> None:
    """pay_when = wake: the busy entry pays nothing for the 3 completions before it
    (spared); the entry after a WFI pays 2 ms for each of the 5 that came while it slept,
    the busy one after it nothing; the last wake-up pays for the 2 after its WFI, not the
    4 before it (spared)."""
    model = RESPONDERS + 'pay_when = "wake"\n'
    assert "pay-when wake" in plugin_form(parse_model(model, "t.toml"), "nvhe", Path("/k"))
    times, log_path = _run_responders(tmp_path, built, WAKE_PROGRAM, model)
    assert times["wake"] >= 10_000_000 and times["late"] >= 4_000_000
    assert max(times["busy"], times["again"]) < 4_000_000
    log = read_sim_log(log_path)
    assert log.complete and set(log.pay_at) == set(IRQ_ENTRY_SYMBOLS)
    issuer, responder = log.vcpus[0], log.vcpus[1]
    assert (issuer["bcasts"], issuer["pays"], issuer["wakes"]) == (14, 0, 0)
    got = {k: responder[k] for k in ("pays", "owed", "wakes", "spared", "asked_ns", "paid_ns")}
    assert got == {
        "pays": 2,
        "owed": 7,
        "wakes": 2,
        "spared": 7,
        "asked_ns": 14_000_000,
        "paid_ns": 14_000_000,
    }
    assert responder["paid_actual_ns"] >= responder["paid_ns"]
    assert "2 wake-ups from WFI, 7 completions spared while awake" in log.summary()


@needs_qemu_user
def test_only_the_named_responders_pay(built: Path, tmp_path: Path) -> None:
    """responders = "isolated" with CPU 0 isolated: the responder thread (vCPU 1) enters
    the IRQ handler after 56 completions as before and pays nothing (no wake, nothing
    spared), and the log names CPU 0 as the only responder; naming vCPU 1 pays as the
    unrestricted model does (2 entries, 53 completions)."""
    isolated = RESPONDERS + 'responders = "isolated"\n'
    times, log_path = _run_responders(tmp_path, built, RESPONDER_PROGRAM, isolated, (0,))
    # Below the cap phase 2 would pay (30 ms), not one completion's 2 ms: this test
    # failed once in a full run at load ~9 (its assertion not kept; 10 reruns passed),
    # and this timing bound is its one load-sensitive line; the log's counts are exact.
    assert times["phase2"] < 30_000_000
    log = read_sim_log(log_path)
    assert log.complete and log.responder_cpus == (0,)
    assert log.vcpus[0]["bcasts"] == 56
    assert [log.vcpus[1][k] for k in ("pays", "owed", "wakes", "spared")] == [0, 0, 0, 0]
    assert "responders: CPU 0 only" in log.summary()
    named = RESPONDERS + "responders = [1]\n"
    times, log_path = _run_responders(tmp_path, built, RESPONDER_PROGRAM, named)
    log = read_sim_log(log_path)
    assert log.responder_cpus == (1,) and times["phase2"] >= 30_000_000
    assert (log.vcpus[1]["pays"], log.vcpus[1]["owed"]) == (2, 53)


def test_sim_log_refuses_what_it_cannot_read() -> None:
    """A foreign file and a bad event line are one line each."""
    with pytest.raises(TracekitError, match="not a simulation log"):
        parse_sim_log("hello\n")
    with pytest.raises(TracekitError, match="bad event line"):
        parse_sim_log("tksim-log 1\nmodel m h\ncreate x 0 1 0x0\n")


def _simulated(bundle: Path, label: str) -> None:
    """Mark a generated bundle as made under `label` (as the collector's facts do)."""
    name, _, digest = label.partition("@")
    edit = {"model": name, "hash": digest, "label": label}
    edit_manifest(bundle, lambda m: m["host"].__setitem__("simulated", edit))


@pytest.mark.parametrize("fmt", ["text", "email", "html", "json"])
def test_every_report_format_says_simulated_beside_emulated(fmt: str, tmp_path: Path) -> None:
    """The first line: EMULATED HOST, then SIMULATED EFFECT with the model's name@hash."""
    bundle = make_bundle(tmp_path / "b", runs=4, factor=2.0)
    _simulated(bundle, "brief-literal@0123456789abcdef")
    report = build_report([load_bundle(bundle)])
    text = render(report, fmt)
    head = " ".join(text[:2000].split())  # text and email wrap the line
    assert "EMULATED HOST" in head
    assert "SIMULATED EFFECT (brief-literal@0123456789abcdef)" in head
    assert head.index("EMULATED HOST") < head.index("SIMULATED EFFECT")
    assert report.warnings[0].startswith("EMULATED HOST") and "SIMULATED" in report.warnings[1]


def _vcpu_line(vcpu: int, **values: int) -> str:
    """A sim log's per-vCPU line: `values`, every other key 0."""
    keys = (*VCPU_KEYS, *RESPONDER_KEYS, *WAKE_KEYS)
    return f"vcpu {vcpu} " + " ".join(f"{k} {values.get(k, 0)}" for k in keys)


SIM_TEXT = "\n".join(
    [
        "tksim-log 4",
        "model brief-literal 0123456789abcdef",
        "clock 1",
        "responder-cpus 1",
        "create 100 0 1 0x4000015c",
        _vcpu_line(
            0,
            delayed=20,
            injected_ns=20_000_000,
            actual_ns=21_000_000,
            waited_spans=3,
            waited_ns=2_500_000,
        ),
        _vcpu_line(
            1, pays=2, owed=4, asked_ns=400_000_000, paid_ns=300_000_000, paid_actual_ns=300_100_000
        ),
        "complete 1",
    ]
)


def test_the_report_says_where_the_delays_landed_beside_the_intent(tmp_path: Path) -> None:
    """Per vCPU of the boot: the issuer delays asked and taken, the responder payments,
    the spans held up; a bundle that was not simulated makes no section."""
    bundle = make_bundle(tmp_path / "b", runs=4, factor=2.0)
    assert simulated.section([load_bundle(bundle)]) is None
    _simulated(bundle, "brief-literal@0123456789abcdef")
    (bundle / GT_BUNDLE_DIR).mkdir()
    (bundle / GT_BUNDLE_DIR / SIM_LOG).write_text(SIM_TEXT)
    section = simulated.section([load_bundle(bundle)])
    assert section is not None and len(section.tables) == 1
    rows = section.tables[0].frame.to_dicts()
    assert [(r["vCPU"], r["issuer delays"], r["took ms"], r["held up ms"]) for r in rows] == [
        (0, 20, 21.0, 2.5),
        (1, 0, 0.0, 0.0),
    ]
    assert (rows[1]["responder pays"], rows[1]["responder asked ms"]) == (2, 400.0)
    assert "asked 420.0 ms of delays" in section.findings[0]
    assert "took 321.1 ms" in section.findings[0] and "(3 TLBI -> DSB spans)" in section.findings[0]


def test_simulated_bundles_never_share_a_condition_with_real_ones(tmp_path: Path) -> None:
    """Same everything, one under a model: two conditions, and the header says so."""
    real = make_bundle(tmp_path / "real", runs=2, factor=1.0)
    sim = make_bundle(tmp_path / "sim", runs=2, factor=1.0)
    _simulated(sim, "null@c440ed43b72271f1")
    a, b = (bundle_condition(load_bundle(p).manifest) for p in (real, sim))
    assert (a.simulated, b.simulated) == ("none", "null@c440ed43b72271f1")
    assert a != b and "simulated" in a.differing(b)
    lines = build_report([load_bundle(real), load_bundle(sim)]).warnings
    assert any("1 bundle(s) not simulated, never pooled" in line for line in lines)


def test_the_variable_is_refused_off_the_emulated_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A board never records a model; the emulated host records name and hash."""
    monkeypatch.setenv("TRACEKIT_SIMULATED", "null@abc")
    monkeypatch.delenv("TRACEKIT_VHOST", raising=False)
    with pytest.raises(TracekitError, match="not tracekit's emulated one"):
        simulated_model(False)
    monkeypatch.setenv("TRACEKIT_VHOST", "1")
    assert simulated_model(True) == {"model": "null", "hash": "abc", "label": "null@abc"}
    monkeypatch.delenv("TRACEKIT_SIMULATED")
    assert simulated_model(True) is None


def test_vhost_run_writes_the_model_and_loads_the_plugin_with_it(tmp_path: Path) -> None:
    """--simulate: the model's source and plugin form in --out (its responders the CPUs
    --append's isolcpus= names, flags left out), the plugin's argv; no isolated CPU for
    an isolated-CPU model is one line."""
    append = "isolcpus=domain,managed_irq,3 nohz_full=3"
    config = VhostConfig(simulate="brief-literal", ground_truth=True, append=append)
    label = prepare_simulation(config, tmp_path)
    assert label == load_model("brief-literal").label
    form = plugin_form(load_model("brief-literal"), "nvhe", tmp_path.resolve() / KALLSYMS, [3])
    assert (tmp_path / SIM_FORM).read_text() == form and "responder-cpus 3\n" in form
    with pytest.raises(TracekitError, match="isolates none"):
        prepare_simulation(replace(config, append="nohz_full=3"), tmp_path)
    # The simboot's own configuration: only its rt CPU, 3, pays as a responder.
    prepare_simulation(VHOST_CONFIGS["nvhe-a76-sim"], tmp_path)
    assert "responder-cpus 3\n" in (tmp_path / SIM_FORM).read_text()
    assert form.endswith(
        f"irq-entry {tmp_path.resolve() / KALLSYMS} {' '.join(IRQ_ENTRY_SYMBOLS)}\n"
    )
    assert 'name = "brief-literal"' in (tmp_path / SIM_SOURCE).read_text()
    # A kernel that is not a plain Image (gzip'd): brief-literal only loses its power-on
    # watch; power-cycle, which clears by it, is refused in one line.
    gzipped = tmp_path / "Image.gz"
    gzipped.write_bytes(b"\x1f\x8b" + bytes(62))
    prepare_simulation(config, tmp_path, gzipped)
    assert "cpu-entry" not in (tmp_path / SIM_FORM).read_text()
    with pytest.raises(TracekitError, match="not an arm64 Image"):
        prepare_simulation(replace(config, simulate="power-cycle"), tmp_path, gzipped)
    argv = groundtruth.plugin_argv(Path("/p.so"), Path("/l"), 5, sim=(Path("/m"), Path("/s")))
    assert argv == ["-plugin", "file=/p.so,out=/l,limit=5,sim=/m,simlog=/s"]
    with pytest.raises(TracekitError, match="no model"):
        prepare_simulation(VhostConfig(simulate="nope"), tmp_path)


def test_a_campaign_cell_runs_under_its_model() -> None:
    """[matrix] simulate: each cell boots with its model (plugin loaded), None without;
    an unknown model is one line before any boot; a board refuses the axis; a plan
    without the axis hashes as before it existed."""
    plan = parse_plan({"matrix": {"simulate": ["brief-literal", "null"]}})
    cells = expand_cells(plan, seed=1)
    settings = {c.axes["simulate"]: vhost_settings(c, plan) for c in cells}
    assert settings["brief-literal"]["ground_truth"] and settings["null"]["simulate"] == "null"
    assert all("simulate" in c.cell_id or c.axes["simulate"] in c.cell_id for c in cells)
    plain = parse_plan({})
    assert vhost_settings(expand_cells(plain, 1)[0], plain)["simulate"] is None
    assert "simulate" not in plain.to_json()["matrix"]
    with pytest.raises(TracekitError, match=r"\[matrix\] simulate: no model 'nope'"):
        parse_plan({"matrix": {"simulate": ["nope"]}})
    with pytest.raises(TracekitError, match="emulated host only"):
        check_board_plan(plan)


def _cell(
    root: Path, guest: str, after: str, factor: float, release: str, emulated: bool = False
) -> BundleData:
    """A generated 4+4-run bundle of one condition (after = before x factor), from a
    board unless EMULATED."""
    bundle = make_bundle(root, runs=4, factor=factor, guest=guest, emulated=emulated)

    def edit(m: dict) -> None:
        m["host"]["kernel_release"] = release
        m["options"]["after_guest"] = after
        # The rt CPU isolated, as the protocol runs it: brief-literal's responders.
        m["host"]["isolation"] = [{"cpu": 3, "isolcpus": True, "nohz_full": True}]
        # No power-down idle state on any CPU (as the emulated host; tracekit's preflight).
        m["host"]["power"] = [{"cpu": c, "idle_states": []} for c in range(4)]

    edit_manifest(bundle, edit)
    return load_bundle(bundle)


def test_predictions_rule_out_the_models_the_verdicts_contradict(tmp_path: Path) -> None:
    """The report section on generated 6.12 board bundles: mmu-on x3 on the rt CPU's
    cyclictest is present, which only the brief's model predicts (consistent): the null
    model and every model whose cost only issuers pay predict it absent (refuted)."""
    r612 = "6.12.117+deb13-arm64"
    bundles = [
        _cell(tmp_path / "on", "mmu-on", "none", 3.0, r612),
        _cell(tmp_path / "off", "mmu-off", "none", 1.0, r612),
    ]
    section = predictions.section(bundles)
    assert section is not None
    text = " ".join(section.findings)
    assert f"{load_model('brief-literal').label}: consistent; agrees with mmu-on" in text
    assert f"{load_model('null').label}: refuted; refuted by mmu-on" in text
    assert f"{load_model('holder-only').label}: refuted; refuted by mmu-on" in text
    # The refutation says it rests on where the cost lands, not on the clearing rule.
    holder = text.split(f"{load_model('holder-only').label}: refuted", 1)[1].split(".", 1)[0]
    assert "(it predicted absent: " in holder and "its cost lands only on issuers" in holder
    assert section.findings[0] == (
        "The data rules out 5 model(s): dose, holder-only, null, permanent-any-mode,"
        " rollover-only, each by its predictions on the rt CPU's wake-ups (below: what each"
        " predicted, and why)."
    )
    assert "the isolated rt CPU's cyclictest wake-ups" in section.tables[0].title
    frame = section.tables[0].frame
    assert set(frame["outcome"]) <= {"agrees", "refutes", "undecided"}


def test_top10_rests_on_ten_samples_and_the_verdicts_on_the_primary() -> None:
    """4+4 runs of 400 wake-ups: the after runs' 20 longest are 10x the before runs', but one
    before run holds the single longest wake-up of all. p99.9 (the max here) cannot
    separate the phases; top10, which the null FPR script measures beside it, can. The
    simulated verdicts stay on p99.9, the decision table's primary (top10 called the
    hotplug control "present" in session 9's simboot)."""
    rows = []
    for phase, tail in (("before", 10_000), ("after", 100_000)):
        for run in range(4):
            values = [1_000 + i for i in range(380)] + [tail + run] * 20
            if phase == "before" and run == 0:
                values[-1] = 300_000  # one sample decides a max
            run_id = f"{phase}-quiet-{run}"
            rows += [(run_id, phase, "quiet", v) for v in values]
    frame = pl.DataFrame(rows, schema=["run_id", "phase", "kind", "latency_ns"], orient="row")
    cond = Condition(
        "mmu-on",
        "none",
        "nvhe",
        "same",
        "6.12.117+deb13-arm64",
        knobs="none",
        guest_idle="wfi-only",
    )
    groups = {cond: [("b", frame)]}
    said = {m: condition_effects(groups, primary=m)[0].comparison for m in ("p99.9", "top10")}
    assert said["p99.9"].verdict != PRESENT
    assert said["top10"].verdict == PRESENT and said["top10"].ratio > 4
    assert condition_effects(groups)[0].comparison == said[VERDICT_METRIC] == said["p99.9"]
    with pytest.raises(TracekitError, match="top10 needs run_metrics"):
        metric_values(run_metrics(frame), "top10")


def test_an_emulated_bundle_without_a_model_tests_no_model(tmp_path: Path) -> None:
    """The emulated host ran no mechanism: alone it gets no predictions section; beside
    board bundles it is left out of them, and said; simulated, it takes part."""
    r612 = "6.12.117+deb13-arm64"
    emulated = _cell(tmp_path / "emu", "mmu-on", "none", 3.0, r612, emulated=True)
    assert predictions.section([emulated]) is None
    board = _cell(tmp_path / "on", "mmu-on", "none", 3.0, r612)
    section = predictions.section([board, emulated])
    assert section is not None
    (left,) = [u for u in section.unknowns if "left out of the model predictions" in u]
    assert "emulated without a simulated mechanism" in left and "emu" in left
    assert section.tables[0].frame["condition"].n_unique() == 1
    _simulated(tmp_path / "emu", "null@c440ed43b72271f1")
    assert predictions.section([load_bundle(tmp_path / "emu")]) is not None


R612, R61 = "6.12.117+deb13-arm64", "6.1.0-50-arm64"
ISOLATED = "isolcpus+nohz_full+rcu_nocbs"
# The protocol's placement and the rt CPU's isolation (brief-literal's responders).
ON = Condition(
    "mmu-on",
    "none",
    "nvhe",
    "same",
    R612,
    knobs="none",
    placement="rt3/stress0-2/guest1",
    isolation=ISOLATED,
    guest_idle="wfi-only",  # as in the emulated host: no power-down idle state
)
CELLS = {
    "mmu-on": ON,
    "mmu-off": replace(ON, variant="mmu-off"),
    "hotplug 6.12": replace(ON, after_guest="hotplug"),
    "vhe": replace(ON, kvm_mode="vhe"),
}
# Every shipped model's prediction per cell, on (rt wake-ups, probe elsewhere, probe on
# the guest CPU): P present, A absent. The rt CPU's cyclictest issues no broadcast, so
# it sees only a responder's cost (brief-literal's); the probe is an issuer everywhere,
# the holder-only cost reaches it only on the guest CPU; 6.12's hotplug runs a local
# ALLE1 on the guest CPU (clears all but rollover-only and permanent-any-mode).
EXPECTED = {
    "brief-literal": {"mmu-on": "PPP", "mmu-off": "AAA", "hotplug 6.12": "AAA", "vhe": "AAA"},
    "dose": {"mmu-on": "APP", "mmu-off": "AAA", "hotplug 6.12": "AAA", "vhe": "AAA"},
    "holder-only": {"mmu-on": "AAP", "mmu-off": "AAA", "hotplug 6.12": "AAA", "vhe": "AAA"},
    "null": {"mmu-on": "AAA", "mmu-off": "AAA", "hotplug 6.12": "AAA", "vhe": "AAA"},
    "permanent-any-mode": {"mmu-on": "APP", "mmu-off": "AAA", "hotplug 6.12": "APP", "vhe": "APP"},
    "power-cycle": {"mmu-on": "PPP", "mmu-off": "AAA", "hotplug 6.12": "AAA", "vhe": "AAA"},
    "rollover-only": {"mmu-on": "APP", "mmu-off": "AAA", "hotplug 6.12": "APP", "vhe": "AAA"},
}
CODES = {"P": "present", "A": "absent", "?": "unknown"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_shipped_model_predicts_per_observable(name: str) -> None:
    """Each shipped model's verdict for each cell and observable, its size only where
    present, and the observable named in the prediction."""
    assert sorted(EXPECTED) == shipped_models()  # a new model needs its row here
    model = load_model(name)
    for cell, codes in EXPECTED[name].items():
        for observable, code in zip((RT_WAKEUPS, PROBE, PROBE_GUEST), codes, strict=True):
            said = predict(model, CELLS[cell], observable)
            assert (said.observable, said.verdict) == (observable, CODES[code]), (cell, said)
            assert (said.size != "none") == (code == "P"), (cell, said)
            if code == "P" and observable == RT_WAKEUPS:
                assert "as a responder" in said.why and "300000 us" in said.size
            if code == "A" and observable == RT_WAKEUPS and said.created and not said.cleared:
                assert "lands only on issuers" in said.why, said.why


def test_612_without_virt_at_load_hotplugs_as_61_does() -> None:
    """kvm.enable_virt_at_load=0 on 6.12: a hotplug with no VM alive runs no hyp init, so
    brief-literal (cleared by ALLE1) is not cleared there, power-cycle still is."""
    hotplug = replace(ON, after_guest="hotplug")
    assert predict(load_model("brief-literal"), hotplug).verdict == "absent"
    off = replace(hotplug, enable_virt_at_load="no")
    said = predict(load_model("brief-literal"), off)
    assert said.verdict == "present" and "enable_virt_at_load=0" in said.why
    assert predict(load_model("power-cycle"), off).verdict == "absent"


def test_power_down_idle_on_612_leaves_the_clearing_unknown() -> None:
    """On a 6.12 nVHE host every exit from a power-down idle state re-runs hyp init's local
    TLBI ALLE1, so a model cleared by it cannot be predicted present after the guest where
    the guest CPU can power down (a board's cpuidle-psci states) or where that is not
    recorded; WFI only (the emulated host) keeps the prediction; VHE and 6.1 are unchanged."""
    brief = load_model("brief-literal")
    assert predict(brief, ON).verdict == "present"
    sleepy = replace(ON, guest_idle="cpu-sleep")
    said = predict(brief, sleepy)
    assert said.verdict == "unknown" and said.cleared is None
    assert "power-down idle states (cpu-sleep)" in said.why
    assert predict(brief, replace(ON, guest_idle="not recorded")).verdict == "unknown"
    assert predict(brief, replace(sleepy, kernel=R61)).verdict == "present"
    # A model not cleared by ALLE1 is not touched by it.
    assert predict(load_model("permanent-any-mode"), sleepy).cleared is False


def test_the_rt_cpu_pays_only_where_the_model_makes_it_a_responder() -> None:
    """A responder's cost reaches the rt CPU's wake-ups only if the rt CPU is one of the
    responders (isolated, or named) and, for a holder-only cost, the holder issues
    broadcasts (a stress CPU); what the condition does not record is unknown."""
    brief = load_model("brief-literal")
    assert predict(brief, replace(ON, isolation="none")).verdict == "absent"
    unknown = Condition("mmu-on", "none", "nvhe", "same", R612, knobs="none", guest_idle="wfi-only")
    said = predict(brief, unknown)
    assert said.verdict == "unknown" and "isolation is not known" in said.why
    source = model_source("brief-literal")
    named = parse_model(source.replace('"isolated"', "[2]"), "named.toml")
    assert predict(named, ON).verdict == "absent"
    assert predict(named, replace(ON, placement="rt2/stress0-1,3/guest1")).verdict == "present"
    holder = parse_model(source.replace('where = "every"', 'where = "holder"'), "h.toml")
    assert predict(holder, ON).verdict == "present"  # the guest CPU 1 runs stress-ng
    assert predict(holder, replace(ON, placement="rt3/stress0,2/guest1")).verdict == "unknown"
    quiet = parse_model(source.replace('on = "all"', 'on = "responders"'), "r.toml")
    assert predict(quiet, ON, PROBE).verdict == "unknown"  # pays only at IRQ entries
    assert predict(quiet, ON).verdict == "present"
    with pytest.raises(TracekitError, match="no observable 'cyclictest'"):
        predict(brief, ON, "cyclictest")
    assert set(OBSERVABLES) == {RT_WAKEUPS, PROBE, PROBE_GUEST}


def test_which_cells_refute_which_model() -> None:
    """Verdicts held against predictions. On the rt CPU's cyclictest an mmu-on "present"
    refutes every model whose cost only issuers pay, and null: only the brief's model
    stays, and power-cycle beside it (6.12's hotplug power-cycles the guest CPU and runs
    its ALLE1: both predict "absent"; only 6.1's hotplug, a power cycle without ALLE1,
    tells them apart). On the probe (an issuer) 6.12's hotplug, which executes a local ALLE1 on the
    guest CPU and no ALLE1IS, refutes the model only ALLE1IS clears and the permanent
    one; on 6.1 the same hotplug executes nothing, so the brief's model predicts the
    effect stays; inconclusive cells and uncounted kernels decide nothing."""
    on, off, hotplug = CELLS["mmu-on"], CELLS["mmu-off"], CELLS["hotplug 6.12"]
    observed = [(on, "present"), (off, "absent"), (hotplug, "absent")]
    status = {n: check_model(load_model(n), observed).status for n in shipped_models()}
    consistent = {"brief-literal": "consistent", "power-cycle": "consistent"}
    assert status == {n: "refuted" for n in shipped_models()} | consistent
    refuting = check_model(load_model("holder-only"), observed).refuting
    assert [(c.prediction.condition, c.prediction.observable) for c in refuting] == [
        (on, RT_WAKEUPS)
    ]
    on_probe = {n: check_model(load_model(n), observed, PROBE).status for n in shipped_models()}
    assert on_probe == {
        "brief-literal": "consistent",
        "dose": "consistent",
        "holder-only": "refuted",
        "null": "refuted",
        "permanent-any-mode": "refuted",
        "power-cycle": "consistent",
        "rollover-only": "refuted",
    }
    refuting = check_model(load_model("rollover-only"), observed, PROBE).refuting
    assert [c.prediction.condition for c in refuting] == [hotplug]
    hotplug_61 = replace(hotplug, kernel=R61)
    assert predict(load_model("brief-literal"), hotplug_61).verdict == "present"
    on_61 = [(replace(on, kernel=R61), "present"), (hotplug_61, "present")]
    assert check_model(load_model("brief-literal"), on_61).status == "consistent"
    assert check_model(load_model("power-cycle"), on_61).refuting[0].prediction.condition == (
        hotplug_61
    )
    assert check_model(load_model("brief-literal"), [(hotplug_61, "inconclusive")]).status == (
        "untested"
    )
    sid = replace(hotplug, kernel="7.2.13+deb14-arm64")
    assert predict(load_model("brief-literal"), sid).verdict == "unknown"
    assert predict(load_model("brief-literal"), replace(on, knobs="mmu=0")).verdict == "absent"


def test_a_plan_is_predicted_before_it_runs() -> None:
    """Every cell of a plan gets a verdict from the model alone."""
    plan = parse_plan(
        {
            "matrix": {
                "kernel": ["bookworm", "trixie"],
                "guest": ["mmu-on", "mmu-off"],
                "after_guest": ["none", "hotplug", "rollover"],
            }
        }
    )
    got = {
        (p.condition.kernel, p.condition.variant, p.condition.after_guest): p.verdict
        for p in predict_plan(load_model("brief-literal"), plan)
    }
    assert got[("6.12", "mmu-on", "hotplug")] == "absent"
    assert got[("6.1", "mmu-on", "hotplug")] == "present"
    assert got[("6.1", "mmu-on", "rollover")] == "absent"
    assert got[("6.1", "mmu-off", "none")] == "absent"
    assert got[("6.12", "mmu-on", "none")] == "present"
    # The plan's placement and isolated rt CPU reach the prediction: holder-only's cost
    # lands on the probe only where it runs on the guest CPU, never on the rt CPU.
    holder = load_model("holder-only")
    verdicts = {
        o: {
            (p.condition.kernel, p.condition.variant, p.condition.after_guest): p.verdict
            for p in predict_plan(holder, plan, o)
        }[("6.12", "mmu-on", "none")]
        for o in (RT_WAKEUPS, PROBE, PROBE_GUEST)
    }
    assert verdicts == {RT_WAKEUPS: "absent", PROBE: "absent", PROBE_GUEST: "present"}
    placed = predict_plan(holder, plan)[0].condition
    assert (placed.placement, placed.isolation) == ("rt3/stress0-2/guest1", ISOLATED)


def test_cli_lists_models_and_predicts_a_plan(tmp_path: Path) -> None:
    """`tracekit simulate models` and `predict MODEL PLAN`; a bad model is one line."""
    runner = CliRunner()
    listed = runner.invoke(main, ["simulate", "models"])
    assert listed.exit_code == 0 and f"{load_model('null').label} [nothing]" in listed.stdout
    plan = tmp_path / "plan.toml"
    plan.write_text('[matrix]\nkernel = "trixie"\nafter_guest = ["none", "hotplug"]\n')
    said = runner.invoke(main, ["simulate", "predict", "brief-literal", str(plan)])
    assert said.exit_code == 0
    lines = said.stdout.splitlines()
    at = lines.index("mmu-on, after-guest none, KVM nvhe, 6.12:")
    assert lines[at + 1].startswith("  rt-wakeups: present (+300000 us per completion")
    assert lines[at + 2].startswith("  probe: present (+1000 us per completion")
    at = lines.index("mmu-on, after-guest hotplug, KVM nvhe, 6.12:")
    assert all(" absent (none); " in line for line in lines[at + 1 : at + 4])
    bad = runner.invoke(main, ["simulate", "predict", "nope", str(plan)])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "no model 'nope'" in bad.stderr


SHARES = ["inner", "inner", "inner", "inner", "outer", "non-shareable", "inner", "full-system"]


def test_broadcast_completions_follow_the_plugin_rule() -> None:
    """Two TLBI IS then one DSB ISH is one completion; a DSB NSH completes nothing; a
    DSB with no broadcast before it is none; another CPU's rows do not count."""
    rows = pl.DataFrame(
        {
            "ts_host": [1, 2, 3, 4, 5, 6, 7, 8],
            "cpu": [3, 3, 3, 3, 3, 3, 0, 3],
            "kind": ["tlbi", "tlbi", "dsb", "dsb", "tlbi", "dsb", "tlbi", "dsb"],
            "shareability": SHARES,
        }
    )
    assert broadcast_completions(rows, 3) == 2
    assert expected_increase_ns(50_000, 2, 4) == 25_000.0


def test_a_completion_spans_from_its_first_broadcast_tlbi_to_its_dsb() -> None:
    """The span starts at the first TLBI of the run the DSB completes, not the last."""
    spans = completion_spans(
        pl.DataFrame(
            {
                "ts_host": [1, 2, 3, 4, 5, 6, 7, 8],
                "cpu": [3, 3, 3, 3, 3, 3, 0, 3],
                "kind": ["tlbi", "tlbi", "dsb", "dsb", "tlbi", "dsb", "tlbi", "dsb"],
                "shareability": SHARES,
            }
        ),
        3,
    )
    assert spans.rows() == [(3, 2), (8, 3)]  # the NSH at 6 does not end the second run


def _calls(starts: list[int], durations: list[int]) -> pl.DataFrame:
    """Probe samples as read_probe_file gives them."""
    return pl.DataFrame({"timestamp_ns": starts, "duration_ns": durations})


def _rows(events: list[tuple[int, str]], cpu: int = 3) -> pl.DataFrame:
    """Ground-truth rows on `cpu` (trace clock ts), broadcast TLBIs and DSB ISH."""
    return pl.DataFrame(
        {
            "ts": [t for t, _ in events],
            "cpu": [cpu] * len(events),
            "kind": [k for _, k in events],
            "shareability": ["inner"] * len(events),
        }
    )


def test_each_probe_call_gets_the_completions_inside_it_and_their_spans() -> None:
    """Completions inside a call's [start, start + duration] are its own; one between
    the calls is nobody's; held_ns sums the spans."""
    events = [(110, "tlbi"), (120, "dsb"), (130, "tlbi"), (145, "dsb"), (170, "tlbi")]
    events += [(180, "dsb"), (210, "tlbi"), (270, "dsb")]
    calls = per_call(_calls([100, 200], [50, 80]), _rows(events), 3)
    assert calls.select("completions", "held_ns").rows() == [(2, 25), (1, 60)]


def test_the_probe_account_adds_up_to_the_observed_increase() -> None:
    """Intent = cost x completions per call; held = the median span growth; the rest is
    what is left of the median increase."""
    before = pl.DataFrame({"duration_ns": [100, 110, 120], "completions": [2] * 3})
    before = before.with_columns(held_ns=pl.lit(10))
    after = pl.DataFrame({"duration_ns": [2500, 2600, 2700], "completions": [2] * 3})
    after = after.with_columns(held_ns=pl.Series([300, 310, 320]))
    account = probe_account(before, after, 1000)
    assert (account.intended_ns, account.observed_ns, account.held_ns) == (2000, 2490, 300)
    assert account.rest_ns == 190 and account.calls == 3 and account.floor_ns == 2400
    assert "observed +0.00 ms per call (p50) = model's intent 0.00" in account.line()


def test_paying_windows_follow_the_creates_and_clears() -> None:
    """every: any CPU holding makes every CPU pay; holder: only the holder; a clear-all
    ends them all; a state still held at exit is open."""
    events = [
        SimEvent("create", 10, 1, 1, 0x4000015C),
        SimEvent("clear-local", 20, 1, 1, 0x41159B28),
        SimEvent("create", 30, 1, 1, 0x4000015C),
        SimEvent("create", 40, 2, 1, 0x4000015C),
        SimEvent("clear-all", 50, 0, 2, 0),
        SimEvent("create", 60, 2, 1, 0x4000015C),
    ]
    every = paying_windows(events, 3, scope_every=True)
    assert every[0] == every[1] == [(10, 20), (30, 50), (60, OPEN)]
    holder = paying_windows(events, 3, scope_every=False)
    assert holder == {0: [], 1: [(10, 20), (30, 50)], 2: [(40, 50), (60, OPEN)]}


def test_charged_completions_count_only_inside_the_windows() -> None:
    """Completions (the DSBs at 6, 11, 20, 26): one at a window's start counts, one at
    its end does not."""
    records = pl.DataFrame(
        {
            "ts_host": [5, 6, 10, 11, 19, 20, 25, 26],
            "vcpu": [0] * 8,
            "kind": ["tlbi", "dsb"] * 4,
            "shareability": ["inner"] * 8,
        }
    )
    assert charged_completions(records, {0: [(6, 26)]}) == {0: 3}


def test_a_bad_model_stops_vhost_run_before_any_boot(tmp_path: Path) -> None:
    """The model's mistakes come before the image is built or QEMU is looked for."""
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace('"holder"', '"all"'))
    config = VhostConfig(simulate=str(bad), out=tmp_path / "out")
    with pytest.raises(TracekitError, match=r"bad.toml: \[cost\] where: 'all'"):
        run_vhost(config, ["true"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kernel", [R61, R612])
def test_the_debug_series_actions_are_predicted_by_what_they_issue(kernel: str) -> None:
    """ALLE1 on the guest CPU clears the brief's model, on another CPU it does not, and
    VMALLS12E1IS clears none of the shipped models (the brief: it does not remove it); on
    6.1 and on 6.12, each with its series (reproducer/kpatch/6.1, 6.12)."""
    on = replace(ON, kernel=kernel)
    brief = load_model("brief-literal")
    said = {
        a: predict(brief, replace(on, after_guest=a)).verdict
        for a in ("tlbi:alle1@guest-cpu", "tlbi:alle1@other-cpu", "tlbi:vmalls12e1is@vmid")
    }
    assert said == {
        "tlbi:alle1@guest-cpu": "absent",
        "tlbi:alle1@other-cpu": "present",
        "tlbi:vmalls12e1is@vmid": "present",
    }
