"""Column-wise protobuf encoding (tracekit/perfetto/wire.py) against the protobuf library."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest

from tracekit.perfetto import wire
from tracekit.perfetto.protos import pb

Switch = pb.SchedSwitchFtraceEvent


def _rows(piece: wire.Piece) -> list[bytes]:
    """Each row's bytes, the piece written into place."""
    data, starts = wire.assemble(piece)
    return [data[a:b].tobytes() for a, b in itertools.pairwise(starts.tolist())]


@pytest.mark.parametrize("longest", [4, 200])  # short texts (padded table), long (by index)
@pytest.mark.parametrize("n", [100, 500, 6000])  # wire's paths for few rows and for many
def test_rows_of_fields_equal_protobufs_own_encoding(longest: int, n: int) -> None:
    """Ints (negative, 64-bit, absent) and texts joined per row, as SerializeToString."""
    rng = np.random.default_rng(7)
    pids = rng.integers(-(2**31), 2**31, size=n)
    states = rng.integers(-(2**62), 2**62, size=n)
    names = [None if i % 7 == 0 else "task-é" * (i % 4) + "x" * (i % longest) for i in range(n)]
    have = np.flatnonzero([v is not None for v in names])
    texts = wire.text_codes(pl.Series([names[i] for i in have], dtype=pl.String))
    piece = wire.seq(
        [
            wire.spread(wire.field(1, wire.texts(texts)), have, n),
            wire.varints(pids, wire.tag(2, wire.WIRE_VARINT)),
            wire.varints(states, wire.tag(4, wire.WIRE_VARINT)),
        ]
    )
    for i, got in enumerate(_rows(piece)):
        want = Switch(prev_pid=int(pids[i]), prev_state=int(states[i]))
        if names[i] is not None:
            want.prev_comm = names[i]
        assert got == want.SerializeToString(), i


def test_interleave_places_each_piece_at_its_rows() -> None:
    """Rows made of two pieces come out in the order of the indices given."""
    odd = wire.varints(np.array([1, 300]), wire.tag(1, wire.WIRE_VARINT))
    even = wire.constant(b"ab", 2)
    piece = wire.interleave(4, [(np.array([1, 3]), odd), (np.array([0, 2]), even)])
    assert _rows(piece) == [b"ab", b"\x08\x01", b"ab", b"\x08\xac\x02"]


def test_generic_list_field_is_the_per_value_text() -> None:
    """A list of integers (syscall args) as one text per row, the way events._list_text
    writes it, whether polars joins the column (no null item) or Python does (one); a
    fixed array (trace.dat's syscall args) the same way."""
    from tracekit.perfetto import columns, events
    from tracekit.perfetto.protos import FtraceEvent

    lists = [[1, 2, 2**64 - 1], [], None, [7]]
    arrays = [[1, 2, 2**64 - 1], None, [0, 0, 5]]
    listed, fixed = pl.List(pl.UInt64), pl.Array(pl.UInt64, 3)
    kinds = [(lists, listed), ([*lists, [None, 3]], listed), (arrays, fixed),
             ([*arrays, [None, 1, 2]], fixed)]  # fmt: skip
    for args, dtype in kinds:
        n = len(args)
        table = pl.DataFrame(
            {"row": range(n), "ts": range(n), "cpu": [0] * n, "common_pid": [1] * n,
             "args": pl.Series(args, dtype=dtype)}
        )  # fmt: skip
        plan = events.plan_event("sys_enter_x", table.schema)
        got = [
            FtraceEvent.FromString(r).generic for r in _rows(columns.encode_rows(table, plan, None))
        ]
        for row, values in zip(got, args, strict=True):
            want = [] if values is None else [events._list_text(values)]
            assert [f.str_value for f in row.field] == want
