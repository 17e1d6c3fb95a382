"""Raw capture of a real tracefs instance, checked with a decoder written here.

Needs root and tracefs (skipped otherwise). The decoder follows the ring-buffer page
layout that header_page describes, independently of tracekit's own ingest, so a wrong
page, a lost partial page or a missing marker shows up here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from ringbuf_decoder import decoded_events
from tracefs_recording import recording_instance

from tracekit.errors import TracekitError
from tracekit.host.cleanup import CleanupStack
from tracekit.host.instance import Instance, parse_cpu_stats
from tracekit.host.rawcapture import RawCapture
from tracekit.host.tracefs import KPTR_RESTRICT, Tracefs, snapshot

# `root` (skips without root or tracefs) and `unchanged`.
pytest_plugins = ["host_tracefs_support"]


def test_raw_capture_holds_the_events_markers_and_metadata(
    tmp_path: Path, unchanged: dict[str, object]
) -> None:
    capture_dir = tmp_path / "capture"
    markers = [f"tracekit-test-marker-{n:04d}" for n in range(300)]
    with CleanupStack() as stack:
        instance = recording_instance(
            stack, 1024, ["sched/sched_switch", "sched/sched_waking", "irq"]
        )
        capture = RawCapture(instance, capture_dir)
        capture.start()
        assert json.loads((capture_dir / "capture.json").read_text())["complete"] is False
        instance.start()
        for marker in markers[:150]:
            instance.write_marker(marker)
        subprocess.run(["true"], check=True)  # a fork, an exec, a few context switches
        first = capture.drain()
        for marker in markers[150:]:
            instance.write_marker(marker)
        # The last marker sits on a partly filled page: finish() must still capture it.
        instance.write_marker("tracekit-last-marker")
        instance.stop()
        capture.finish()
        stats = {cpu: instance.cpu_stats(cpu) for cpu in instance.cpus()}
        instance_files = instance.path
        subbuf = instance_files / "buffer_subbuf_size_kb"  # Linux 6.8+
        subbuf_text = subbuf.read_text() if subbuf.exists() else ""
    assert first.total_pages > 0

    manifest = json.loads((capture_dir / "capture.json").read_text())
    assert manifest["format"] == "tracekit-raw-capture" and manifest["version"] == 1
    assert manifest["complete"] is True
    assert manifest["trace_clock"] == "boot"
    expected_page = int(subbuf_text) * 1024 if subbuf_text else os.sysconf("SC_PAGESIZE")
    assert manifest["page_size"] == expected_page
    assert manifest["instance"] == instance.name
    assert {"sched/sched_switch", "irq/irq_handler_entry"} <= set(manifest["events"])
    for event in [*manifest["events"], "ftrace/print"]:
        assert (capture_dir / "events" / event / "format").is_file(), event
    for name in ("header_page", "header_event", "saved_cmdlines", "printk_formats", "kallsyms"):
        assert (capture_dir / name).stat().st_size > 0, name
    cmdlines = (capture_dir / "saved_cmdlines").read_text().splitlines()
    assert cmdlines and all(re.fullmatch(r"\d+ \S.*", line) for line in cmdlines)

    decoded = decoded_events(capture_dir)
    names = [name for events in decoded.values() for _, name, _ in events]
    assert "sched/sched_switch" in names and "sched/sched_waking" in names
    printed = [
        payload for events in decoded.values() for _, n, payload in events if n == "ftrace/print"
    ]
    found = [m for m in markers if any(m.encode() + b"\n" in p for p in printed)]
    assert found == markers
    assert any(b"tracekit-last-marker" in p for p in printed)
    for events in decoded.values():
        stamps = [ts for ts, _, _ in events]
        assert stamps == sorted(stamps), "page timestamps go back in time"
    for cpu in manifest["cpus"]:
        copied = parse_cpu_stats((capture_dir / "per_cpu" / f"cpu{cpu}" / "stats").read_text())
        assert copied["overrun"] == 0 and copied["dropped events"] == 0
        assert copied["read events"] == stats[cpu]["read events"]


def test_capture_refuses_a_directory_that_is_not_empty(
    tmp_path: Path, unchanged: dict[str, object]
) -> None:
    (tmp_path / "old-file").write_text("x")
    with pytest.raises(TracekitError, match="is not empty"), CleanupStack() as stack:
        RawCapture(Instance.create(Tracefs.open(stack)), tmp_path).start()


def test_kallsyms_copy_lifts_kptr_restrict_only_meanwhile(root: Path, tmp_path: Path) -> None:
    original = KPTR_RESTRICT.read_text().strip()
    KPTR_RESTRICT.write_text("2")
    try:
        before = snapshot(root)
        with CleanupStack() as stack:
            instance = Instance.create(Tracefs.open(stack))
            capture = RawCapture(instance, tmp_path / "capture")
            capture.start()
            capture.finish()
            assert KPTR_RESTRICT.read_text().strip() == "2"
        first = (tmp_path / "capture" / "kallsyms").read_text().split(maxsplit=1)[0]
        assert int(first, 16) != 0
        assert snapshot(root) == before
    finally:
        KPTR_RESTRICT.write_text(original)
