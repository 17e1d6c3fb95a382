"""Perfetto export: any recorded trace into the Perfetto UI, with tracekit's tracks on it.

- export.py: one export (one or several traces' tables -> .pftrace), window, symbols
- bundle.py: a whole bundle as one timeline (every run, or --run / --phase)
- runs.py: a bundle's phases and runs as tracks, and each run's group
- writer.py: the streaming packet writer and reader (bounded memory)
- events.py: one kernel event -> dedicated FtraceEvent message or generic event
- ftrace.py: per-CPU bundles, lost events, loss counters, interned kernel symbols
- system.py: SystemInfo (kernel release) and the process/thread tree
- tracks.py: the track writer, nested spans in lanes, one trace's tracks (time in
  guest, probe windows, losses)
- scenario.py: VM lifecycles with teardown spans (IPA size, VMID, kernel path),
  stage-2 flushes per vCPU, TLBI-loop guests per CPU
- latency.py: cyclictest latencies as counters (times rebuilt), worst wake-ups as slices
- probe.py: the TLBI probe's samples as counters
- exits.py: names for KVM exit reasons
- validate.py: the checks trace_processor's import rules imply (`--check`)
- serve.py: `--open`, one file served once on 127.0.0.1:9001 for ui.perfetto.dev

Only serve.py and writer.py work without polars; import the others when exporting.
"""
