"""Perfetto export: any recorded trace into the Perfetto UI, with tracekit's tracks on it.

- export.py: one export (tables -> .pftrace), window, kernel symbols
- writer.py: the streaming packet writer and reader (bounded memory)
- events.py: one kernel event -> dedicated FtraceEvent message or generic event
- ftrace.py: per-CPU bundles, lost events, loss counters, interned kernel symbols
- system.py: SystemInfo (kernel release) and the process/thread tree
- tracks.py: tracekit's tracks (runs, VM lifecycle, time in guest, probe, losses)
- exits.py: names for KVM exit reasons
- validate.py: the checks trace_processor's import rules imply (`--check`)
- serve.py: `--open`, one file served once on 127.0.0.1:9001 for ui.perfetto.dev

Only serve.py and writer.py work without polars; import the others when exporting.
"""
