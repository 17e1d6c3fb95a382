#!/usr/bin/env python3
"""The teardown fix's cost in the emulated host: one vm-churn per fresh boot, per state.

Issue 20 point 4 as the brief measured it: each `teardown_flush` state of
reproducer/kpatch's kernel (`off`, the fix `alle1is`, the alternative `last-ran`) gets a
boot of its own, in which the switch is set and ONE `tracekit collect --scenario
vm-churn` runs (N MMU-on VMs in turn on CPU 0, cyclictest on CPU 1, isolated as the
brief's rt CPU is); with `--twin`, the unpatched kernel of the same config (`:tk-ci` for
`:kpatch-ci`) churns too, as the "no debug series" state. No ground-truth plugin: it
slows every emulated instruction, and per-VM time is the quantity compared. Then
`tracekit report` over the bundles (its "VM churn" section compares each state with
`off`). Prints each boot's round, position, wall minutes and load average, and writes
them beside its bundle (boot.json: the report reads bundles only, so a disturbed boot
is found there, review s17 S2), then the report's text.
Emulated timings: they say nothing about hardware. Output under $TRACEKIT_CACHE (or
~/.cache/tracekit)/bench/churn, never in the repo.

    python3 benchmarks/vm_churn_boots.py [--kernel bookworm:kpatch-ci] [--vms 500]
        [--states off,alle1is,last-ran] [--twin] [--boots K [--seed S]] [--out DIR]

With --boots K (2 or more) each state gets K fresh boots, each round's states in a
seeded random order after one discarded warm-up boot, so the report's interval is across
boots (one boot per state gives none) and the order no longer always favours one state.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tracekit.analysis.churn import is_twin
from tracekit.vhost.cache import cache_root
from tracekit.vhost.image import build_image
from tracekit.vhost.kernels import parse_kernel_spec
from tracekit.vhost.runner import VhostConfig, run

MAINT = "/sys/kernel/debug/kvm/arm64_debug_maint"
# 2 x cortex-a76 in nVHE as the kpatch boots; CPU 1 isolated as the brief's rt CPU.
CONFIG = VhostConfig(
    kvm_mode="nvhe",
    cpu_model="cortex-a76",
    smp=2,
    append="isolcpus=1 nohz_full=1 rcu_nocbs=1",
    timeout_s=1500,
)
# The unpatched twin of each patched flavour: the same config without the series.
TWINS = {"bookworm:kpatch-ci": "bookworm:tk-ci", "bookworm:kpatch": "bookworm:tk"}


def churn_command(state: str | None, vms: int) -> list[str]:
    """Set the switch (None: the unpatched twin has none), then one churn into /out/bundle."""
    collect = (
        "python3 -m tracekit collect --scenario vm-churn --rt-cpu 1 --stress-cpus 0 "
        f"--guest-cpu 0 --repeat {vms} -o /out/bundle"
    )
    switch = f"echo {state} > {MAINT}/teardown_flush && " if state else ""
    return ["sh", "-c", f"set -e; {switch}{collect}"]


def up_to_date_releases(kernels: list[str]) -> dict[str, str]:
    """Each kernel's image built or checked now (a boot takes the image `current` names,
    which an older config's build may still be): kernel -> its release."""
    return {k: build_image(parse_kernel_spec(k), lambda line: None).kernel_release for k in kernels}


def check_twin(patched: str, twin: str) -> None:
    """Fail unless the twin is the patched kernel's own unpatched build (same config)."""
    if not is_twin(patched, twin):
        raise SystemExit(f"unpatched twin {twin} is not {patched}'s base build: compare neither")


def one_boot(out: Path, kernel: str, state: str | None, vms: int) -> float:
    """Boot `kernel`, churn in state `state`: the boot's wall seconds (fails loudly)."""
    shutil.rmtree(out, ignore_errors=True)  # collect refuses an earlier run's bundle
    config = VhostConfig(**{**CONFIG.__dict__, "kernel": kernel, "out": out})
    started = time.monotonic()
    result = run(config, churn_command(state, vms), on_output=lambda line: None)
    if result.exit_status != 0:
        raise SystemExit(f"churn failed in {out} (status {result.exit_status})")
    return time.monotonic() - started


Boot = tuple[str, "str | None", str]  # kernel, teardown_flush state (None: the twin), name


def boot_plan(states: list[Boot], boots: int, seed: int) -> list[Boot]:
    """The boots in the order they run: with one boot per state the states in turn; with
    more, each round's states in a seeded random order, after one warm-up boot (the first
    state's, named "warm-up", left out of the report: the first boot after the build or
    the image check is the anomalous one, review 20 S8)."""
    if boots == 1:
        return list(states)
    rng = random.Random(seed)
    kernel, state, _ = states[0]
    plan: list[Boot] = [(kernel, state, "warm-up")]
    for round_ in range(1, boots + 1):
        order = list(states)
        rng.shuffle(order)
        plan += [(k, st, f"{name}-{round_}") for k, st, name in order]
    return plan


def main() -> None:
    """Fresh boots per state (seeded order), then the report over their bundles."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="bookworm:kpatch-ci")
    parser.add_argument("--vms", type=int, default=500, help="VMs per churn")
    parser.add_argument("--states", default="off,alle1is,last-ran")
    parser.add_argument("--twin", action="store_true", help="churn the unpatched twin too")
    parser.add_argument(
        "--boots",
        type=int,
        default=1,
        help="boots per state (2 or more: the report's interval across boots, a seeded "
        "random order per round and one warm-up boot first)",
    )
    parser.add_argument("--seed", type=int, default=1, help="the order's seed (--boots 2+)")
    parser.add_argument(
        "--out",
        type=Path,
        help="where the boots' bundles go (default: $TRACEKIT_CACHE/bench/churn; each "
        "boot's directory is replaced)",
    )
    args = parser.parse_args()
    if args.boots < 1:
        raise SystemExit("--boots: give 1 or more")
    base = args.out or cache_root() / "bench" / "churn"
    states: list[Boot] = [(args.kernel, s, s) for s in args.states.split(",")]
    if args.twin:
        states.append((TWINS[args.kernel], None, "unpatched"))
    releases = up_to_date_releases(sorted({kernel for kernel, _, _ in states}))
    if args.twin:
        check_twin(releases[args.kernel], releases[TWINS[args.kernel]])
    bundles = []
    for position, (kernel, state, name) in enumerate(boot_plan(states, args.boots, args.seed), 1):
        load = os.getloadavg()[0]
        wall = one_boot(base / name, kernel, state, args.vms)
        record = {
            "round": int(name.rpartition("-")[2]) if name[-1].isdigit() else None,
            "position": position,
            "load_before": load,
            "load_after": os.getloadavg()[0],
            "wall_s": round(wall, 1),
        }
        (base / name / "boot.json").write_text(json.dumps(record) + "\n")
        print(
            f"{kernel} {name} (#{position}): boot + churn of {args.vms} VMs "
            f"{wall / 60:.1f} min wall, load average {load:.1f} -> {record['load_after']:.1f}",
            flush=True,
        )
        if name != "warm-up":
            bundles.append(str(base / name / "bundle"))
    report = [sys.executable, "-m", "tracekit", "report", "--no-progress", *bundles]
    subprocess.run(report, check=True)


if __name__ == "__main__":
    main()
