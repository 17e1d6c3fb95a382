"""What KVM itself knows and user space cannot read directly: IPA limit, VMID width, history.

- The largest IPA size a VM may ask for is KVM's answer to KVM_CHECK_EXTENSION
  (KVM_CAP_ARM_VM_IPA_SIZE) on /dev/kvm; 0 means only the default 40 bits.
- The VMID width and whether a VM has run since boot live in the VMID allocator
  (arch/arm64/kvm/vmid.c, the same in 6.1 and 6.12): `kvm_arm_vmid_bits`, the atomic
  `vmid_generation` (1 << bits from boot until the first rollover) and the bitmap
  `vmid_map` (VMIDs handed out in this generation, from 1 upwards). A kprobe reads them
  with `@symbol` fetch arguments, which needs their addresses in kallsyms, i.e. a kernel
  built with CONFIG_KALLSYMS_ALL (Debian 13 is, Debian 12 is not). The probe sits on
  kvm_dev_ioctl, which our own KVM_CHECK_EXTENSION call fires.

A host is "fresh" when no VMID was ever handed out: the generation is still the first one
and no bit past bit 0 (never used) of the map's first word is set. Elsewhere the answer is
"unknown", and every output says so.
"""

from __future__ import annotations

import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tracekit.host.cleanup import open_fd
from tracekit.host.instance import Instance
from tracekit.host.probes import KALLSYMS, define_kprobes
from tracekit.host.tracefs import INSTANCE_PREFIX, Tracefs

DEV_KVM = Path("/dev/kvm")
KVM_CHECK_EXTENSION = 0xAE03  # _IO(KVMIO, 0x03)
KVM_CAP_ARM_VM_IPA_SIZE = 165

# The allocator's variables and how the probe fetches each one.
FETCHES = {
    "kvm_arm_vmid_bits": "bits=@kvm_arm_vmid_bits:u32",
    "vmid_generation": "generation=@vmid_generation:u64",
    "vmid_map": "map0=+0(@vmid_map):x64",
}
STATE_PROBE = "tracekit/vmid_state"
TRIGGER_FUNCTION = "kvm_dev_ioctl"
FIELD = re.compile(r"\b(bits|generation|map0)=(0x[0-9a-fA-F]+|\d+)")


@dataclass
class VmidState:
    """The VMID allocator as read now; None where the kernel would not say."""

    bits: int | None
    freshness: str  # fresh, dirty, unknown
    evidence: str
    generation: int | None = None
    map0: int | None = None


def read_ipa_limit(dev_kvm: Path = DEV_KVM) -> int | None:
    """The largest IPA size KVM accepts (40 when it has no choice); None without /dev/kvm."""
    try:
        with open_fd(dev_kvm, os.O_RDWR | os.O_CLOEXEC) as fd:
            limit = fcntl.ioctl(fd, KVM_CHECK_EXTENSION, KVM_CAP_ARM_VM_IPA_SIZE)
    except OSError:
        return None
    return limit if limit > 0 else 40


# 6.12's kvm module parameter (virt/kvm/kvm_main.c, CONFIG_KVM_GENERIC_HARDWARE_ENABLING):
# with it on (the default), virtualisation is enabled at module load and stays enabled
# with no VM alive; 6.1 has no such parameter and enables per first VM.
ENABLE_VIRT_AT_LOAD = Path("/sys/module/kvm/parameters/enable_virt_at_load")


def read_enable_virt_at_load(path: Path = ENABLE_VIRT_AT_LOAD) -> str:
    """kvm.enable_virt_at_load: "yes", "no", or "absent" when the kernel has no such
    parameter (or no kvm module); "unknown" when the file cannot be read."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return "absent"
    except OSError:
        return "unknown"
    return {"Y": "yes", "N": "no", "1": "yes", "0": "no"}.get(text, "unknown")


def data_symbols(kallsyms: Path = KALLSYMS) -> set[str]:
    """Which of the allocator's variables kallsyms lists (CONFIG_KALLSYMS_ALL)."""
    found: set[str] = set()
    try:
        text = kallsyms.read_text()
    except OSError:
        return found
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] in FETCHES:
            found.add(fields[2])
    return found


def judge_freshness(fields: dict[str, int]) -> VmidState:
    """Fresh, dirty or unknown from what the probe fetched (parsed trace fields)."""
    bits = fields.get("bits")
    generation, map0 = fields.get("generation"), fields.get("map0")
    if generation is None or map0 is None:
        return VmidState(bits, "unknown", "the VMID allocator's state could not be read")
    state = VmidState(bits, "fresh", "", generation, map0)
    first_generations = {1 << bits} if bits else {1 << 8, 1 << 16}
    if generation not in first_generations:
        state.freshness = "dirty"
        state.evidence = f"vmid_generation {generation:#x}: the VMIDs have rolled over"
    elif map0 & ~1:
        state.freshness = "dirty"
        state.evidence = f"vmid_map word 0 is {map0:#x}: VMIDs were handed out since boot"
    else:
        state.evidence = f"vmid_generation {generation:#x} and an empty vmid_map: no VM ran"
    return state


def parse_state_line(trace_text: str) -> dict[str, int]:
    """The fetched values of the first vmid_state event in an instance's text trace."""
    for line in trace_text.splitlines():
        if "vmid_state:" in line:
            return {name: int(value, 0) for name, value in FIELD.findall(line)}
    return {}


def read_vmid_state(tracefs: Tracefs, kallsyms: Path = KALLSYMS) -> VmidState:
    """Fetch the allocator's variables with a one-shot kprobe; unknown where impossible."""
    symbols = data_symbols(kallsyms)
    if not symbols:
        return VmidState(
            None,
            "unknown",
            "kallsyms lists no VMID allocator variables (kernel without CONFIG_KALLSYMS_ALL)",
        )
    if not DEV_KVM.exists() or not tracefs.exists("kprobe_events"):
        return VmidState(None, "unknown", "no /dev/kvm or no kprobe_events to read them with")
    fetches = " ".join(FETCHES[name] for name in FETCHES if name in symbols)
    # A stack of its own: the probe and instance are gone before the collection starts.
    with tracefs.stack.scoped() as stack:
        scoped = Tracefs(tracefs.root, stack)
        define_kprobes(scoped, [f"p:{STATE_PROBE} {TRIGGER_FUNCTION} {fetches}"])
        instance = Instance.create(scoped, f"{INSTANCE_PREFIX}{os.getpid()}-state")
        instance.set_buffer_size_kb(64)
        instance.enable_events([STATE_PROBE])
        instance.start()
        read_ipa_limit()  # the KVM_CHECK_EXTENSION call fires the probe
        instance.stop()
        fields = parse_state_line(instance.read("trace"))
    state = judge_freshness(fields)
    if not fields:
        state.evidence = f"the probe on {TRIGGER_FUNCTION} did not fire"
    elif state.freshness == "unknown":
        state.evidence = f"kallsyms lists only {', '.join(sorted(symbols))} of the allocator"
    return state


def detect_el2_tracing(tracefs_root: Path) -> dict[str, object]:
    """Whether the hypervisor's own tracing is offered (recorded only, never used yet)."""
    candidates = ("remotes/hypervisor", "hypervisor", "events/hypervisor", "events/hyp")
    present = [rel for rel in candidates if (tracefs_root / rel).exists()]
    return {"available": bool(present), "paths": present}
