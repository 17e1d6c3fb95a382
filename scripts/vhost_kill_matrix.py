"""`tracekit collect` killed inside the emulated arm64 host: what is left, and what undoes it.

Run from the repository root, under the machine's vhost lock (it boots twice):

    python scripts/vhost_kill_matrix.py --out DIR [--minutes M] [--boot-only] [CELL...]
    python scripts/vhost_kill_matrix.py --tabulate --out DIR   # after --boot-only, unlocked
    python scripts/vhost_kill_matrix.py --tabulate --out DIR --earlier DIR1 ...  # runs together

Boot 1 (nVHE, 4 x cortex-a76, two clusters, CPU 3 isolated: the brief's main case, real
KVM, kprobes, CPU hotplug) runs one cell per (signal, point): a `tracekit collect` is
sent SIGINT, SIGTERM or SIGKILL during preflight (its one-shot VMID kprobe and instance
in place), a quiet run (stress-ng and cyclictest running), a traced run (instance,
kprobes, tracing on), the after-guest CPU hotplug and a TLBI probe slot. The host's
state (tracefs settings top level and in instances, instances, kprobe/uprobe events,
mounts, CPUs online, IRQ affinity, cpufreq governors, tool processes, KVM VMs, journals,
tracekit's files in $TMPDIR) is compared with the state before, right after the run
ended and after the recovery: none for SIGINT/SIGTERM, the next `collect` start (or
`tracekit cleanup`) for SIGKILL. The last cell is a power cut: QEMU is killed during a
traced run whose bundle and journal are on a share that stands for the board's disk;
boot 2, on the same disk state, compares the fresh kernel's state with boot 1's and runs
`tracekit cleanup`. Every bundle left is then checked here with `tracekit verify` and
`tracekit report`: complete, or INCOMPLETE and read without a traceback.

The cells run most needed first (SIGKILL, whose leftovers only the journal can undo, then
SIGTERM, then SIGINT, which takes SIGTERM's path: cleanup.STOP_SIGNALS); with
`--minutes M` (the whole run's time, both boots) boot 1 starts a cell only if its
estimate (CELL_S, scaled by what earlier cells took) fits in its share, and the power cut
and boot 2 still run: the table says which cells were not run. The power cut's
collect keeps its journal on the disk ($TRACEKIT_JOURNAL_DIR), so boot 2's `tracekit
cleanup` meets a journal of an earlier boot, as a board with journals on disk would.

Inside the emulated host the same file runs the cells (`inside CELL...`), which is how
tests/test_host_kill_vhost.py puts two of them into an existing CI boot.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's tracekit

from tracekit.bundle import bundle_problems, read_manifest
from tracekit.host.journal import JOURNAL_DIR_ENV, journal_dir
from tracekit.host.procs import live_processes
from tracekit.host.tracefs import snapshot
from tracekit.host.tracefsio import tracefs_mounts

TRACEFS = Path("/sys/kernel/tracing")
CPU_ONLINE = Path("/sys/devices/system/cpu/online")
KVM_DEBUGFS = Path("/sys/kernel/debug/kvm")
# The processes collect starts (the VMM and the probe are the reproducer's).
TOOLS = ("stress-ng", "cyclictest", "vmm", "tlbiprobe", "perf", "trace-cmd")
SIGNALS = {"int": signal.SIGINT, "term": signal.SIGTERM, "kill": signal.SIGKILL}
POINTS = ("preflight", "quiet", "traced", "probe", "hotplug")  # in collect's order
# What a cell takes to reach its point and end, in s (the main case's CI boot: the probe
# slots come after the quiet run, the hotplug after the guest; only the traced cells' collect
# has a traced run, ~45 s), and a SIGKILL's recovery (the next start's preflight). Scaled in
# a run by what its cells took.
CELL_S = {"preflight": 60, "quiet": 90, "traced": 150, "probe": 195, "hotplug": 285}
RECOVERY_S = 60
# The brief's main case on 4 CPUs; `--roles` gives a 2-CPU boot its own.
MAIN_ROLES = "--rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1"
POWERCUT_LINE = "POWERCUT-NOW"
# Where a boot's cells are saved, one JSON line each, in the directory it runs from.
CELLS_JSON = Path("cells.json")
# How long the collect is left to run once its point is reached, before the signal.
# The probe runs 2 s from its argv record: none, the state's scan before the signal is long.
SETTLE_S = {"preflight": 2.0, "quiet": 1.0, "traced": 1.5, "hotplug": 0.0, "probe": 0.0}


# --- the host's state, inside the emulated host -------------------------------------------


def host_state() -> dict[str, Any]:
    """Everything collect may change on the host, as plain data (see the module docstring)."""
    instances = [p.name for p in (TRACEFS / "instances").iterdir() if p.is_dir()]
    return {
        "tracefs": snapshot(TRACEFS, instances),
        "kprobe_events": (TRACEFS / "kprobe_events").read_text().splitlines(),
        "uprobe_events": _read_lines(TRACEFS / "uprobe_events"),
        "mounts": sorted(str(p) for p in tracefs_mounts()),
        "cpus_online": CPU_ONLINE.read_text().strip(),
        "irq_affinity": _irq_affinity(),
        "cpufreq": _governors(),
        "processes": _tool_processes(),
        "kvm_vms": sorted(p.name for p in KVM_DEBUGFS.glob("*-*")) if KVM_DEBUGFS.is_dir() else [],
        "journals": sorted(p.name for p in journal_dir().glob("*"))
        if journal_dir().is_dir()
        else [],
        "tmp_files": _tmp_files(),
    }


def _read_lines(path: Path) -> list[str]:
    """A file's lines, or none where the kernel has no such file."""
    return path.read_text().splitlines() if path.exists() else []


def _irq_affinity() -> dict[str, str]:
    """Each IRQ's affinity as set (smp_affinity_list), which collect never changes."""
    found = {}
    for path in Path("/proc/irq").glob("*/smp_affinity_list"):
        try:
            found[path.parent.name] = path.read_text().strip()
        except OSError:
            continue
    return dict(sorted(found.items()))


def _governors() -> dict[str, str]:
    """Each cpufreq policy's governor (none in QEMU's virt machine: no cpufreq)."""
    policies = Path("/sys/devices/system/cpu/cpufreq").glob("policy*/scaling_governor")
    return {p.parent.name: p.read_text().strip() for p in sorted(policies)}


def _tool_processes() -> list[str]:
    """Live processes running one of collect's tools, as 'name pid'."""
    return sorted(f"{name} {pid}" for pid, name, _ in live_processes() if name.startswith(TOOLS))


def _tmp_files() -> list[str]:
    """tracekit's and its tools' files in $TMPDIR (a board's /tmp may be on disk)."""
    tmp = Path(os.environ.get("TMPDIR") or "/tmp")
    names = ("tracekit-", "tmp-stress-ng", "stress-ng")
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(names))


def differences(before: dict[str, Any], now: dict[str, Any]) -> dict[str, list[str]]:
    """What differs from `before`, by kind: the keys of the flattened state that changed."""
    flat_before, flat_now = _flat(before), _flat(now)
    changed: dict[str, list[str]] = {}
    for key in sorted(flat_before.keys() | flat_now.keys()):
        if flat_before.get(key) != flat_now.get(key):
            kind = key.split("/")[0]
            if kind == "tracefs":
                kind = "instances" if key.split("/")[1].startswith("instance") else "settings"
            changed.setdefault(kind, []).append(f"{key}: {flat_now.get(key)!r}")
    return changed


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as path -> leaf (lists are leaves)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}/{key}" if prefix else str(key)))
    return out


def in_place() -> list[str]:
    """What tracekit has in place on the host at this moment (for the 'at signal' column)."""
    instances = [p.name for p in (TRACEFS / "instances").iterdir() if p.name.startswith("tracekit")]
    probes = [line for line in _read_lines(TRACEFS / "kprobe_events") if "tracekit" in line]
    parts = [f"instances {len(instances)}", f"kprobes {len(probes)}"]
    parts.append(f"tools {len(_tool_processes())}")
    parts.append(f"cpus {CPU_ONLINE.read_text().strip()}")
    return parts


# --- one cell: start collect, reach the point, signal, then look --------------------------


@dataclass
class Collect:
    """A running `tracekit collect` whose output lines are gathered as they come."""

    proc: subprocess.Popen[str]
    lines: list[str]
    bundle: Path

    @classmethod
    def start(cls, roles: str, bundle: Path, traced: bool = True) -> Collect:
        """Start the short main-case collect: 1 quiet and (`traced`) 1 traced run a phase,
        hotplug. Without the traced runs the probe slots and the hotplug come ~45 s
        sooner; the instance and kprobes are in place all the same, and the hotplug's run
        is traced either way (a guest and an after-guest run always are)."""
        argv = [sys.executable, "-m", "tracekit", "collect", *roles.split()]
        argv += ["--runs", "1", "--traced-runs", "1" if traced else "0", "--duration", "2"]
        argv += ["--after-guest", "hotplug", "--allow-dirty", "-o", str(bundle)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        collect = cls(proc, [], bundle)
        threading.Thread(target=collect._gather, daemon=True).start()
        return collect

    def _gather(self) -> None:
        """Read the output to its end (the reader thread)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def said(self, text: str) -> bool:
        """Whether a line of its output so far contains `text`."""
        return any(text in line for line in list(self.lines))

    def finished(self) -> bool:
        """Whether the collect has exited."""
        return self.proc.poll() is not None


def wait_for(condition: Callable[[], bool], collect: Collect, timeout: float) -> bool:
    """Poll `condition` every 10 ms until true; False if the collect ended or time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not collect.finished():
        if condition():
            return True
        time.sleep(0.01)
    return False


def reach(point: str, collect: Collect) -> str:
    """Wait until the collect is at `point`; what was seen (or why not)."""
    started = {
        "preflight": lambda: _state_probe() or _journal_of(collect),
        "quiet": lambda: (
            collect.said("before-quiet-0")
            and any(p.startswith("stress-ng") for p in _tool_processes())
        ),
        "traced": lambda: collect.said("before-traced-0") and _tracing(),
        "hotplug": lambda: collect.said("after-guest-hotplug"),
        "probe": lambda: collect.said("before-probe-page") and _probe_spawned(collect),
    }[point]
    # Preflight is short: once its lines are printed, it is over.
    missed = (lambda: collect.said("host: ")) if point == "preflight" else (lambda: False)
    seen: list[bool] = []  # the point as first seen: a short one may be over on a 2nd look

    def arrived() -> bool:
        """The point is reached (noted), or missed."""
        if started():
            seen.append(True)
            return True
        return missed()

    if not wait_for(arrived, collect, 900):
        return "not reached"
    if not seen:
        return "missed (preflight over)"
    if point == "hotplug":
        # Wait for the CPU to go offline: the signal then lands with it offline.
        baseline = MAIN_ONLINE.get("online", "")
        offline = wait_for(lambda: CPU_ONLINE.read_text().strip() != baseline, collect, 3)
        return "cpu offline" if offline else "hotplug started"
    time.sleep(SETTLE_S[point])
    return "reached"


def _probe_spawned(collect: Collect) -> bool:
    """A probe slot's tlbiprobe is starting: its argv record is written just before it.

    Not /proc: in the loaded emulated host a scan of every process took longer than the
    probe's 2 s, so the 2026-12-02 matrix's probe cells saw it as it ended and signalled
    between slots (with no tlbiprobe running).
    """
    return any((collect.bundle / "runs").glob("before-probe-page-*/probe.json.argv"))


def _journal_of(collect: Collect) -> bool:
    """The collect's journal exists: it is in preflight (tracefs, leftovers, host facts)."""
    return any(journal_dir().glob(f"{collect.proc.pid}-*.journal"))


def _state_probe() -> bool:
    """Preflight's one-shot VMID kprobe (and then its instance) is in place."""
    if any("tracekit" in line for line in _read_lines(TRACEFS / "kprobe_events")):
        return True
    return any(p.name.endswith("-state") for p in (TRACEFS / "instances").iterdir())


# The online CPUs before the matrix (set by run_cells; the hotplug trigger compares).
MAIN_ONLINE: dict[str, str] = {}


def _tracing() -> bool:
    """A tracekit instance is tracing with tracekit kprobes defined."""
    probes = any("tracekit" in line for line in _read_lines(TRACEFS / "kprobe_events"))
    for inst in (TRACEFS / "instances").glob("tracekit-*"):
        if not inst.name.endswith("-state") and (inst / "tracing_on").read_text().strip() == "1":
            return probes
    return False


def next_start(roles: str, bundle: Path) -> list[str]:
    """The next collect's start: it removes leftovers first; SIGINTed once it printed the host."""
    collect = Collect.start(roles, bundle)
    wait_for(lambda: collect.said("host: "), collect, 600)  # after remove_leftovers
    collect.proc.send_signal(signal.SIGINT)
    collect.proc.wait(timeout=600)
    time.sleep(0.5)
    return [line for line in collect.lines if "removed a leftover" in line]


def cleanup_command() -> list[str]:
    """`tracekit cleanup`, as a user runs it; its output lines."""
    result = subprocess.run(
        [sys.executable, "-m", "tracekit", "cleanup"], capture_output=True, text=True, check=False
    )
    return [*(result.stdout + result.stderr).splitlines(), f"exit {result.returncode}"]


def bundle_state(bundle: Path) -> str:
    """Complete, or INCOMPLETE with its reason, plus any file problems (stdlib only here)."""
    if not (bundle / "manifest.json").is_file():
        return "no bundle (stopped before the manifest)"
    try:
        manifest = read_manifest(bundle)
    except Exception as err:  # the matrix reports what any reader would meet
        return f"UNREADABLE: {err}"
    problems = bundle_problems(bundle, manifest, full=True)
    head = "complete" if manifest.complete else f"INCOMPLETE ({manifest.incomplete_reason})"
    others = [p for p in problems if not p.startswith("INCOMPLETE")]
    return head + (f"; {len(others)} file problems: {others[:3]}" if others else "")


def run_cell(name: str, roles: str, work: Path) -> dict[str, Any]:
    """One cell, e.g. 'kill-traced' or 'kill-traced-cleanup': signal, look, recover, look."""
    sig, point, *how = name.split("-")
    before = host_state()
    bundle = work / name / "bundle"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # Only the traced cells need a traced run of the before phase to be signalled in.
    collect = Collect.start(roles, bundle, traced=point == "traced")
    seen = reach(point, collect)
    at_signal = in_place()
    collect.proc.send_signal(SIGNALS[sig])
    status = collect.proc.wait(timeout=900)
    time.sleep(0.5)  # the parent-death SIGKILL of its tools is on its way
    after_run = differences(before, host_state())
    recovery, said = "none", []
    if sig == "kill":
        recovery = "cleanup" if how == ["cleanup"] else "next start"
        said = cleanup_command() if how else next_start(roles, work / name / "next-bundle")
    after = differences(before, host_state())
    (work / name / "output.txt").write_text("\n".join([*collect.lines, "--", *said]) + "\n")
    return {
        "cell": name,
        "point": seen,
        "at_signal": at_signal,
        "exit": status,
        "left_after_run": after_run,
        "recovery": recovery,
        "recovery_said": said,
        "left_after_recovery": after,
        "bundle": bundle_state(bundle),
        "seconds": round(time.monotonic() - started, 1),
    }


def run_cells(
    cells: list[str], roles: str, work: Path, saved: Path, budget_s: float | None = None
) -> None:
    """Each cell in turn (each compared with the state just before it), then all of them.

    Each result is appended to `saved` as it comes: a power cut loses none that finished.
    Once `budget_s` seconds have gone, the cells left are saved as not run.
    """
    first = host_state()
    MAIN_ONLINE["online"] = first["cpus_online"]
    saved.write_text("")
    began, took, estimated = time.monotonic(), 0.0, 0.0
    for name in cells:
        # CELL_S is a first guess; once cells have run, what they took rules (up or down).
        guess = estimate(name) * (took / estimated if estimated else 1.0)
        if budget_s is not None and time.monotonic() - began + guess > budget_s:
            result: dict[str, Any] = {"cell": name, "not_run": "time budget"}
            print(f"cell {name}: not run (time budget; ~{guess:.0f} s)", flush=True)
        else:
            result = run_cell(name, roles, work)
            took, estimated = took + result["seconds"], estimated + estimate(name)
            print(f"cell {name}: {result['seconds']} s, {kinds(result['left_after_recovery'])}")
        with saved.open("a") as out:
            out.write(json.dumps(result, sort_keys=True) + "\n")
    print(f"all cells, then vs before the first: {kinds(differences(first, host_state()))}")


def power_cut(roles: str, disk: Path) -> None:
    """Start a collect on the 'disk', reach a traced run, save what is in place, ask for the cut."""
    on_disk(disk)
    baseline = host_state()
    collect = Collect.start(roles, disk / "bundle")
    seen = reach("traced", collect)
    record = {"baseline": baseline, "point": seen, "at_cut": host_state(), "in_place": in_place()}
    (disk / "before-cut.json").write_text(json.dumps(record, sort_keys=True))
    os.sync()
    print(POWERCUT_LINE, flush=True)
    time.sleep(600)  # QEMU is killed from outside meanwhile


def estimate(cell: str) -> float:
    """A cell's expected seconds before any has run (CELL_S, plus a SIGKILL's recovery)."""
    sig, point, *_ = cell.split("-")
    return CELL_S[point] + (RECOVERY_S if sig == "kill" else 0)


def on_disk(disk: Path) -> None:
    """tracekit's journals on the board's disk (the share), for this process.

    $TMPDIR stays on the guest's tmpfs, as a board's /tmp usually is: on the 9p share
    stress-ng's tlb-shootdown stressor fails (its ftruncate of a temporary file gets
    ENOENT, exit 3; seen in the 2026-12-02 matrix), so the collect never reached a traced run.
    """
    (disk / "journals").mkdir(parents=True, exist_ok=True)
    os.environ[JOURNAL_DIR_ENV] = str(disk / "journals")


def after_power_cut(disk: Path) -> dict[str, Any]:
    """In the fresh boot on the same disk: what survived, what cleanup does, the bundle."""
    on_disk(disk)
    saved = disk / "before-cut.json"
    fresh = host_state()
    if saved.is_file():
        record = json.loads(saved.read_text())
    else:  # QEMU was killed by hand during a cell: no record; tracekit's own traces only
        record = {"point": "in a cell, by hand", "in_place": ["unknown"], "baseline": fresh}
    said = cleanup_command()
    left = differences(record["baseline"], fresh) or tracekit_traces(fresh)
    return {
        "cell": "powercut-traced" if saved.is_file() else "powercut",
        "point": record["point"],
        "at_signal": record["in_place"],
        "left_after_run": left,
        "recovery": "fresh boot + cleanup",
        "recovery_said": said,
        "left_after_recovery": differences(record["baseline"], host_state())
        or tracekit_traces(host_state()),
        "bundle": bundle_state(disk / "bundle"),
    }


def tracekit_traces(state: dict[str, Any]) -> dict[str, list[str]]:
    """tracekit's traces in a state: journals, instances, probes, tools, files, CPUs offline."""
    found = {
        "journals": state["journals"],
        "instances": [i for i in state["tracefs"]["instances"] if i.startswith("tracekit")],
        "kprobe_events": [e for e in state["kprobe_events"] if "tracekit" in e],
        "processes": state["processes"],
        "tmp_files": state["tmp_files"],
    }
    present = Path("/sys/devices/system/cpu/present").read_text().strip()
    if state["cpus_online"] != present:
        found["cpus_online"] = [state["cpus_online"]]
    return {kind: items for kind, items in found.items() if items}


# --- outside: the boots, the bundles read with the full toolkit, the table ------------------


def all_cells() -> list[str]:
    """Every (signal, point) cell, most needed first: SIGKILL, SIGTERM, SIGKILL undone by
    `tracekit cleanup`, then SIGINT (SIGTERM's path)."""
    cells = [f"{s}-{p}" for s in ("kill", "term") for p in POINTS] + ["kill-traced-cleanup"]
    return cells + [f"int-{p}" for p in POINTS[::-1]]  # the points never run with SIGINT first


# Of the run's minutes, what boot 1's cells may not use: QEMU's start, the power cut's
# collect up to its traced run, boot 2. The 2026-12-02 run spent 1.9 min on all of them
# beside its cells (its cut came before any traced run); a traced run is reached in
# ~1.5 min more. The table is made after the lock (--boot-only, then --tabulate).
RESERVE_S = 6 * 60
# Without the power cut only QEMU's start (under 1 min in the 2026-12-02 runs) and the
# overrun of a cell started near the end are left.
RESERVE_NO_CUT_S = 2 * 60


def cell_budget(minutes: float | None, cut: bool = True) -> float | None:
    """Seconds boot 1's cells may take so that the whole run takes `minutes`, or None."""
    reserve = RESERVE_S if cut else RESERVE_NO_CUT_S
    return None if minutes is None else max(0.0, minutes * 60 - reserve)


def boot(out: Path, disk: Path, command: list[str], on_line: Callable[[str], None]) -> int | str:
    """Boot the main case's host with `disk` as /share; the command's status, or what stopped it."""
    from tracekit.errors import TracekitError
    from tracekit.vhost.runner import VhostConfig, run

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from conftest import VHOST_CONFIGS

    main_case = VHOST_CONFIGS["nvhe-a76"].__dict__
    config = VhostConfig(**{**main_case, "timeout_s": 5400, "share": disk, "out": out})
    try:
        return run(config, command, on_output=on_line, progress=lambda m: None).exit_status
    except TracekitError as err:
        return str(err)


def cut_power(line: str) -> None:
    """On the inside's request, SIGKILL our QEMU (run() started it): the board loses power."""
    print(line.rstrip("\n"), flush=True)
    if line.strip() != POWERCUT_LINE:
        return
    for pid, name, fields in live_processes():
        if name.startswith("qemu-system") and int(fields[1]) == os.getpid():
            os.kill(pid, signal.SIGKILL)


def read_bundle(bundle: Path) -> str:
    """`tracekit verify`, `report` and `perfetto` on a bundle: 'reads' or what went wrong."""
    if not (bundle / "manifest.json").is_file():
        return "-"
    verdicts = []
    exported = bundle.parent / "bundle.pftrace"
    for argv in (
        ["verify", str(bundle)],
        ["report", "--no-progress", str(bundle)],
        ["perfetto", str(bundle), "-o", str(exported)],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "tracekit", *argv], capture_output=True, text=True, check=False
        )
        said = result.stdout + result.stderr
        if "Traceback" in said:
            verdicts.append(f"{argv[0]}: TRACEBACK")
        elif argv[0] != "verify" and result.returncode != 0:
            verdicts.append(f"{argv[0]}: exit {result.returncode}: {result.stderr.strip()[:80]}")
        elif "INCOMPLETE" not in said:
            verdicts.append(f"{argv[0]}: no INCOMPLETE line")
    return "; ".join(verdicts) or "reads, says INCOMPLETE"


def kinds(changed: dict[str, list[str]]) -> str:
    """A state difference by kind with counts, or '-'."""
    return ", ".join(f"{k} {len(v)}" for k, v in sorted(changed.items())) or "-"


def table(results: list[dict[str, Any]]) -> list[str]:
    """The matrix as fixed-width lines."""
    head = f"{'cell':21} {'began (UTC)':16} {'at the signal':36} {'exit':>4}  "
    lines = [head + f"{'left after the run':34} {'recovery':20} {'left after':10} bundle"]
    for r in results:
        exit_ = str(r.get("exit", "cut"))
        lines.append(
            f"{r['cell']:21} {r.get('began', '-'):16} {', '.join(r['at_signal']):36} {exit_:>4}  "
            f"{kinds(r['left_after_run']):34} {r['recovery']:20} "
            f"{kinds(r['left_after_recovery']):10} {r['bundle_read']}"
        )
    return lines


def outside(
    out: Path, cells: list[str], minutes: float | None, table_too: bool = True, cut: bool = True
) -> None:
    """Both boots (boot 1 only without the `cut`), then the table (or --tabulate later)."""
    disk = out / "disk"
    disk.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    inside = ["python3", "/tracekit/scripts/vhost_kill_matrix.py"]
    budget = cell_budget(minutes, cut)
    limit = [] if budget is None else ["--budget", f"{budget:.0f}"]
    print(f"cells: {' '.join(cells)}; boot 1's budget: {limit[1:] or 'none'} s", flush=True)
    ending = ["--powercut"] if cut else []
    first = boot(out / "boot1", disk, [*inside, "inside", *cells, *limit, *ending], cut_power)
    second = boot(out / "boot2", disk, [*inside, "after-power-cut"], cut_power) if cut else "-"
    minutes = (time.monotonic() - began) / 60
    print(f"boot 1: {first}; boot 2 (same disk, after the power cut): {second}; {minutes:.0f} min")
    if table_too:
        tabulate(out)


def tabulate(out: Path, earlier: tuple[Path, ...] = ()) -> None:
    """The bundles read here with the full toolkit, the table, the details as JSON.

    With `earlier` runs' output directories, their cells come first, in one table: each
    cell says when its collect began (its bundle's manifest), and a cell counts as not
    run only if no run ran it.
    """
    results = [row for run in (*earlier, out) for row in run_results(run)]
    ran = {r["cell"] for r in results if "not_run" not in r}
    not_run = list(dict.fromkeys(r["cell"] for r in results if r["cell"] not in ran))
    results = [r for r in results if "not_run" not in r]
    for result in results:
        bundle = result.pop("dir")
        result["began"] = began(bundle)
        result["bundle"] = bundle_state(bundle)
        result["bundle_read"] = f"{result['bundle']}; {read_bundle(bundle)}"
    (out / "matrix.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print("\n".join(table(results)))
    unknown = sum(any(k.startswith("unknown") for k in r["left_after_recovery"]) for r in results)
    left = sum(bool(r["left_after_recovery"]) for r in results) - unknown
    crashed = sum("TRACEBACK" in r["bundle_read"] for r in results)
    unread = sum(not r["bundle_read"].endswith(("reads, says INCOMPLETE", "; -")) for r in results)
    print(
        f"cells {len(results)}, left something after recovery {left}, not known {unknown}, "
        f"bundle tracebacks {crashed}, bundles not read as INCOMPLETE by all three {unread}"
    )
    if not_run:
        print(f"not run (time budget): {' '.join(not_run)}")
    for result in results:
        if result["cell"].startswith("powercut") and result.get("recovery_said"):
            cut = f"after the power cut ({result['began']})"
            print(f"{cut}, `tracekit cleanup` in the fresh boot said:")
            print("\n".join(f"  {line}" for line in result["recovery_said"]))


def run_results(out: Path) -> list[dict[str, Any]]:
    """One run's cells (boot 1's, the power cut's, boot 2's), each with its bundle's "dir"."""
    results = boot_results(out / "boot1")
    cut = out / "boot2/after-cut.json"
    if cut.is_file():
        results.append({**json.loads(cut.read_text()), "dir": cut_bundle(out, results)})
    elif (bundle := cut_bundle(out, results)).is_dir():  # cut, not yet booted again
        unknown = {"unknown (no boot after the cut yet)": []}
        row = {"cell": "powercut", "at_signal": ["?"], "left_after_run": unknown}
        results.append({**row, "recovery": "-", "left_after_recovery": unknown, "dir": bundle})
    return results + boot_results(out / "boot2")


def began(bundle: Path) -> str:
    """When a cell's collect began (UTC, its manifest's `created`), or '-' without one."""
    try:
        created = json.loads((bundle / "manifest.json").read_text())["created"]
    except (OSError, ValueError, KeyError, TypeError):
        return "-"
    return str(created).replace("T", " ")[:16]


def boot_results(boot_out: Path) -> list[dict[str, Any]]:
    """A boot's cells: its cells.json, or, when QEMU was killed before that was written,
    the summary line each finished cell printed (what it left after the recovery)."""
    saved = boot_out / "cells.json"
    if saved.is_file():
        rows = [json.loads(line) for line in saved.read_text().splitlines()]
    else:
        rows = [_from_summary(m) for m in SUMMARY.finditer(_console(boot_out))]
    return [{**row, "dir": boot_out / "cells" / row["cell"] / "bundle"} for row in rows]


SUMMARY = re.compile(r"^cell (\S+): ([\d.]+) s, (.*)$", re.M)


def _console(boot_out: Path) -> str:
    """A boot's serial console (the inside's lines are there)."""
    log = boot_out / "vhost-console.log"
    return log.read_text(errors="replace") if log.is_file() else ""


def _from_summary(match: re.Match[str]) -> dict[str, Any]:
    """A cell's row from its summary line: only what it left after the recovery is known."""
    name, seconds, left = match.groups()
    unknown = {"unknown (QEMU killed before the details were written)": []}
    return {
        "cell": name,
        "seconds": float(seconds),
        "at_signal": ["?"],
        "exit": "?",
        "left_after_run": {} if left == "-" else unknown,
        "recovery": "none" if name.startswith(("int-", "term-")) else "?",
        "left_after_recovery": {} if left == "-" else {left: []},
    }


def cut_bundle(out: Path, done: list[dict[str, Any]]) -> Path:
    """The power cut's bundle: on the disk, or the boot-1 cell that was running at the cut."""
    if (out / "disk/bundle").is_dir():
        return out / "disk/bundle"
    finished = {r["cell"] for r in done}
    cells = out / "boot1/cells"  # absent when boot 1 started no cell
    started = sorted(cells.iterdir()) if cells.is_dir() else []
    running = [d for d in started if d.name not in finished]
    return running[0] / "bundle" if running else out / "disk/bundle"


def main() -> None:
    """Outside: boot and tabulate. Inside the emulated host: run cells / check a power cut."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "mode", nargs="?", default="outside", choices=["outside", "inside", "after-power-cut"]
    )
    parser.add_argument("cells", nargs="*", help="inside: cells to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path("vhost-kill-matrix"))
    parser.add_argument("--roles", default=MAIN_ROLES, help="inside: collect's CPU roles")
    parser.add_argument("--powercut", action="store_true", help="inside: end with the power cut")
    parser.add_argument("--no-powercut", action="store_true", help="outside: cells only, one boot")
    parser.add_argument("--tabulate", action="store_true", help="only re-read --out's results")
    parser.add_argument(
        "--earlier",
        type=Path,
        action="append",
        default=[],
        help="with --tabulate: an earlier run's --out, its cells in the same table",
    )
    parser.add_argument(
        "--boot-only", action="store_true", help="outside: boot, leave the table to --tabulate"
    )
    parser.add_argument("--minutes", type=float, help="outside: the whole run's time, both boots")
    parser.add_argument("--budget", type=float, help="inside: seconds after which no cell starts")
    args = parser.parse_args()
    if args.tabulate:
        tabulate(args.out.resolve(), tuple(d.resolve() for d in args.earlier))
    elif args.mode == "outside":
        cells = args.cells or all_cells()
        outside(args.out.resolve(), cells, args.minutes, not args.boot_only, not args.no_powercut)
    elif args.mode == "after-power-cut":
        result = after_power_cut(Path("/share"))
        Path("/out/after-cut.json").write_text(json.dumps(result, sort_keys=True) + "\n")
        print(f"power cut: {kinds(result['left_after_run'])}; {result['bundle']}", flush=True)
        # Cells left for this boot (the disk's next-cells file), after the power cut's check.
        later = Path("/share/next-cells")
        if later.is_file():
            run_cells(later.read_text().split(), args.roles, Path.cwd() / "cells", CELLS_JSON)
    else:
        cells = args.cells or all_cells()
        run_cells(cells, args.roles, Path.cwd() / "cells", CELLS_JSON, args.budget)
        if args.powercut:
            power_cut(args.roles, Path("/share"))


if __name__ == "__main__":
    main()
