"""The host side: runs as root on the arm64 host, with only stdlib, click and pyelftools.

Nothing here may import polars or perfetto. The layers, bottom up:

- cleanup.py: the undo stack; every change's undo is pushed on it before the change.
- journal.py: the same undo records on disk (/run/tracekit), for the run after a SIGKILL.
- tracefsio.py: tracefs below the stack (mounts, one-write writes, probe removal, umount),
  shared by tracefs.py and journal.py.
- tracefs.py: find or mount tracefs, restorable writes, instances, `snapshot()`.
- instance.py: tracekit's own instance (buffers, clock, events, filters, markers).
- probes.py: kprobes/uprobes in the `tracekit` group, and leftovers of killed runs.
- rawcapture.py: per-CPU ring-buffer pages into a raw capture directory.
- preflight.py: read-only facts (kernel, cores, KVM mode, isolation, emulated or not).

A run looks like::

    with CleanupStack.journaled() as stack:
        tracefs = Tracefs.open(stack)
        remove_leftovers(tracefs)  # dead runs' journals, instances and probes
        define_kprobes(tracefs, ["p:tracekit/free kvm_free_stage2_pgd"])
        instance = Instance.create(tracefs)
        ...  # buffer size, clock, events, capture.start(), instance.start()
"""
