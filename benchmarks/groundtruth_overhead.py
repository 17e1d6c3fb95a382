#!/usr/bin/env python3
"""The ground-truth plugin's overhead on a collect run in the emulated host.

Boots the same configuration (the brief's main case: nVHE, 4 x cortex-a76 in two
clusters, CPU 3 isolated) with and without `--ground-truth`, taking turns, and runs the
same short `tracekit collect` in each (quiet runs only). Inside, the collect's wall time
is taken on CLOCK_BOOTTIME (which follows the x86 host's clock under TCG, so it is real
time); outside, the whole boot's. Prints each boot, the medians and the ratios
with/without. Emulated timings: they say nothing about hardware. Output under
$TRACEKIT_CACHE (or ~/.cache/tracekit)/bench/groundtruth, never in the repo.

    python3 benchmarks/groundtruth_overhead.py [--repeat 1] [--runs 2] [--duration 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import time
from pathlib import Path

from tracekit.vhost.cache import cache_root
from tracekit.vhost.runner import VhostConfig, run

# VhostConfig's defaults are the main case (nVHE, 4 x cortex-a76); two clusters, CPU 3 isolated.
CONFIG = VhostConfig(clusters=2, append="isolcpus=3 nohz_full=3 rcu_nocbs=3", timeout_s=1800)


def collect_command(runs: int, duration: int) -> list[str]:
    """The collect run timed inside: its wall seconds on CLOCK_BOOTTIME into a file."""
    collect = (
        "python3 -m tracekit collect --rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1 "
        f"--runs {runs} --traced-runs 0 --duration {duration} -o /out/bundle"
    )
    script = (
        "start=$(cut -d' ' -f1 /proc/uptime); "
        f"{collect} > /out/collect.txt 2>&1; status=$?; "
        "end=$(cut -d' ' -f1 /proc/uptime); "
        'echo "$start $end" > /out/collect-seconds; exit $status'
    )
    return ["sh", "-c", script]


def children_cpu_s() -> float:
    """CPU seconds of every reaped child so far (QEMU is one): load on a shared machine
    stretches wall time, much less the CPU time QEMU needed."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_boot(out: Path, ground_truth: bool, command: list[str]) -> tuple[float, float, float]:
    """(collect seconds inside, whole boot seconds outside, QEMU's CPU seconds) of one boot."""
    config = VhostConfig(**{**CONFIG.__dict__, "out": out, "ground_truth": ground_truth})
    shutil.rmtree(out, ignore_errors=True)  # collect refuses an earlier run's bundle
    started, cpu_before = time.monotonic(), children_cpu_s()
    result = run(config, command, on_output=lambda line: None, progress=lambda message: None)
    wall, cpu = time.monotonic() - started, children_cpu_s() - cpu_before
    if result.exit_status != 0:
        raise SystemExit(f"collect failed in {out} (status {result.exit_status})")
    start, end = (float(v) for v in (out / "collect-seconds").read_text().split())
    return end - start, wall, cpu


def main() -> None:
    """One warm-up boot, then with and without the plugin in alternating order; the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="boots of each kind")
    parser.add_argument("--runs", type=int, default=2, help="quiet runs per phase")
    parser.add_argument("--duration", type=int, default=3, help="seconds per run")
    args = parser.parse_args()
    base = cache_root() / "bench" / "groundtruth"
    command = collect_command(args.runs, args.duration)
    seen: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    # A first boot pays for what later ones find cached (bytecode of a changed tree, page
    # cache): measured apart and left out. Then the order alternates (without/with, with/
    # without, ...), so a drift over the run does not always favour one side.
    warm = one_boot(base / "warmup", False, command)
    print(f"warm-up boot (left out): collect {warm[0]:7.1f} s, boot {warm[1]:7.1f} s")
    for i in range(args.repeat):
        for ground_truth in (False, True) if i % 2 == 0 else (True, False):
            out = base / f"{'with' if ground_truth else 'without'}-{i}"
            row = one_boot(out, ground_truth, command)
            seen[ground_truth].append(row)
            label = "with   " if ground_truth else "without"
            print(
                f"{label} plugin, boot {i}: collect {row[0]:7.1f} s, boot {row[1]:7.1f} s, "
                f"QEMU CPU {row[2]:7.1f} s, load {os.getloadavg()[0]:.1f}"
            )
    medians = {
        key: [statistics.median(col) for col in zip(*rows, strict=True)]
        for key, rows in seen.items()
    }
    ratios = [w / wo for w, wo in zip(medians[True], medians[False], strict=True)]
    print(
        f"collect: {medians[True][0]:.1f} s with / {medians[False][0]:.1f} s without = "
        f"{ratios[0]:.3f} ({(ratios[0] - 1) * 100:+.1f} %); whole boot {ratios[1]:.3f}; "
        f"QEMU CPU {ratios[2]:.3f}"
    )
    print("emulated host (QEMU TCG): these timings are not hardware timings")


if __name__ == "__main__":
    main()
