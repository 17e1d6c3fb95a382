"""What runs between the guest and the "after" phase: conditions that might clear the state.

- hotplug: take the guest CPUs offline and online again. This re-initialises EL2 on
  them (with invalidations that differ between kernel versions) and on real boards
  usually power-cycles the core.
- rollover: run throwaway MMU-off VMs (which do not create the state) until the VMID
  allocator is seen to roll over, so the stock kernel does its own full invalidation
  (__kvm_flush_vm_context, TLBI ALLE1IS): the same one the proposed fix adds. The VMIDs
  are read by a kprobe on kvm_arm_vmid_update in a small instance of its own.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.host import journal
from tracekit.host.cleanup import CleanupStack
from tracekit.host.instance import Instance
from tracekit.host.tracefs import INSTANCE_PREFIX, Tracefs

VMID_PROBE = "tracekit/kvm_arm_vmid_update"
VMID_VALUE = re.compile(rb"vmid_id=(\d+)")
# VMs per VMM invocation: small enough for progress lines, large enough to amortise.
ROLLOVER_BATCH = 64


def hotplug(cpus: tuple[int, ...], stack: CleanupStack, now: Callable[[], int]) -> list[str]:
    """Take each CPU offline and online again; returns a log line per transition."""
    log = []
    for cpu in cpus:
        online = Path(f"/sys/devices/system/cpu/cpu{cpu}/online")
        if not online.exists():
            raise TracekitError(f"CPU {cpu} cannot be hot-unplugged on this host")
        stack.change(
            f"bring CPU {cpu} back online",
            lambda p=online: p.write_text("1"),
            lambda p=online: p.write_text("0"),
            journal.setting(online, "1"),
        )
        log.append(f"cpu{cpu} offline at {now()}")
        online.write_text("1")
        log.append(f"cpu{cpu} online at {now()}")
    return log


@dataclass
class VmidWatch:
    """VMIDs seen so far: the allocator's generation is the bits above the VMID width."""

    first: int | None = None
    bits: int | None = None
    seen: list[int] = field(default_factory=list)

    def add(self, values: list[int]) -> None:
        """Record VMID ids (generation | vmid); 0 is a VM not yet given one."""
        for value in values:
            if value == 0:
                continue
            if self.first is None:
                # VMIDs are 8 or 16 bits wide and every generation is >= 1 (vmid.c starts
                # at VMID_FIRST_VERSION), so 16-bit ids are never below 1 << 16.
                self.first = value
                self.bits = 16 if value >= 1 << 16 else 8
            self.seen.append(value)

    def rolled_over(self) -> bool:
        """Whether a VMID of a newer generation than the first one has been assigned."""
        if self.first is None or self.bits is None:
            return False
        first_generation = self.first >> self.bits
        return any(value >> self.bits > first_generation for value in self.seen)


def open_vmid_watch(tracefs: Tracefs) -> Instance:
    """A second, small instance with only the VMID probe, read as text between batches."""
    instance = Instance.create(tracefs, f"{INSTANCE_PREFIX}{os.getpid()}-vmid")
    if not instance.has_event(VMID_PROBE):
        raise TracekitError(
            "--after-guest rollover reads VMIDs with a kprobe on kvm_arm_vmid_update, which "
            "this kernel does not offer; use --after-guest hotplug or none"
        )
    instance.enable_events([VMID_PROBE])
    instance.start()
    return instance


def read_vmids(instance: Instance) -> list[int]:
    """Consume the watch instance's trace_pipe and return the VMID ids it printed."""
    fd = os.open(instance.path / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError as err:
                if err.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                raise
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return [int(m) for m in VMID_VALUE.findall(b"".join(chunks))]


def rollover(
    run_batch: Callable[[int], None],
    watch: Instance,
    max_vms: int,
    echo: Callable[[str], None],
) -> tuple[VmidWatch, int]:
    """Run batches of throwaway VMs until the VMID generation changes; returns VMs run."""
    vmids = VmidWatch()
    done = 0
    started = time.monotonic()
    while done < max_vms:
        batch = min(ROLLOVER_BATCH, max_vms - done)
        run_batch(batch)
        done += batch
        vmids.add(read_vmids(watch))
        if vmids.rolled_over():
            echo(f"  rollover seen after {done} VMs ({vmids.bits}-bit VMIDs)")
            return vmids, done
        if done % (ROLLOVER_BATCH * 4) == 0:
            expected = f" of about {1 << vmids.bits}" if vmids.bits else ""
            latest = vmids.seen[-1] if vmids.seen else 0
            rate = done / max(time.monotonic() - started, 1e-9)
            echo(f"  {done}{expected} VMs, latest VMID id {latest:#x}, {rate:.1f} VMs/s")
    raise TracekitError(
        f"no VMID rollover seen after {max_vms} VMs ({vmids.bits or '?'}-bit VMIDs); "
        "raise --rollover-max-vms (16-bit VMIDs need about 65536 VMs)"
    )
