"""What runs between the guest and the "after" phase: conditions that might clear the state.

- hotplug: take the guest CPUs offline and online again: PSCI CPU_OFF then CPU_ON, a
  power cycle of the core (in QEMU a CPU reset), then the secondary boot path
  (__cpu_setup's local TLBI VMALLE1). EL2 is re-initialised there (nVHE
  ___kvm_hyp_init) only where virtualisation is enabled: on 6.12 always (local TLBI
  ALLE2 and ALLE1, as the ground truth shows), on 6.1 only while a VM is alive (local
  TLBI ALLE2 and VMALLS12E1 of VMID 0), so not after the guest has gone
  (analysis/gtsignatures.toml has both).
- rollover: run throwaway MMU-off VMs (which do not create the state) until the VMID
  allocator is seen to roll over, so the stock kernel does its own full invalidation
  (__kvm_flush_vm_context, TLBI ALLE1IS): the same one the proposed fix adds. On 6.1
  (nVHE) each of these VMs, created with none alive, also re-runs the EL2 init on every
  CPU (local TLBI ALLE2 and VMALLS12E1 of VMID 0, not ALLE1: hyp-init.S), and EL2 is
  reset when it goes: a confound the decision rules name. Its first vCPU load also
  flushes with the VM's VMID still 0 (__kvm_flush_cpu_context's TLBI VMALLE1 before
  kvm_arm_vmid_update): the host's own tag on the guest CPU, once per throwaway VM.
  The VMIDs are read by a kprobe on kvm_arm_vmid_update in a small instance of its own,
  at entry and, where the kernel can (6.10+), at return: on 6.12 the function runs once
  per vCPU load, so a throwaway VM's entry shows 0 and only the return shows its VMID.
- rollover-minus-one: rollover's negative control, the same throwaway VMs one fewer, so
  the VMIDs do not roll over (no TLBI ALLE1IS): the allocator (arch/arm64/kvm/vmid.c,
  6.1 and 6.12) hands out VMIDs in order from its last one (new_vmid, find_next_zero_bit
  from cur_idx) and frees none before a rollover, so after a first VM shows VMID v, the
  2^bits - 1 - v VMs after it take the generation's last VMIDs and the next one would
  roll over. The VMIDs seen check it: no newer generation.
- tlbi:OP@TARGET (a kernel with reproducer/kpatch/): issue one EL2 invalidation through
  the series' debugfs interface: a local TLBI ALLE1 on the CPU that ran the guest, the
  same on a CPU that did not (the negative control), or TLBI VMALLS12E1IS of the dead
  guest's VMID (the one --vmid gave it), with stage 2 disabled while issued, from that
  control CPU too (a broadcast: the same invalidation reaches the guest's CPU, without
  the EL2 init that 6.1 runs on the issuing CPU when no VM is alive). On 6.12+ with
  kvm.enable_virt_at_load=0 every operation would follow 6.12's EL2 init, a local TLBI
  ALLE2 and ALLE1 on every online CPU: preflight refuses these actions there.
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
# Its return probe (6.10+: collect.KRETPROBE_ARGS), the only one that sees a new VM's VMID
# on 6.12, where the function runs once per vCPU load.
VMID_RETURN_PROBE = f"{VMID_PROBE}_ret"
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
            lambda p=online, c=cpu: _offline(p, c),
            journal.setting(online, "1"),
        )
        log.append(f"cpu{cpu} offline at {now()}")
        online.write_text("1")
        log.append(f"cpu{cpu} online at {now()}")
    return log


def _offline(online: Path, cpu: int) -> None:
    """Take one CPU offline, or one line saying why the kernel refused."""
    try:
        online.write_text("0")
    except OSError as err:
        raise TracekitError(
            f"the kernel refused to take CPU {cpu} offline ({err.strerror}); with nohz_full"
            " the timekeeping CPU (usually the boot CPU 0) must stay online: choose roles"
            " that leave it out of the hotplug"
        ) from None


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
                self.first = value
            if self.bits is None:
                # Only a guess, used when the width is not known (kvm_arm_vmid_bits from
                # kallsyms): VMIDs are 8 or 16 bits and every generation is >= 1 (vmid.c
                # VMID_FIRST_VERSION), so 16-bit ids are never below 1 << 16; but 8-bit
                # ids pass 1 << 16 after 255 generations (review of 15/17 #12).
                self.bits = 16 if value >= 1 << 16 else 8
            self.seen.append(value)

    def rolled_over(self) -> bool:
        """Whether a VMID of a newer generation than the first one has been assigned."""
        if self.first is None or self.bits is None:
            return False
        first_generation = self.first >> self.bits
        return any(value >> self.bits > first_generation for value in self.seen)


def fill_generation(
    run_batch: Callable[[int], None],
    read_ids: Callable[[], list[int]],
    known_bits: int | None,
    max_vms: int,
    echo: Callable[[str], None],
) -> tuple[VmidWatch, int]:
    """Run throwaway VMs until the generation's VMIDs are used up, one short of a rollover."""
    vmids = VmidWatch()
    run_batch(1)
    vmids.add(read_ids())
    if not vmids.seen:
        raise TracekitError(
            "--after-guest rollover-minus-one: the first throwaway VM's VMID was not seen "
            "by the probe on kvm_arm_vmid_update, so the VMs left before a rollover are "
            "unknown; use --after-guest rollover or none"
        )
    bits = known_bits or vmids.bits or 16
    vmids.bits = bits
    remaining = (1 << bits) - 1 - vmids.seen[-1] % (1 << bits)
    if 1 + remaining > max_vms:
        raise TracekitError(
            f"--after-guest rollover-minus-one needs {1 + remaining} VMs ({bits}-bit VMIDs), "
            f"more than --rollover-max-vms {max_vms}; raise it"
        )
    done = 1
    while remaining:
        batch = min(ROLLOVER_BATCH, remaining)
        run_batch(batch)
        done, remaining = done + batch, remaining - batch
        vmids.add(read_ids())
    if vmids.rolled_over():
        raise TracekitError(
            f"--after-guest rollover-minus-one: the VMIDs rolled over within {done} VMs "
            "(something else took VMIDs meanwhile, or VMIDs reserved at an earlier rollover "
            "left fewer free); the control did not hold, collect again after a reboot"
        )
    echo(f"  {done} VMs, the generation's VMIDs used up, no rollover ({bits}-bit VMIDs)")
    return vmids, done


def open_vmid_watch(tracefs: Tracefs, user: str = "rollover") -> Instance:
    """A second, small instance with only the VMID probe, read as text between batches."""
    instance = Instance.create(tracefs, f"{INSTANCE_PREFIX}{os.getpid()}-vmid-{user}")
    if not instance.has_event(VMID_PROBE):
        raise TracekitError(
            "--after-guest rollover reads VMIDs with a kprobe on kvm_arm_vmid_update, which "
            "this kernel does not offer; use --after-guest hotplug or none"
        )
    probes = [VMID_PROBE]
    if instance.has_event(VMID_RETURN_PROBE):
        probes.append(VMID_RETURN_PROBE)
    instance.enable_events(probes)
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
    read_ids: Callable[[], list[int]],
    max_vms: int,
    echo: Callable[[str], None],
    known_bits: int | None = None,
) -> tuple[VmidWatch, int]:
    """Run batches of throwaway VMs until the VMID generation changes; returns VMs run.
    `known_bits`: the host's VMID width where it is known (never guessed then)."""
    vmids = VmidWatch(bits=known_bits)
    done = 0
    started = time.monotonic()
    while done < max_vms:
        batch = min(ROLLOVER_BATCH, max_vms - done)
        run_batch(batch)
        done += batch
        vmids.add(read_ids())
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


# The debug series' interface (reproducer/kpatch/): one write issues one operation at EL2.
MAINT_OP = Path("/sys/kernel/debug/kvm/arm64_debug_maint/op")
# --after-guest tlbi:OP@TARGET: the operation, and where (or for what) it is issued.
TLBI_ACTIONS = {
    "tlbi:alle1@guest-cpu": ("alle1", "guest-cpu"),
    "tlbi:vmalls12e1is@vmid": ("vmalls12e1is", "vmid"),
    "tlbi:alle1@other-cpu": ("alle1", "other-cpu"),
}
# What the interface's errno means, for the one line a user gets.
_MAINT_ERRORS = {
    errno.EPERM: "this KVM mode refuses it (protected mode)",
    errno.ENXIO: "that CPU is offline",
    errno.ERANGE: "the VMID is wider than this host's VMIDs",
    errno.EINVAL: (
        "the interface refused the request as malformed: an unknown operation, a CPU number "
        "this kernel does not have, a number too large for its field, or a field the "
        "operation does not take (the series checks each field since review S4; a kernel "
        "built from another checkout's reproducer/kpatch/ may differ)"
    ),
}


def tlbi_request(action: str, cpu: int, vmid: int | None) -> str:
    """The line written to the interface for a tlbi: action on `cpu` (stage 2 off)."""
    op, target = TLBI_ACTIONS[action]
    if target != "vmid":
        return f"{op} {cpu}"
    if vmid is None:
        raise TracekitError(
            f"--after-guest {action} invalidates the dead guest's VMID, which the collector "
            "knows only when it chose it: give --vmid N"
        )
    # Stage 2 disabled while issued, as KVM's own __kvm_tlb_flush_vmid does in nVHE.
    return f"{op} {cpu} {vmid} 0"


def issue_maint(request: str, now: Callable[[], int], path: Path = MAINT_OP) -> list[str]:
    """Write one request to the interface; returns its log lines (request, times)."""
    if not path.exists():
        raise TracekitError(
            f"{path} is missing: --after-guest tlbi:... needs a kernel with tracekit's debug "
            "series (reproducer/kpatch/) booted with kvm-arm.debug_maint=1"
        )
    started = now()
    try:
        path.write_text(request + "\n")
    except OSError as err:
        code = err.errno or 0
        reason = _MAINT_ERRORS.get(code, os.strerror(code))
        name = errno.errorcode.get(code, str(code))
        raise TracekitError(f"EL2 maintenance {request!r} failed ({name}): {reason}") from None
    return [f"{request} issued at {started}, done at {now()}"]
