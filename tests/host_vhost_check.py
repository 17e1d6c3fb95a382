"""Run INSIDE the emulated arm64 host: kprobes through tracekit's tracefs layer, preflight.

This machine's kernel has no kprobe_events, Debian's arm64 kernels do. Prints key=value
lines that tests/test_host_tracefs.py checks, and leaves a raw capture in ./capture.
"""

from __future__ import annotations

from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.host import preflight
from tracekit.host.cleanup import CleanupStack
from tracekit.host.instance import Instance
from tracekit.host.probes import KernelSymbols, define_kprobes, remove_leftovers
from tracekit.host.rawcapture import RawCapture
from tracekit.host.tracefs import Tracefs, snapshot


def report_preflight() -> None:
    """What preflight reads on a real arm64 kernel (KVM mode, cores, emulation)."""
    facts = preflight.read_host_facts(isolated_cpus=[])
    print(f"kvm_mode={facts.kvm.mode}")
    print(f"cores={','.join(sorted({core.name for core in facts.cpus}))}")
    print(f"emulation={facts.emulation.kind}")


def main() -> None:
    """Define, enable, capture and remove kprobes; report what was seen."""
    report_preflight()
    with CleanupStack() as stack:
        tracefs = Tracefs.open(stack)
        before = snapshot(tracefs.root)
        remove_leftovers(tracefs)
        symbols = KernelSymbols.load(tracefs)
        print(f"has_kvm_free_stage2_pgd={symbols.has('kvm_free_stage2_pgd')}")
        probes = define_kprobes(
            tracefs,
            ["p:tracekit/tk_open do_sys_openat2", "r:tracekit/tk_open_ret do_sys_openat2 $retval"],
        )
        instance = Instance.create(tracefs)
        instance.set_trace_clock()
        instance.set_buffer_size_kb(256)
        instance.record_task_names()
        instance.enable_events([probe.group_event for probe in probes.defined])
        capture = RawCapture(instance, Path("capture"))
        capture.start()
        instance.start()
        Path("/proc/self/stat").read_text()  # an openat: both probes fire
        instance.write_marker("tracekit-vhost-marker")
        instance.stop()
        trace = instance.read("trace")  # a non-consuming read, before the capture drains
        print(f"trace_has_entry={'tk_open:' in trace}")
        print(f"trace_has_return={'tk_open_ret:' in trace}")
        print(f"top_level_enable={tracefs.read('events/tracekit/tk_open/enable').strip()}")
        capture.finish()
        print(f"function_graph={instance.function_graph_unavailable() or 'available'}")
        try:
            define_kprobes(tracefs, ["p:tracekit/tk_typo tracekit_no_such_function"])
        except TracekitError as err:
            print(f"bad_symbol={err}")
    print(f"kprobe_events_after={tracefs.read('kprobe_events').strip()!r}")
    print(f"restored={snapshot(tracefs.root) == before}")


if __name__ == "__main__":
    main()
