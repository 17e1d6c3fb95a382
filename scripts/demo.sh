#!/usr/bin/env bash
# The main job, start to finish on the emulated arm64 host: install, build the
# reproducer, boot QEMU (nVHE, 4 x cortex-a76 in two clusters, CPU 3 isolated), run
# `tracekit collect` there (before -> one MMU-on guest -> after), then ingest what it
# recorded, export the guest's run for Perfetto and end with the report. Emulated
# timings are not hardware timings (the report says so first).
#   ./scripts/demo.sh [OUTPUT_DIR]        (default: out/demo)
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=${1:-out/demo}
bash scripts/setup.sh
make -s -C reproducer CROSS_COMPILE=aarch64-linux-gnu-
TK=.venv/bin/tracekit

if [ -e "$OUT/bundle" ]; then
    echo "demo: $OUT/bundle exists; remove it or give another output directory" >&2
    exit 2
fi
mkdir -p "$OUT"

"$TK" vhost run --kvm-mode nvhe --cpu-model cortex-a76 --smp 4 --clusters 2 \
    --append "isolcpus=3 nohz_full=3 rcu_nocbs=3" --timeout 1800 --out "$OUT" -- \
    python3 -m tracekit collect --rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1 \
    --runs 2 --traced-runs 1 --duration 5 -o /out/bundle

echo
echo "demo: the bundle, as recorded (every run's ftrace raw capture, decoded by tracekit):"
"$TK" ingest "$OUT/bundle"
echo
echo "demo: the VMM's own account of the guest:"
cat "$OUT/bundle/runs/guest/vmm.txt"
echo
echo "demo: tracekit perfetto $OUT/bundle --run guest -o $OUT/guest.pftrace"
"$TK" perfetto "$OUT/bundle" --run guest -o "$OUT/guest.pftrace"
echo "demo: open $OUT/guest.pftrace in https://ui.perfetto.dev, or add --open to that"
echo "      command to have the UI load it from this machine (served once, never uploaded)."
echo
"$TK" report "$OUT/bundle" --format email -o "$OUT/report.txt"
"$TK" report "$OUT/bundle" --format html -o "$OUT/report.html"
echo "demo: bundle in $OUT/bundle (manifest.json lists every run and file); its report"
echo "      (also as $OUT/report.txt, 72 columns for a mail reply, and $OUT/report.html):"
echo
"$TK" report "$OUT/bundle"
