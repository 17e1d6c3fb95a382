"""`run(VhostConfig, command) -> VhostResult`: one boot of the emulated host, one command.

The host side talks to /init through a private control share (the command script, a
fresh token, and back: the exit status, facts and the boot log), so the exit status
never depends on parsing the console.
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import tracekit
from tracekit.errors import TracekitError
from tracekit.vhost.cache import vhost_cache
from tracekit.vhost.console import ConsoleStream
from tracekit.vhost.image import VhostImage, require_image
from tracekit.vhost.kernels import KernelSpec, parse_kernel_spec
from tracekit.vhost.kvmmode import KVM_MODES, kernel_args_for, kvm_mode_from_log
from tracekit.vhost.process import Terminated, Timeout, run_pumping
from tracekit.vhost.qemu import (
    QEMU,
    ImageLoad,
    Share,
    check_page_size,
    cpu_option,
    image_load,
    qemu_argv,
    smp_option,
)

if TYPE_CHECKING:
    from tracekit.simulate.simlog import EntryCheck, SimLog

EMULATED_NOTE = (
    "emulated arm64 host (QEMU TCG): its timings are not hardware timings and "
    "say nothing about real cores"
)
CONSOLE_LOG = "vhost-console.log"
BOOT_DMESG = "vhost-boot-dmesg.txt"
# The kernel log after the command (/init writes it before powering off): with BOOT_DMESG,
# how often each CPU came up during the command, which the CPU-entry check counts.
DMESG = "vhost-dmesg.txt"
RUN_RECORD = "vhost-run.json"
# --ground-truth: the plugin's log, the boot's kallsyms and the clock markers, in --out.
# (No tracekit.ingest import at module level: the emulated host has no polars, and its
# `python3 -m tracekit` imports this module.)
GROUND_TRUTH_LOG = "vhost-groundtruth.tkgt"
KALLSYMS = "vhost-kallsyms.txt"
MARKERS = "vhost-gtmark.txt"
# The boot's /proc/iomem: its "Kernel code" start checks the Image's load address the
# simulation's CPU entry is computed from (tracekit.simulate.simlog.cpu_entry_mistakes;
# checked by the sim boot's test, not yet by the run itself).
IOMEM = "vhost-iomem.txt"
# What a bundle made in such a boot receives, in BUNDLE/groundtruth/, and how it is named.
GT_BUNDLE_DIR = "groundtruth"
# --simulate: the model as given, the plugin's form of it and the plugin's log of it.
SIM_SOURCE = "vhost-simulate.toml"
SIM_FORM = "vhost-simulate-model.txt"
SIM_LOG = "vhost-simulate.txt"
# `vhost run`'s status when the command succeeded but a cpu-on model's power-ons were not
# watched where the kernel enters (docs/vhost.md): not the command's own failure.
SIMULATION_NOT_APPLIED = 3
GT_FILES = (
    GROUND_TRUTH_LOG,
    KALLSYMS,
    IOMEM,
    MARKERS,
    BOOT_DMESG,
    DMESG,
    RUN_RECORD,
    SIM_SOURCE,
    SIM_FORM,
    SIM_LOG,
)
GT_ADDED_BY = "tracekit vhost run --ground-truth"
GT_NOTE = (
    "emulated ground truth: QEMU TCG plugin log of the whole boot and what aligns it "
    "(docs/tables.md); what the emulated CPUs executed, not hardware"
)
# The marker helper as the emulated host sees the checkout (cross-built by make).
GTMARK = "reproducer/build/gtmark"


@dataclass(frozen=True)
class VhostConfig:
    """How to boot the emulated host; defaults are the brief's main case (nVHE, A76)."""

    kvm_mode: str = "nvhe"
    kernel: str = "bookworm"
    cpu_model: str = "cortex-a76"
    smp: int = 4
    clusters: int = 1
    memory_mb: int = 2048
    append: str = ""
    timeout_s: float = 600.0
    share: Path | None = None
    out: Path | None = None
    # Load the ground-truth TCG plugin: every TLBI/DSB/IC IALLU* logged into --out.
    ground_truth: bool = False
    # A simulated mechanism (a shipped model's name or a .toml path, docs/simulate.md):
    # the plugin applies it, so it implies ground_truth.
    simulate: str | None = None


@dataclass
class VhostResult:
    """What one run did: the command's status, and what the kernel really was."""

    exit_status: int
    kvm_mode: str
    kvm_mode_requested: str
    kernel: str
    kernel_release: str
    dev_kvm: bool
    out_dir: Path
    console_log: Path
    boot_dmesg: Path
    notes: list[str] = field(default_factory=list)
    # Wall seconds from starting QEMU to the command's start (boot + /init), this machine.
    boot_s: float | None = None
    # The plugin's log (with --ground-truth), and what its header says of it.
    ground_truth_log: Path | None = None


def project_tree() -> Path:
    """The directory holding the `tracekit` package (the checkout, when editable)."""
    return Path(tracekit.__file__).resolve().parent.parent


def _validate(config: VhostConfig, command: list[str]) -> KernelSpec:
    """Check the config before anything is built or booted; return the kernel spec."""
    if not command:
        raise TracekitError(
            "no command given: put it after `--`, e.g. `tracekit vhost run -- uname -a`"
        )
    if config.kvm_mode not in KVM_MODES:
        raise TracekitError(
            f"unknown KVM mode {config.kvm_mode!r}; use one of: {', '.join(KVM_MODES)}"
        )
    if config.memory_mb < 512:
        raise TracekitError("--memory must be at least 512 MB: the initramfs alone needs ~400 MB")
    if config.timeout_s <= 0:
        raise TracekitError("--timeout must be a positive number of seconds")
    if config.share is not None and not config.share.is_dir():
        raise TracekitError(f"--share {config.share}: not a directory")
    spec = parse_kernel_spec(config.kernel)
    cpu_option(config.cpu_model)
    check_page_size(config.cpu_model, spec.info.page_kb, spec.name)
    smp_option(config.smp, config.clusters)
    if shutil.which(QEMU) is None:
        raise TracekitError(f"{QEMU} not found: install it with `apt-get install qemu-system-arm`")
    if config.simulate:
        from tracekit.simulate.model import load_model

        load_model(config.simulate)  # its mistakes before anything is built or booted
    if config.ground_truth and not (project_tree() / GTMARK).is_file():
        raise TracekitError(
            f"--ground-truth needs the marker helper {GTMARK}: build it with "
            "`make -C reproducer CROSS_COMPILE=aarch64-linux-gnu-`"
        )
    return spec


def _refuse_unwatchable_entry(config: VhostConfig, image: VhostImage) -> None:
    """Refuse, before the boot, a model that clears by cpu-on on a kernel whose kallsyms
    will not list the CPU entry the plugin looks for there (tracekit's trixie:tk-ci):
    it could never clear. Known before the boot only for kernels tracekit built (their
    System.map and .config); on the others the run's own check says so after it."""
    from tracekit.simulate.model import CPU_ENTRY_SYMBOL, load_model
    from tracekit.symbols.kallsyms import kallsyms_omission

    build = image.build_dir()
    if not config.simulate or build is None or not load_model(config.simulate).clears_by("cpu-on"):
        return
    try:
        system_map = (build / "System.map").read_text(errors="replace")
        all_symbols = "CONFIG_KALLSYMS_ALL=y" in (build / ".config").read_text().splitlines()
    except OSError:
        return  # the build tree is gone: the run's check still tells
    why = kallsyms_omission(system_map, CPU_ENTRY_SYMBOL, all_symbols)
    if why is not None:
        raise TracekitError(
            f"--simulate {config.simulate} clears by cpu-on, but {image.spec.name}'s kallsyms "
            f"will not list {CPU_ENTRY_SYMBOL}, where the plugin watches for power-ons: {why} "
            "(6.12 and 7.2 put the idmap text in .rodata.text); use --kernel bookworm, "
            "trixie or bookworm:tk-ci, or a model that does not clear by cpu-on"
        )


def _ground_truth_script(command: list[str]) -> list[str]:
    """The command between two rounds of clock markers, after saving this boot's kallsyms."""
    gtmark = f"/tracekit/{GTMARK}"
    return [
        f"cat /proc/kallsyms > /out/{KALLSYMS}",
        f"cat /proc/iomem > /out/{IOMEM}",
        f"{gtmark} > /out/{MARKERS}",
        shlex.join(command),
        "status=$?",
        f"{gtmark} >> /out/{MARKERS}",
        "exit $status",
    ]


def _write_control(
    ctl: Path,
    spec: KernelSpec,
    command: list[str],
    ground_truth: bool = False,
    simulated: str | None = None,
) -> str:
    """Put the command script and a fresh marker token on the control share.

    The script exports what the kernel is and, without KVM, why, so tools inside (the
    collector's preflight, the VMM's wrapper) can explain a missing /dev/kvm; under a
    simulated mechanism, its name@hash, which the collector records in the manifest.
    """
    token = secrets.token_hex(8)
    (ctl / "token").write_text(token + "\n")
    exports = {"TRACEKIT_VHOST_KERNEL": spec.name}
    if ground_truth:
        # The collector records it (host fact groundtruth_plugin): a condition field.
        exports["TRACEKIT_VHOST_GROUND_TRUTH"] = "1"
    if simulated:
        exports["TRACEKIT_SIMULATED"] = simulated
    if not spec.has_kvm:
        exports["TRACEKIT_VHOST_NO_KVM"] = f"{spec.info.note}; guests cannot run on {spec.name}"
    lines = [f"export {key}={shlex.quote(value)}" for key, value in exports.items()]
    body = _ground_truth_script(command) if ground_truth else [f"exec {shlex.join(command)}"]
    (ctl / "command.sh").write_text("\n".join([*lines, *body]) + "\n")
    return token


def _shares(ctl: Path, out: Path, share: Path | None) -> list[Share]:
    """Control (rw), project tree (ro), output (rw) and the optional user share."""
    # Python's bytecode, kept across boots: the rootfs ships no .pyc (Debian compiles
    # them in postinst, which is not run) and compiling under TCG costs ~20 s a start.
    pycache = vhost_cache() / "pycache"
    pycache.mkdir(parents=True, exist_ok=True)
    shares = [
        Share("tkctl", ctl),
        Share("tkproject", project_tree(), readonly=True),
        Share("tkout", out),
        Share("tkpyc", pycache),
    ]
    if share is not None:
        shares.append(Share("tkshare", share.resolve()))
    return shares


def _kernel_args(config: VhostConfig, spec: KernelSpec) -> list[str]:
    """The KVM mode (where the kernel has KVM), the share flag, then the user's args."""
    args = kernel_args_for(config.kvm_mode) if spec.has_kvm else []
    args += spec.info.kernel_args
    if config.share is not None:
        args.append("tracekit.share=1")
    return [*args, *shlex.split(config.append)]


def _read_facts(ctl: Path) -> dict[str, str]:
    """The key=value facts /init wrote about the booted kernel."""
    facts_file = ctl / "facts"
    if not facts_file.is_file():
        return {}
    return dict(line.split("=", 1) for line in facts_file.read_text().splitlines() if "=" in line)


def _notes(config: VhostConfig, spec: KernelSpec, mode: str, dev_kvm: bool) -> list[str]:
    """Plain statements about this run that every report must carry."""
    notes = [EMULATED_NOTE]
    if not spec.has_kvm:
        notes.append(
            f"kernel {spec.name}: {spec.info.note}; guests cannot run there (/dev/kvm is absent)"
        )
    elif mode != config.kvm_mode:
        notes.append(
            f"KVM initialised in {mode} mode, not the {config.kvm_mode} asked for "
            f"(CPU model {config.cpu_model})"
        )
    if spec.has_kvm and not dev_kvm:
        notes.append("/dev/kvm is absent: anything that runs a guest will fail")
    return notes


def run(
    config: VhostConfig,
    command: list[str],
    *,
    on_output: Callable[[str], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> VhostResult:
    """Boot the emulated host, run `command` as root inside, and report what happened."""
    emit = on_output or (lambda line: print(line, flush=True))
    say = progress or (lambda message: print(f"vhost: {message}", file=sys.stderr, flush=True))
    if config.simulate and not config.ground_truth:
        config = replace(config, ground_truth=True)  # the plugin applies the model
    spec = _validate(config, command)
    image = require_image(spec, say)
    _refuse_unwatchable_entry(config, image)
    out = (config.out or Path(tempfile.mkdtemp(prefix="tracekit-vhost-out-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tracekit-vhost-ctl-") as ctl_name:
        ctl = Path(ctl_name)
        status, boot_s = _boot(config, spec, image, command, ctl, out, emit, say)
        facts = _read_facts(ctl)
        boot_log = (
            (ctl / "boot-dmesg.txt").read_text(errors="replace")
            if (ctl / "boot-dmesg.txt").is_file()
            else ""
        )
    (out / BOOT_DMESG).write_text(boot_log)
    mode = kvm_mode_from_log(boot_log)
    dev_kvm = facts.get("dev_kvm") == "yes"
    result = VhostResult(
        exit_status=status,
        kvm_mode=mode,
        kvm_mode_requested=config.kvm_mode,
        kernel=spec.name,
        kernel_release=facts.get("kernel_release", image.kernel_release),
        dev_kvm=dev_kvm,
        out_dir=out,
        console_log=out / CONSOLE_LOG,
        boot_dmesg=out / BOOT_DMESG,
        notes=_notes(config, spec, mode, dev_kvm),
        boot_s=boot_s,
        ground_truth_log=out / GROUND_TRUTH_LOG if config.ground_truth else None,
    )
    if config.ground_truth:
        result.notes += [ground_truth_note(out / GROUND_TRUTH_LOG), _alignment_note(out, mode)]
    if config.simulate:
        result.notes += _simulation_notes(out)
        result.exit_status = _checked_cpu_entry(out, result)
    _record(result, config, command)
    if config.ground_truth:
        added = add_to_bundles(out)
        if added:
            names = ", ".join(str(root.relative_to(out)) for root in added)
            result.notes.append(f"ground truth added to the bundle(s) {names} ({GT_BUNDLE_DIR}/)")
            _record(result, config, command)
    return result


def add_to_bundles(out: Path) -> list[Path]:
    """Add this boot's ground truth to every bundle the command left under `out`.

    From outside the emulated host, after the collection (the collector inside cannot see
    QEMU's log): the files go to BUNDLE/groundtruth/ through tracekit.bundle.add_file,
    each recorded in the manifest with its checksum and what it is. The log covers the
    whole boot; a run's rows are those inside the run's start and end in the manifest.
    """
    return [root for root in bundles_under(out) if add_ground_truth(out, root)]


def bundles_under(out: Path) -> list[Path]:
    """The bundles (a readable manifest) the command left under `out`, in path order."""
    from tracekit.bundle import MANIFEST, read_manifest

    found = []
    for manifest in sorted(out.rglob(MANIFEST)):
        root = manifest.parent
        if any(part.startswith(".") for part in root.relative_to(out).parts):
            continue  # ingest caches keep a manifest.json of their own
        try:
            read_manifest(root)
        except TracekitError:
            continue
        found.append(root)
    return found


def add_ground_truth(out: Path, bundle: Path) -> bool:
    """Add the ground-truth files of the boot whose --out is `out` to one bundle.

    False (nothing added) if the bundle has them already: nothing is replaced.
    """
    from tracekit.bundle import add_file

    if (bundle / GT_BUNDLE_DIR).exists():
        return False
    for name in GT_FILES:
        if (out / name).is_file():
            add_file(bundle, f"{GT_BUNDLE_DIR}/{name}", out / name, GT_ADDED_BY, GT_NOTE)
    return True


def _plugin_option(out: Path, say: Callable[[str], None], simulated: bool) -> list[str]:
    """-plugin loading the ground-truth plugin (built first if needed), logging into out;
    with the simulation's plugin form and log when `simulated` (written before)."""
    from tracekit.vhost.groundtruth import build_plugin, plugin_argv

    sim = (out / SIM_FORM, out / SIM_LOG) if simulated else None
    return plugin_argv(build_plugin(say), out / GROUND_TRUTH_LOG, sim=sim)


def prepare_simulation(config: VhostConfig, out: Path, kernel: Path | None = None) -> str | None:
    """Write the model given and its plugin form into out; its name@hash (None: no model).

    `kernel`: the Image QEMU loads; from its header, where the kernel's CPU entry after
    CPU_ON will be (the plugin logs every power-on there; `cpu-on` models clear by it)."""
    from tracekit.simulate.model import load_model, model_source, plugin_form

    if not config.simulate:
        return None
    model = load_model(config.simulate)
    (out / SIM_SOURCE).write_text(model_source(config.simulate))
    load = _entry_load(kernel, model.clears_by("cpu-on"))
    form = plugin_form(model, config.kvm_mode, out.resolve() / KALLSYMS, _isolated(config), load)
    (out / SIM_FORM).write_text(form)
    (out / SIM_LOG).unlink(missing_ok=True)
    return model.label


def _entry_load(kernel: Path | None, needed: bool) -> ImageLoad | None:
    """The Image's load address for the CPU entry: only a cpu-on model needs it, so for
    the others a kernel that is not a plain Image (e.g. gzip'd) only leaves the power-ons
    unwatched."""
    if kernel is None:
        return None
    try:
        return _image_load(kernel)
    except TracekitError:
        if needed:
            raise
        return None


def _image_load(kernel: Path) -> ImageLoad:
    """Where QEMU loads this kernel Image (its _text and _stext), from its headers."""
    try:
        with kernel.open("rb") as image:
            header = image.read(4096)
    except OSError as exc:
        raise TracekitError(f"cannot read the kernel {kernel}: {exc.strerror}") from None
    return image_load(header)


def _isolated(config: VhostConfig) -> list[int]:
    """The CPUs the emulated host's extra kernel arguments isolate (isolcpus=, its flags
    such as 'domain,' left out): a model's `responders = "isolated"`."""
    from tracekit.host.preflight import _cpu_list, parse_cmdline

    return _cpu_list(parse_cmdline(config.append).get("isolcpus", ""))


def _simulation_notes(out: Path) -> list[str]:
    """What the simulation did and where its delays landed, or why that is unknown."""
    from tracekit.simulate.model import SIMULATED_NOTE
    from tracekit.simulate.simlog import read_sim_log

    try:
        summary = read_sim_log(out / SIM_LOG).summary()
    except TracekitError as exc:
        summary = f"simulation log unreadable: {exc}"
    return [SIMULATED_NOTE, summary]


def cpu_entry_check(directory: Path, log: SimLog | None = None) -> EntryCheck | None:
    """Whether the plugin watched the boot's real CPU entry and saw each power-on there,
    from the files `vhost run` leaves in --out (and copies into a bundle's groundtruth/):
    the plugin's form and log (`log`: that log, already read), the boot's /proc/iomem and
    kallsyms, and its kernel log before and after the command. None: the form asked for
    no entry."""
    from tracekit.simulate.model import CPU_ENTRY_SYMBOL
    from tracekit.simulate.simlog import (
        CODE_START_SYMBOLS,
        INIT_BEGIN,
        EntryCheck,
        cpu_entry_mistakes,
        cpu_entry_warnings,
        kernel_power_ons,
        power_on_mistakes,
        power_on_warnings,
        read_sim_log,
    )
    from tracekit.symbols.kallsyms import parse_line

    try:
        form = (directory / SIM_FORM).read_text().splitlines()
    except OSError:
        form = []
    if not any(line.startswith("cpu-entry ") for line in form):
        return None
    cpu_on = "clear cpu-on" in form
    try:
        log = log or read_sim_log(directory / SIM_LOG)
    except TracekitError as exc:
        return EntryCheck(cpu_on, [f"the plugin's log is unreadable: {exc}"], [])
    try:
        iomem = (directory / IOMEM).read_text()
        kallsyms = (directory / KALLSYMS).read_text(errors="replace")
    except OSError as exc:
        return EntryCheck(
            cpu_on, [f"the boot's /proc/iomem or kallsyms is unreadable: {exc.strerror}"], []
        )
    # Line by line, not through a SymbolTable: that keeps one name per address, and 6.1's
    # _stext shares its address with the first IRQ handler listed.
    wanted = {CPU_ENTRY_SYMBOL, INIT_BEGIN, *CODE_START_SYMBOLS}
    symbols: dict[str, int] = {}
    for line in kallsyms.splitlines():  # the first of each name, as the plugin takes it
        symbol = parse_line(line)
        if symbol is not None and symbol.name in wanted:
            symbols.setdefault(symbol.name, symbol.address)
    mistakes = cpu_entry_mistakes(log, iomem, symbols)
    warnings = cpu_entry_warnings(log, symbols)
    if mistakes:
        return EntryCheck(cpu_on, mistakes, warnings)
    # Watched in the right place: did it see there what the kernel did?
    before, after = (_text_or_none(directory / name) for name in (BOOT_DMESG, DMESG))
    uncounted = power_on_warnings(log, before, after)
    mistakes = power_on_mistakes(log, before, after)
    counted = None if uncounted or mistakes else kernel_power_ons(before or "", after or "")
    return EntryCheck(cpu_on, mistakes, warnings + uncounted, counted)


def _text_or_none(path: Path) -> str | None:
    """A text file's contents, or None when it cannot be read."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _checked_cpu_entry(out: Path, result: VhostResult) -> int:
    """The run's exit status once the CPU entry is checked: a note either way, and
    SIMULATION_NOT_APPLIED where a model clears by cpu-on and the plugin did not watch
    where the kernel enters (its clearing never happened as the model says)."""
    check = cpu_entry_check(out)
    if check is None:
        return result.exit_status
    result.notes += [f"simulation: {line}" for line in check.lines()]
    if check.mistakes and check.cpu_on and result.exit_status == 0:
        result.notes.append(
            f"exit status {SIMULATION_NOT_APPLIED}: the model clears by cpu-on, and its "
            "power-ons were not seen where the kernel enters (its bundles say so too)"
        )
        return SIMULATION_NOT_APPLIED
    return result.exit_status


def ground_truth_note(log: Path) -> str:
    """What the plugin's log holds, or why there is none: one line for every report."""
    from tracekit.ingest.groundtruth import read_header

    if not log.is_file():
        return f"ground truth: QEMU left no plugin log ({log.name} is missing)"
    header = read_header(log)
    lost = f"; {header.not_written} NOT written (log full)" if header.not_written else ""
    closed = "" if header.complete else "; log not closed (QEMU did not exit normally)"
    untracked = header.untracked_note()
    return (
        f"ground truth (QEMU TCG plugin, emulated, not hardware): {header.written} records "
        f"in {log.name}, bound {header.capacity} (of which {header.marker_capacity} for "
        f"markers){lost}{closed}{'; ' + untracked if untracked else ''}"
    )


def _alignment_note(out: Path, kvm_mode: str) -> str:
    """The clock fit of this boot's markers, gtmark's and the sync markers of every bundle
    left under `out` (and the vCPU map check), or why it failed."""
    from tracekit.ingest.groundtruth import load_ground_truth, sync_lines_of

    try:
        truth = load_ground_truth(out, kvm_mode, sync=sync_lines_of(bundles_under(out)))
    except TracekitError as exc:
        return f"ground truth NOT aligned to the trace clock: {exc}"
    cpus = ", ".join(f"{v}->{c}" for v, c in sorted(truth.vcpu_to_cpu.items()))
    return f"ground truth: {truth.fit.summary()}; vCPU->CPU {cpus} (checked by markers)"


def _boot(
    config: VhostConfig,
    spec: KernelSpec,
    image: VhostImage,
    command: list[str],
    ctl: Path,
    out: Path,
    emit: Callable[[str], None],
    say: Callable[[str], None],
) -> tuple[int, float | None]:
    """Run QEMU to completion; return the command's status and the boot time, or raise."""
    simulated = prepare_simulation(config, out, image.kernel)
    token = _write_control(ctl, spec, command, config.ground_truth, simulated)
    plugin = _plugin_option(out, say, bool(simulated)) if config.ground_truth else []
    argv = (
        qemu_argv(
            image.kernel,
            image.initramfs,
            cpu_model=config.cpu_model,
            cpus=config.smp,
            clusters=config.clusters,
            memory_mb=config.memory_mb,
            kernel_args=_kernel_args(config, spec),
            shares=_shares(ctl, out, config.share),
        )
        + plugin
    )
    kvm = (
        f"KVM mode {config.kvm_mode} asked"
        if spec.has_kvm
        else (f"NO KVM: {spec.info.note}, guests cannot run there")
    )
    say(
        f"booting {spec.name} ({image.kernel_release}), {config.cpu_model} x{config.smp}, "
        f"{kvm}; output in {out}"
    )
    with (out / CONSOLE_LOG).open("wb") as log:
        console = ConsoleStream(token, emit, log)
        started = time.monotonic()
        try:
            qemu_status = run_pumping(argv, console.feed, config.timeout_s)
        except Timeout:
            raise TracekitError(
                f"the emulated host did not finish within {config.timeout_s:g} s and was "
                f"stopped (QEMU killed); raise --timeout, or see {out / CONSOLE_LOG}",
                exit_code=124,
            ) from None
        except Terminated:
            raise TracekitError("terminated by SIGTERM; QEMU was stopped", 143) from None
        finally:
            console.finish()
    boot_s = None if console.started_at is None else round(console.started_at - started, 1)
    status_file = ctl / "status"
    if status_file.is_file():
        return int(status_file.read_text().strip()), boot_s
    if console.status is not None:
        return console.status, boot_s
    last = next((line for line in reversed(console.tail) if line.strip()), "no output")
    raise TracekitError(
        f"the emulated host stopped (QEMU exit {qemu_status}) before the command finished; "
        f"last console line: {last.strip()!r}; full log: {out / CONSOLE_LOG}"
    )


def _record(result: VhostResult, config: VhostConfig, command: list[str]) -> None:
    """Save the run's facts next to its output, for collectors and reports."""
    record = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "command": command,
        "emulated": True,
        **{k: str(v) if isinstance(v, Path) else v for k, v in asdict(result).items()},
    }
    (result.out_dir / RUN_RECORD).write_text(json.dumps(record, indent=1) + "\n")
