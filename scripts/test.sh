#!/usr/bin/env bash
# Install everything, then run the whole test suite: lint, the reproducer's cross
# build, unit tests, and the end-to-end tests inside the emulated arm64 host.
set -euo pipefail

cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check tracekit tests benchmarks
.venv/bin/ruff format --check tracekit tests benchmarks
make -s -C reproducer CROSS_COMPILE=aarch64-linux-gnu-
# Perfetto's importer: the tests of tests/test_perfetto_importer.py run only where one is.
.venv/bin/python -c 'import sys; sys.path.insert(0, "tests")
from trace_processor_support import HOW_TO_GET, find_shell, shell_version
shell = find_shell()
print(f"perfetto importer tests: run with {shell_version(shell)} ({shell})" if shell
      else f"perfetto importer tests: SKIPPED, {HOW_TO_GET}")'
.venv/bin/python -m pytest -ra --durations=25 "$@"
