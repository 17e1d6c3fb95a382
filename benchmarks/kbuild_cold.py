#!/usr/bin/env python3
"""The cold build time of tracekit's emulated-host kernel (bookworm's 6.1, trimmed config).

Takes Debian's source and config the way `tracekit vhost build --kernel bookworm:tk`
does (fetched into the cache once, not timed), then builds the trimmed config into a
fresh build directory of a hard-linked copy of the tree, at nice 19 as every kernel
build here runs, and prints the wall time of that build with the load average around
it: on a shared machine the load says how much of the CPU the build had. The copy is
deleted after; nothing lands in the repo.

    python3 benchmarks/kbuild_cold.py [--suite bookworm] [--config full|ci]

`--config ci` builds the CI config (`:tk-ci`, kbuild.ci_fragment) instead of the full one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tracekit.vhost import kbuild, kcustom, ksource


def main() -> None:
    """Build once from cold and print the time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="bookworm")
    parser.add_argument("--config", default="full", choices=("full", "ci"))
    args = parser.parse_args()
    version, config = kcustom.debian_inputs(args.suite, print)
    pristine = ksource.pristine_tree(args.suite, version, print)
    wanted = kcustom.input_config(config, pristine, args.config)
    with tempfile.TemporaryDirectory(prefix="kbuild-bench-", dir=ksource.source_root()) as tmp:
        tree = Path(tmp) / pristine.name
        tree.mkdir()
        entries = [str(e) for e in pristine.iterdir() if not e.name.startswith("build-")]
        subprocess.run(["cp", "-al", *entries, str(tree)], check=True)
        load_before = os.getloadavg()
        started = time.monotonic()
        built = kbuild.build_kernel(tree, wanted, version, "", print)
        elapsed = time.monotonic() - started
        load_after = os.getloadavg()
        size_mb = built.image.stat().st_size / 1e6
        shutil.rmtree(built.directory)
    print(
        f"cold build of {built.release} ({args.suite}, {args.config} config {built.config_hash}): "
        f"{elapsed:.0f} s wall at nice 19 on {os.cpu_count()} CPUs ({built.cpu_s:.0f} CPU-s, "
        f"{built.objects} objects); Image {size_mb:.1f} MB; "
        f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}"
    )


if __name__ == "__main__":
    main()
