"""The Perfetto protobuf classes tracekit uses, from the `perfetto` package's protos.

One import point, so a change in where the package keeps its generated module is a
one-line fix.
"""

from __future__ import annotations

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

CounterDescriptor = pb.CounterDescriptor
Trace = pb.Trace
TracePacket = pb.TracePacket
FtraceEvent = pb.FtraceEvent
FtraceEventBundle = pb.FtraceEventBundle
FtraceStats = pb.FtraceStats
GenericFtraceEvent = pb.GenericFtraceEvent
ProcessTree = pb.ProcessTree
TrackDescriptor = pb.TrackDescriptor
TrackEvent = pb.TrackEvent

__all__ = [
    "CounterDescriptor",
    "FtraceEvent",
    "FtraceEventBundle",
    "FtraceStats",
    "GenericFtraceEvent",
    "ProcessTree",
    "Trace",
    "TracePacket",
    "TrackDescriptor",
    "TrackEvent",
    "pb",
]
