"""Simulated mechanisms: candidate explanations as data, injected into the emulated host.

A model (TOML, docs/simulate.md) says what creates a per-CPU state, what clears it and
what it costs; the ground-truth plugin (reproducer/groundtruth/tksim.c) applies it to
the emulated machine's own instructions, so a run has a known answer, and
tracekit.simulate.predict holds any bundles, simulated or from a board, against each
model's predictions. model.py and simlog.py are standard library only (vhost run reads
them before any analysis is imported); predict.py and expected.py are analyses.
"""
