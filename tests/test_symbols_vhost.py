"""The DWARF offset of the VMID, used as a kprobe fetch argument in the emulated host.

`tracekit symbols probe-args` is run on the real debug vmlinux; its arguments go into
kprobe_events inside `tracekit vhost` (the same kernel), the reproducer's VMM runs three
VMs in a row, and the VMID read at each VM's stage-2 teardown must be plausible (a
non-zero VMID under a generation) and differ between VMs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.symbols import probeargs
from tracekit.symbols.fetch import fetch_debug_vmlinux
from tracekit.vhost.runner import VhostConfig, run

pytestmark = [pytest.mark.slow, pytest.mark.vhost]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "symbols"
REPRODUCER = Path(__file__).resolve().parent.parent / "reproducer"
CROSS = "aarch64-linux-gnu-"
VMS = 3
# The VMID sits in the low 16 bits (the emulated A76 has FEAT_VMID16), a generation above.
VMID_BITS = 16
EVENT = re.compile(r" (\w+): \(\w+\+0x0/0x[0-9a-f]+\) vmid=(\d+)")


def kprobe_lines(args: dict[str, list[str]]) -> list[str]:
    """kprobe_events definitions from probe-args, one probe per function."""
    return [
        f"p:tracekit_sym/{function} {function} {' '.join(fetch)}"
        for function, fetch in args.items()
    ]


def vmid_script(definitions: list[str]) -> str:
    """The shell run inside: define the probes, run VMS VMs, save the trace."""
    lines = ["set -e", "T=/sys/kernel/tracing", "echo > $T/trace"]
    lines += [f"echo '{line}' >> $T/kprobe_events" for line in definitions]
    lines += [
        "echo 1 > $T/events/tracekit_sym/enable",
        f"/share/build/vmm --repeat {VMS} /share/build/guests/mmu-on.elf > vmm.txt",
        "echo 0 > $T/events/tracekit_sym/enable",
        "cat $T/trace > trace.txt",
        "echo > $T/kprobe_events",
    ]
    return "\n".join(lines) + "\n"


def test_vmid_offset_reads_each_vms_vmid(vhost_available: None, tmp_path: Path) -> None:
    """The kprobe built from DWARF reads one distinct, plausible VMID per VM."""
    if shutil.which(CROSS + "gcc") is None:
        pytest.skip("aarch64-linux-gnu-gcc is missing (Debian package gcc-aarch64-linux-gnu)")
    vmlinux = fetch_debug_vmlinux("bookworm", (FIXTURES / "uname").read_text().strip(), print)
    share, out = tmp_path / "share", tmp_path / "out"
    subprocess.run(
        ["make", "-C", str(REPRODUCER), f"CROSS_COMPILE={CROSS}", f"O={share / 'build'}"],
        check=True,
        capture_output=True,
    )
    written = CliRunner().invoke(
        main, ["symbols", "probe-args", str(vmlinux), "-o", str(share / "probe-args")]
    )
    assert written.exit_code == 0, written.output
    args = probeargs.read_probe_args(share / "probe-args")
    (share / "vmid.sh").write_text(vmid_script(kprobe_lines(args)))
    result = run(VhostConfig(smp=2, share=share, out=out), ["sh", "/share/vmid.sh"])
    assert result.exit_status == 0, (out / "vhost-console.log").read_text()[-2000:]
    seen = [(name, int(value, 0)) for name, value in EVENT.findall((out / "trace.txt").read_text())]
    torn_down = [vmid for name, vmid in seen if name == "kvm_free_stage2_pgd"]
    assert len(torn_down) == VMS, seen
    assert len(set(torn_down)) == VMS
    for vmid in torn_down:
        assert vmid % (1 << VMID_BITS) > 0  # a real VMID, never the reserved 0
        assert vmid >> VMID_BITS > 0  # under a generation counter that starts at 1
    updates = {vmid for name, vmid in seen if name == "kvm_arm_vmid_update"}
    assert set(torn_down) <= updates
