"""reproducer/kpatch in the emulated host: each EL2 operation, and the teardown switch.

One boot of bookworm:kpatch (nVHE, 2 x cortex-a76, the ground-truth plugin), behind the
kbuild marker: its kernel is tracekit's own build (long, cold). Each operation runs on
CPU 1 between two gtmark markers on CPU 0; the plugin must see the named instruction
once, on CPU 1, in nVHE hyp text, from the series' __kvm_debug_maint. Then one MMU-on VM
per teardown_flush choice: `off` issues no ALLE1(IS) at EL2 in its window, `alle1is` one
TLBI ALLE1IS from __kvm_flush_vm_context, `last-ran` one local TLBI ALLE1 on CPU 1.
Then each refused request (an offline CPU, a VMID too wide, a missing or extra VMID, an
unknown operation or switch choice) must fail with its errno.

Written before any kpatch kernel was built: it has not run yet.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import register_vhost_check

from tracekit.ingest.groundtruth import load_ground_truth, parse_gtmark

CONFIG = "nvhe-kpatch"
MAINT = "/sys/kernel/debug/kvm/arm64_debug_maint"
HYP_MAINT = "__kvm_nvhe___kvm_debug_maint"
# (request written to `op`, the instruction the plugin must see once)
OPERATIONS = (
    ("alle1 1", "TLBI ALLE1"),
    ("alle1is 1", "TLBI ALLE1IS"),
    ("vmalls12e1 1 5 0", "TLBI VMALLS12E1"),
    ("vmalls12e1 1 5 1", "TLBI VMALLS12E1"),
    ("vmalls12e1is 1 5 0", "TLBI VMALLS12E1IS"),
    ("vmalls12e1is 1 5 1", "TLBI VMALLS12E1IS"),
    ("vmalle1 1 0", "TLBI VMALLE1"),
    ("vmalle1is 1 0", "TLBI VMALLE1IS"),
    ("iallu 1", "IC IALLU"),
)
POLICIES = ("off", "alle1is", "last-ran")
# Requests the interface must refuse, and the errno each gets (2 CPUs, VMIDs of 8 or 16
# bits): none of them reaches EL2, so they run after the windows.
REFUSED = (
    ("op", "alle1 2", "ENXIO"),
    ("op", "vmalls12e1 1 65536", "ERANGE"),
    ("op", "vmalls12e1 1", "EINVAL"),
    ("op", "vmalle1 1 5", "EINVAL"),
    ("op", "bogus 1", "EINVAL"),
    ("teardown_flush", "bogus", "EINVAL"),
)
# One write of argv[2] to argv[1]; prints the errno's name, or "ok" (busybox's and
# dash's echo do not say which errno a failed write got).
_WRITE_ERRNO = (
    'python3 -c "import errno, os, sys\n'
    "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
    "try:\n    os.write(fd, sys.argv[2].encode() + b'\\n'); print('ok')\n"
    'except OSError as e:\n    print(errno.errorcode[e.errno])"'
)


def _windowed(name: str, command: str) -> str:
    """`command` between two gtmark markers on CPU 0, saved as NAME-start / NAME-end."""
    mark = "/tracekit/reproducer/build/gtmark --cpus 0 --rounds 1 | tee -a /out/vhost-gtmark.txt"
    return f"{mark} > {name}-start; {command}; {mark} > {name}-end; "


_SCRIPT = "set -e; cat " + MAINT + "/op > op-read; "
for _index, (_request, _) in enumerate(OPERATIONS):
    _SCRIPT += _windowed(f"op{_index}", f"echo '{_request}' > {MAINT}/op")
for _policy in POLICIES:
    _SCRIPT += f"echo {_policy} > {MAINT}/teardown_flush; " + _windowed(
        f"teardown-{_policy}",
        "/tracekit/reproducer/build/vmm --cpus 1 /tracekit/reproducer/build/guests/mmu-on.elf"
        f" > vmm-{_policy}.txt",
    )
_SCRIPT += f"cat {MAINT}/teardown_flush > teardown-read; echo off > {MAINT}/teardown_flush"
for _index, (_file, _request, _) in enumerate(REFUSED):
    _SCRIPT += f"; {_WRITE_ERRNO} {MAINT}/{_file} '{_request}' > refused{_index}"
register_vhost_check(CONFIG, "kpatch", _SCRIPT)


def _window(here, name: str) -> pl.Expr:
    """Rows between the NAME-start marker's t0 and the NAME-end marker's t1."""
    start = parse_gtmark((here / f"{name}-start").read_text())["t0"][0]
    end = parse_gtmark((here / f"{name}-end").read_text())["t1"][0]
    return pl.col("ts").is_between(start, end)


@pytest.mark.kbuild
@pytest.mark.vhost
def test_vhost_kpatch_operations_and_teardown_switch(vhost_boot) -> None:
    """Each operation: its instruction once, on CPU 1, at EL2; the switch changes teardown."""
    boot = vhost_boot(CONFIG)
    check = boot.checks["kpatch"]
    assert check.status == 0, check.stderr
    here = boot.result.out_dir / "checks" / "kpatch"
    assert "mode: nvhe" in (here / "op-read").read_text()
    truth = load_ground_truth(boot.result.out_dir)
    assert truth.header.not_written == 0 and truth.header.complete
    hyp = truth.table.filter(pl.col("where") == "hyp")
    for index, (request, operation) in enumerate(OPERATIONS):
        mine = hyp.filter(_window(here, f"op{index}"), pl.col("symbol").str.starts_with(HYP_MAINT))
        invalidations = mine.filter(pl.col("kind").is_in(["tlbi", "ic"]))
        assert invalidations["operation"].to_list() == [operation], request
        assert invalidations["cpu"].to_list() == [1], request
    alle1 = pl.col("operation").is_in(["TLBI ALLE1", "TLBI ALLE1IS"])
    seen = {policy: hyp.filter(_window(here, f"teardown-{policy}"), alle1) for policy in POLICIES}
    assert seen["off"].height == 0
    assert seen["alle1is"]["operation"].to_list() == ["TLBI ALLE1IS"]
    assert seen["alle1is"]["symbol"][0].startswith("__kvm_nvhe___kvm_flush_vm_context")
    assert seen["last-ran"]["operation"].to_list() == ["TLBI ALLE1"]
    assert seen["last-ran"]["cpu"].to_list() == [1]
    assert "flushes: 2" in (here / "teardown-read").read_text()
    for index, (file, request, name) in enumerate(REFUSED):
        assert (here / f"refused{index}").read_text().strip() == name, (file, request)
