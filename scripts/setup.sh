#!/usr/bin/env bash
# Install everything tracekit needs on a fresh Debian (or Ubuntu) x86_64/arm64 machine:
# the host packages for the emulated arm64 host and the cross toolchain, then a venv
# with tracekit and its test tools. Safe to run again: it only adds what is missing.
set -euo pipefail

cd "$(dirname "$0")/.."

APT_PACKAGES=(
    qemu-system-arm            # qemu-system-aarch64: the emulated arm64 host
    gcc-aarch64-linux-gnu      # cross-compiles the reproducer (static)
    libc6-dev-arm64-cross
    make
    flex                       # tracekit's kernel builds (kconfig; tracekit/vhost/kbuild.py)
    bison
    bc
    libssl-dev
    qemu-user                  # qemu-aarch64: runs the reproducer's arm64 binaries in tests
    debian-archive-keyring     # verifies the arm64 packages fetched for the emulated host
    trace-cmd                  # ground truth for the ingest tests
    python3-venv
    zstd
    cpio                       # checks the initramfs writer against GNU cpio
    xz-utils
    chromium                   # headless: the HTML report's screenshot test (~45 s to install)
    python3-click              # with Debian's own python3: a board's python (board-pack test)
    python3-pyelftools
    libprotobuf32              # trace_processor_shell (../shared/tools): the importer tests
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
        "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
echo "setup: ready (.venv/bin/tracekit $(.venv/bin/tracekit --version | awk '{print $NF}'))"
