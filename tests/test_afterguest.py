"""The VMID rollover rule: a newer allocator generation than the first VMID seen."""

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
