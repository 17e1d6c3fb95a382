"""Property-based tests (hypothesis) of the two readers users feed the most.

Ring buffer: pages of random records (small and big events, time extends, absolute
stamps, padding) built by the test encoder, whose expected events and clock are known
by construction; then the same pages cut short or with a byte flipped. ftrace text:
event lines with awkward comm names (dashes, digits, dots, colons, brackets, spaces,
UTF-8), with and without the irq-info column, in tracefs and trace-cmd layouts.
"""

from __future__ import annotations

import string
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ringbuf_pages import HE, HP, PAGE, PageWriter, payload

import tracekit
from tracekit.ingest import ringbuf

SETTINGS = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# One record of a page: (kind, delta or value, payload words, big).
records = st.one_of(
    st.tuples(st.just("event"), st.integers(0, (1 << 27) - 1), st.integers(1, 40), st.booleans()),
    st.tuples(st.just("extend"), st.integers(1 << 27, 1 << 40), st.just(0), st.just(False)),
    st.tuples(st.just("stamp"), st.integers(0, 1 << 56), st.just(0), st.just(False)),
    st.tuples(st.just("pad"), st.integers(1, (1 << 27) - 1), st.integers(1, 30), st.just(False)),
)
pages = st.lists(
    st.tuples(st.integers(0, 1 << 50), st.lists(records, max_size=20)), min_size=1, max_size=6
)


def build(spec: list[tuple[int, list[tuple[str, int, int, bool]]]]) -> tuple[bytes, list]:
    """The pages, and the expected (ts, tag, length, page) of every event in order.

    Each event's payload starts with a unique tag, so order and identity both show.
    """
    out, expected, tag = [], [], 0
    for page_no, (page_ts, recs) in enumerate(spec):
        w, clock = PageWriter(ts=page_ts), page_ts
        for kind, value, words, big in recs:
            if kind == "event":
                tag += 1
                w.event(value, payload(tag, 4 * words), big=big)
                clock += value
                expected.append((clock, tag, 4 * words, page_no))
            elif kind == "extend":
                w.extend(value)
                clock += value
            elif kind == "stamp":
                w.stamp(value)
                clock = value  # the page's top bits are 0 here
            else:
                w.padding(value, 4 * words + 4)
                clock += value  # trace-cmd counts a padding's delta too
        out.append(w.page())
    return b"".join(out), expected


def decoded(buf: bytes, **kw: object) -> list[tuple[int, int, int, int]]:
    """(ts, tag, length, page) of every event tracekit decodes from buf."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    rec = ringbuf.decode_pages(arr, HP, HE, page_size=PAGE, **kw)  # type: ignore[arg-type]
    tags = [struct.unpack_from("<H", buf, int(p))[0] for p in rec.payload]
    return list(zip(rec.ts.tolist(), tags, rec.length.tolist(), rec.page.tolist(), strict=True))


@SETTINGS
@given(pages)
def test_pages_decode_to_what_was_written(spec: list) -> None:
    """Every event, in order, with its clock (deltas, extends, stamps, padding) and length."""
    buf, expected = build(spec)
    assert decoded(buf) == expected


@SETTINGS
@given(pages, st.data())
def test_a_cut_short_buffer_is_refused_or_salvaged_to_its_whole_pages(
    spec: list, data: st.DataObject
) -> None:
    """A cut inside a page: an error saying so; salvage keeps the whole pages before it."""
    buf, expected = build(spec)
    cut = data.draw(st.integers(1, len(buf) - 1).filter(lambda n: n % PAGE))
    with pytest.raises(ValueError, match="not a whole number of 4096-byte pages"):
        decoded(buf[:cut])
    kept = cut // PAGE
    assert decoded(buf[:cut], salvage=True) == [e for e in expected if e[3] < kept]


@SETTINGS
@given(pages, st.data())
def test_a_flipped_byte_never_breaks_the_pages_before_it(spec: list, data: st.DataObject) -> None:
    """A damaged byte: a decode or a ValueError naming an offset at or after the damaged
    page; salvage never raises and keeps every event of the pages before it."""
    buf, expected = build(spec)
    at = data.draw(st.integers(0, len(buf) - 1))
    bad = bytearray(buf)
    bad[at] ^= data.draw(st.integers(1, 255))
    first_bad = at // PAGE * PAGE
    try:
        decoded(bytes(bad))
    except ValueError as err:
        offset = int(str(err).split(":")[0].removeprefix("offset "))
        assert first_bad <= offset < len(buf)
    kept = decoded(bytes(bad), salvage=True)
    before = [e for e in expected if e[3] < at // PAGE]
    assert [e for e in kept if e[3] < at // PAGE] == before


# Comm names the kernel allows and the text layout makes awkward: `-digits` inside,
# dots, colons, brackets, parentheses, inner spaces, UTF-8. Leading or trailing spaces
# are padding in the layout itself, so a comm never shows them.
comms = st.text(
    alphabet=string.ascii_letters + string.digits + "-_/.:+ éß[]()", min_size=1, max_size=15
).filter(lambda c: c == c.strip())
lines = st.lists(
    st.tuples(
        comms,
        st.integers(0, 4_000_000),  # pid
        st.integers(0, 255),  # cpu
        st.integers(0, 99_999_999),  # microseconds since boot, whole and fraction
        st.sampled_from(["sched_switch", "sys_enter", "kvm_exit", "print"]),
        st.sampled_from(["", "prev_comm=x prev_pid=1", "NR 3 (3, 0)", "a: b: c"]),
    ),
    min_size=1,
    max_size=30,
)


def text_line(layout: str, comm: str, pid: int, cpu: int, us: int, event: str, fields: str) -> str:
    """One event line as tracefs (`trace`, irq-info column) or `trace-cmd report` prints it."""
    ts = f"{us // 1_000_000:5d}.{us % 1_000_000:06d}"
    task = f"{comm:>16}-{pid:<7}"
    if layout == "tracefs":
        return f"{task} [{cpu:03d}] d..2. {ts}: {event}: {fields}".rstrip()
    return f"{task} [{cpu:03d}] {ts}: {event}: {fields}".rstrip()


@SETTINGS
@given(lines, st.sampled_from(["tracefs", "trace-cmd"]))
def test_text_lines_give_back_their_task_cpu_time_and_event(
    tmp_path: Path, rows: list, layout: str
) -> None:
    """Whatever the comm, every line comes back with its comm, common_pid, CPU, time and event."""
    path = tmp_path / "trace.txt"
    path.write_text("\n".join(text_line(layout, *r) for r in rows) + "\n", encoding="utf-8")
    ev = tracekit.open(path, use_cache=False).events
    got = list(
        zip(*(ev[c].to_list() for c in ("comm", "common_pid", "cpu", "ts", "event")), strict=True)
    )
    assert got == [(c, p, cpu, us * 1000, e) for c, p, cpu, us, e, _ in rows]
