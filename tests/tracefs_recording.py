"""An instance set up the way `tracekit collect` sets one up, for the real-tracefs tests."""

from __future__ import annotations

from tracekit.host.cleanup import CleanupStack
from tracekit.host.instance import Instance
from tracekit.host.tracefs import Tracefs


def recording_instance(stack: CleanupStack, buffer_kb: int, events: list[str]) -> Instance:
    """A new instance as collect sets one up: buffer, boot clock, task names, these events."""
    instance = Instance.create(Tracefs.open(stack))
    instance.set_buffer_size_kb(buffer_kb)
    instance.set_trace_clock()
    instance.record_task_names()
    instance.enable_events(events)
    return instance
