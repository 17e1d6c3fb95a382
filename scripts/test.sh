#!/usr/bin/env bash
# Install everything, then run the whole test suite: lint, the reproducer's cross
# build, unit tests, and the end-to-end tests inside the emulated arm64 host.
set -euo pipefail

cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check tracekit tests benchmarks
.venv/bin/ruff format --check tracekit tests benchmarks
make -s -C reproducer CROSS_COMPILE=aarch64-linux-gnu-
.venv/bin/python -m pytest -ra "$@"
