"""Column-wise protobuf encoding (tracekit/perfetto/wire.py) against the protobuf library."""

from __future__ import annotations

import numpy as np

from tracekit.perfetto import wire
from tracekit.perfetto.protos import pb

Switch = pb.SchedSwitchFtraceEvent


def test_rows_of_fields_equal_protobufs_own_encoding() -> None:
    """Ints (negative, 64-bit, absent) and texts joined per row, as SerializeToString."""
    rng = np.random.default_rng(7)
    n = 500
    pids = rng.integers(-(2**31), 2**31, size=n)
    states = rng.integers(-(2**62), 2**62, size=n)
    names = [None if i % 7 == 0 else "task-é" * (i % 4) for i in range(n)]
    present = np.array([v is not None for v in names])
    rows = wire.join(
        [
            wire.field(1, wire.texts(names), wire.WIRE_LEN, present),
            wire.field(2, wire.varints(pids), wire.WIRE_VARINT),
            wire.field(4, wire.varints(states), wire.WIRE_VARINT),
        ]
    )
    for i in range(n):
        want = Switch(prev_pid=int(pids[i]), prev_state=int(states[i]))
        if names[i] is not None:
            want.prev_comm = names[i]
        assert rows.row(i) == want.SerializeToString(), i


def test_take_reorders_and_empties_rows() -> None:
    """take() gathers rows in a new order; rows not kept become empty."""
    rows = wire.texts(["a", "bb", "ccc"])
    picked = wire.take(rows, np.array([2, 0, 1]), np.array([True, True, False]))
    assert [picked.row(i) for i in range(3)] == [b"ccc", b"a", b""]
