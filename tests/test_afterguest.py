"""The VMID rollover rule: a newer allocator generation than the first VMID seen."""

import pytest

from tracekit.errors import TracekitError
from tracekit.host.afterguest import VmidWatch


def test_eight_bit_rollover() -> None:
    watch = VmidWatch()
    watch.add([0, 0x101, 0x102, 0x1FF])
    assert watch.bits == 8 and not watch.rolled_over()
    watch.add([0x201])
    assert watch.rolled_over()


def test_sixteen_bit_ids_are_not_mistaken_for_generations() -> None:
    watch = VmidWatch()
    watch.add([0x10001, 0x10002, 0x1FFFF])
    assert watch.bits == 16 and not watch.rolled_over()
    watch.add([0x20001])
    assert watch.rolled_over()


def test_unassigned_vmids_are_ignored() -> None:
    watch = VmidWatch()
    watch.add([0, 0])
    assert watch.first is None and not watch.rolled_over()


# --- rollover and its control against a model of arch/arm64/kvm/vmid.c ---------------------


class AllocatorModel:
    """vmid.c's first generations: VMIDs in order from cur_idx, none freed, 0 never given.

    Per VM the probe prints what 6.12 shows: kvm_arm_vmid_update runs once per vCPU load,
    so the entry probe reads 0 and only the return probe (6.10+, `return_probe`) reads
    the VMID given. (6.1 calls it before every guest entry: later entries show it.)
    """

    def __init__(self, bits: int, return_probe: bool, used: int = 0) -> None:
        self.bits, self.return_probe = bits, return_probe
        self.generation = 1 << bits
        self.next_vmid = used + 1
        self.printed: list[int] = []
        self.vms = 0

    def run_batch(self, count: int) -> None:
        """`count` VMs created, run and destroyed one after another."""
        for _ in range(count):
            if self.next_vmid == 1 << self.bits:  # out of VMIDs: a new generation
                self.generation += 1 << self.bits
                self.next_vmid = 1
            vmid = self.generation | self.next_vmid
            self.next_vmid += 1
            self.vms += 1
            self.printed += [0, vmid] if self.return_probe else [0]

    def read(self) -> list[int]:
        """What the watch instance printed since the last read."""
        out, self.printed = self.printed, []
        return out


def test_rollover_is_seen_on_612_only_through_the_return_probe() -> None:
    from tracekit.host.afterguest import rollover

    without = AllocatorModel(8, return_probe=False)
    with pytest.raises(TracekitError, match="no VMID rollover seen after 1024 VMs"):
        rollover(without.run_batch, without.read, 1024, lambda _: None)
    model = AllocatorModel(8, return_probe=True, used=3)  # the guest and two others ran
    watch, vms = rollover(model.run_batch, model.read, 1024, lambda _: None)
    assert watch.rolled_over() and watch.bits == 8 and vms == 256  # batches of 64


def test_rollover_minus_one_uses_up_the_generation_without_rolling_over() -> None:
    from tracekit.host.afterguest import fill_generation

    lines: list[str] = []
    model = AllocatorModel(8, return_probe=True, used=3)
    watch, vms = fill_generation(model.run_batch, model.read, None, 1024, lines.append)
    assert vms == 255 - 3 and model.next_vmid == 256  # VMIDs 4..255 taken
    assert not watch.rolled_over() and watch.seen[-1] == 0x1FF
    model.run_batch(1)  # the one VM more is the rollover
    assert model.generation == 0x200
    assert "no rollover (8-bit VMIDs)" in lines[-1]


def test_rollover_minus_one_refuses_when_no_vmid_is_seen() -> None:
    from tracekit.host.afterguest import fill_generation

    model = AllocatorModel(8, return_probe=False)
    with pytest.raises(TracekitError, match="first throwaway VM's VMID was not seen"):
        fill_generation(model.run_batch, model.read, 8, 1024, lambda _: None)


def test_rollover_minus_one_refuses_a_budget_too_small() -> None:
    from tracekit.host.afterguest import fill_generation

    model = AllocatorModel(16, return_probe=True)
    with pytest.raises(TracekitError, match="needs 65535 VMs"):
        fill_generation(model.run_batch, model.read, 16, 70000 - 10000, lambda _: None)


def test_a_known_width_is_used_not_guessed() -> None:
    """Review of 15/17 #12: 8-bit ids pass 1 << 16 after 255 generations, where the guess
    reads 16 bits and misses the next rollover; with the width known (kallsyms'
    kvm_arm_vmid_bits) it is used as given, for the watch and for rollover()."""
    from tracekit.host.afterguest import rollover

    late = 256 << 8  # generation 256 of 8-bit VMIDs
    guessed = VmidWatch()
    guessed.add([late | 1, (late + 256) | 1])
    assert guessed.bits == 16 and not guessed.rolled_over()
    known = VmidWatch(bits=8)
    known.add([late | 1, (late + 256) | 1])
    assert known.bits == 8 and known.rolled_over()
    model = AllocatorModel(8, return_probe=True, used=3)
    watch, _ = rollover(model.run_batch, model.read, 1024, lambda _: None, known_bits=8)
    assert watch.bits == 8 and watch.rolled_over()
