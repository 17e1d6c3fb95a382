"""Export of real traces to Perfetto protos: every event, its fields, tasks, losses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from perfetto_support import ftrace_events

import tracekit
from tracekit.errors import TracekitError
from tracekit.perfetto.export import export_trace, parse_window
from tracekit.perfetto.ftrace import BUNDLE_EVENTS, write_ftrace
from tracekit.perfetto.protos import TracePacket
from tracekit.perfetto.writer import PacketWriter, read_packets

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"
# A run from another directory imports this checkout's tracekit, not an installed one.
_HERE_ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
TRACES = ["small.v6.dat", "small.v7.dat", "small.v7zstd.dat", "rawcap", "overrun.v7zstd.dat"]


def _packets(path: Path) -> list[Any]:
    """Every packet of a .pftrace, decoded."""
    return [TracePacket.FromString(raw) for raw in read_packets(path)]


def _events(packets: list[Any]) -> list[tuple[int, Any]]:
    """(cpu, FtraceEvent) of every ftrace event, compact sched rebuilt as the importer does."""
    return ftrace_events(packets)


def _name(event: Any) -> str:
    """Event type of an FtraceEvent."""
    kind = event.WhichOneof("event")
    return event.generic.event_name if kind == "generic" else kind


@pytest.fixture(scope="module", params=TRACES)
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(trace, packets) of one fixture's export."""
    trace = tracekit.open(FIXTURES / request.param, use_cache=False)
    out = tmp_path_factory.mktemp("pf") / "out.pftrace"
    export_trace(trace, out)
    return trace, _packets(out)


def test_every_event_is_exported_per_cpu(exported: tuple) -> None:
    """Counts per (event type, CPU) equal the source trace's."""
    trace, packets = exported
    got = Counter((_name(e), cpu) for cpu, e in _events(packets))
    want = Counter(
        {(n, c): k for n, c, k in trace.events.group_by("event", "cpu").len().iter_rows()}
    )
    assert got == want


def test_timestamps_and_pids_round_trip_without_common_flags(exported: tuple) -> None:
    """Each event keeps its ts and common_pid; common_flags is never written, since
    trace_processor imports a per-event field 5 as a nameless extra ftrace_event row."""
    trace, packets = exported
    got = sorted((e.timestamp, cpu, e.pid) for cpu, e in _events(packets))
    want = sorted(trace.events.select("ts", "cpu", "common_pid").iter_rows())
    assert got == want
    assert not any(e.HasField("common_flags") for _, e in _events(packets))


def test_sched_switch_fields_are_dedicated_and_exact(exported: tuple) -> None:
    """sched_switch uses Perfetto's message, with every field equal to the source row."""
    trace, packets = exported
    table = trace.event("sched_switch")
    ours = sorted(
        (e.timestamp, s.prev_comm, s.prev_pid, s.prev_prio, s.prev_state, s.next_comm, s.next_pid)
        for _, e in _events(packets)
        if e.HasField("sched_switch")
        for s in [e.sched_switch]
    )
    cols = ["ts", "prev_comm", "prev_pid", "prev_prio", "prev_state", "next_comm", "next_pid"]
    assert ours == sorted(table.select(cols).iter_rows())


def test_system_info_carries_the_kernel_release(exported: tuple) -> None:
    """SystemInfo has the release that decides prev_state decoding."""
    _, packets = exported
    infos = [p.system_info for p in packets if p.HasField("system_info")]
    assert [i.utsname.release for i in infos] == ["6.18.44-fc-v782"]
    assert infos[0].utsname.sysname == "Linux"


def test_process_tree_lists_execed_processes() -> None:
    """Tasks that exec'd are processes with the executed file as cmdline."""
    trace = tracekit.open(FIXTURES / "small.v7.dat", use_cache=False)
    packets = _export(trace)
    trees = [p.process_tree for p in packets if p.HasField("process_tree")]
    assert len(trees) == 1
    execs = dict(trace.event("sched_process_exec").select("pid", "filename").iter_rows())
    listed = {proc.pid: list(proc.cmdline) for proc in trees[0].processes}
    assert listed == {pid: [name] for pid, name in execs.items()}


def test_hrtimer_start_with_unknown_field_goes_generic_with_all_fields() -> None:
    """6.18's hrtimer_start has was_armed (not in Perfetto's message): generic, all fields."""
    trace = tracekit.open(FIXTURES / "small.v7.dat", use_cache=False)
    generic = [e.generic for _, e in _events(_export(trace)) if _name(e) == "hrtimer_start"]
    first = trace.event("hrtimer_start").row(0, named=True)
    fields = {f.name: f for f in generic[0].field}
    assert set(fields) == {"hrtimer", "function", "expires", "softexpires", "mode", "was_armed"}
    assert fields["function"].uint_value == first["function"]
    assert fields["expires"].int_value == first["expires"]


def test_lost_events_are_carried() -> None:
    """Page-flag losses mark the bundle after them; overrun counters go to FtraceStats."""
    trace = tracekit.open(FIXTURES / "overrun.v7zstd.dat", use_cache=False)
    packets = _export(trace)
    flagged = {p.ftrace_events.cpu for p in packets if p.ftrace_events.lost_events}
    assert flagged == {0, 1}
    stats = [p.ftrace_stats for p in packets if p.HasField("ftrace_stats")]
    assert {s.cpu: s.overrun for s in stats[0].cpu_stats} == {0: 358, 1: 144}


def test_window_keeps_only_events_inside() -> None:
    """--window bounds are inclusive and in seconds of the trace clock."""
    trace = tracekit.open(FIXTURES / "small.v7.dat", use_cache=False)
    t0, t1 = parse_window("2690.36:2690.37")
    events = _events(_export(trace, (t0, t1)))
    inside = trace.events.filter(pl.col("ts").is_between(t0, t1))
    assert len(events) == inside.height > 0
    assert all(t0 <= e.timestamp <= t1 for _, e in events)


def _export(trace: Any, window: tuple = (None, None)) -> list[Any]:
    """Export into a temporary file and decode it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "t.pftrace"
        export_trace(trace, out, window)
        return _packets(out)


def test_bundles_are_bounded_and_symbols_interned(tmp_path: Path) -> None:
    """Generated funcgraph events: bundles of at most BUNDLE_EVENTS, func as symbol iids."""
    n = BUNDLE_EVENTS * 2 + 5
    rows = pl.DataFrame(
        {
            "row": range(n),
            "ts": [1000 + i for i in range(n)],
            "cpu": [0] * n,
            "common_pid": [7] * n,
            "depth": [1] * n,
            "func": [0xFFFF0000 + (i % 3) for i in range(n)],
        },
        schema_overrides={
            "cpu": pl.Int32,
            "common_pid": pl.Int32,
            "depth": pl.Int32,
            "func": pl.UInt64,
        },
    )
    events = rows.select(
        "row",
        "ts",
        "cpu",
        "common_pid",
        pl.lit("funcgraph_entry").alias("event"),
        pl.lit(None, pl.UInt8).alias("flags"),
    )
    lost = pl.DataFrame(schema=tracekit.open(FIXTURES / "rawcap", use_cache=False).lost.schema)
    out = tmp_path / "fg.pftrace"
    with PacketWriter(out) as writer:
        counts = write_ftrace(
            writer, events, {"funcgraph_entry": rows}, lost, {0xFFFF0001: "do_work"}
        )
    assert counts == {"funcgraph_entry": n}
    packets = _packets(out)
    assert [len(p.ftrace_events.event) for p in packets] == [BUNDLE_EVENTS, BUNDLE_EVENTS, 5]
    symbols = {s.iid: s.str.decode() for p in packets for s in p.interned_data.kernel_symbols}
    assert sorted(symbols.values()) == ["0xffff0000", "0xffff0002", "do_work"]
    assert packets[0].sequence_flags == 3 and packets[1].sequence_flags == 2
    funcs = [symbols[e.funcgraph_entry.func] for p in packets for e in p.ftrace_events.event]
    assert funcs[1] == "do_work"


def test_cli_exports_and_checks(tmp_path: Path) -> None:
    """`tracekit perfetto` writes, checks its counts (every rule with --check OUT), and
    reports bad input in one line."""
    out = tmp_path / "cli.pftrace"
    rawcap = tmp_path / "rawcap"  # a copy: the CLI caches tables beside its input
    shutil.copytree(FIXTURES / "rawcap", rawcap)
    cmd = [sys.executable, "-m", "tracekit", "perfetto"]
    ok = subprocess.run([*cmd, str(rawcap), "-o", str(out)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert f"{out}: every event written (" in ok.stdout
    assert "import rule holds" not in ok.stdout  # the file is not read back unasked
    checked = [*cmd, str(rawcap), "-o", str(out), "--check", str(out)]
    both = subprocess.run(checked, capture_output=True, text=True)
    assert both.returncode == 0 and "every import rule holds" in both.stdout, both.stderr
    # no -o: named after the input, in the current directory; a .tar name for one trace
    # is told, not refused
    here = tmp_path / "here"
    here.mkdir()
    no_out = subprocess.run(
        [*cmd, str(rawcap)], capture_output=True, text=True, cwd=here, env=_HERE_ENV
    )
    assert no_out.returncode == 0, no_out.stderr
    assert (
        no_out.stdout.startswith("wrote rawcap.pftrace: ") and (here / "rawcap.pftrace").is_file()
    )
    tar = subprocess.run(
        [*cmd, str(rawcap), "-o", "one.tar"],
        capture_output=True,
        text=True,
        cwd=here,
        env=_HERE_ENV,
    )
    assert tar.returncode == 0
    assert "note: one.tar is one Perfetto trace, not a TAR; .pftrace says so\n" in tar.stderr
    broken = tmp_path / "broken.pftrace"
    broken.write_bytes(out.read_bytes()[:-3])
    cut = subprocess.run([*cmd, "--check", str(broken)], capture_output=True, text=True)
    assert cut.returncode != 0 and "truncated" in cut.stderr and "Traceback" not in cut.stderr


def test_read_kallsyms_and_its_errors(tmp_path: Path) -> None:
    """kallsyms lines give address -> name; an all-zero (non-root) copy is refused."""
    from tracekit.errors import TracekitError
    from tracekit.symbols.kallsyms import address_names as read_kallsyms

    good = tmp_path / "kallsyms"
    good.write_text("ffff800080010000 T do_work\nffff800080010040 t helper [mod]\nbad line\n")
    assert read_kallsyms(good) == {0xFFFF800080010000: "do_work", 0xFFFF800080010040: "helper"}
    zeros = tmp_path / "zeros"
    zeros.write_text("0000000000000000 T do_work\n")
    with pytest.raises(TracekitError, match="as root"):
        read_kallsyms(zeros)


@pytest.mark.parametrize("text", ["1:2:3", "a:b", "5:1", "12"])
def test_bad_windows_are_one_line_errors(text: str) -> None:
    """A malformed --window is a TracekitError saying how to write it."""
    from tracekit.errors import TracekitError

    with pytest.raises(TracekitError, match="--window"):
        parse_window(text)
    assert parse_window(":2.5") == (None, 2_500_000_000)


def test_value_that_does_not_fit_goes_generic_for_that_row_only() -> None:
    """A negative vec cannot be a uint32: that row is generic, the others dedicated."""
    from tracekit.perfetto.events import plan_event

    plan = plan_event("softirq_entry", {"row": pl.Int64, "vec": pl.Int64})
    assert plan.dedicated == "softirq_entry"
    assert plan.build([3], None)["softirq_entry"].vec == 3
    odd = plan.build([-1], None)["generic"]
    assert (odd.event_name, odd.field[0].name, odd.field[0].int_value) == (
        "softirq_entry",
        "vec",
        -1,
    )
    assert plan_event("softirq_entry", {"vec": pl.Int64, "extra": pl.Int8}).dedicated is None


def test_arm64_kvm_events_use_dedicated_messages_x86_ones_do_not() -> None:
    """arm64's kvm_exit (ret, esr_ec, vcpu_pc) fits Perfetto's message; x86's does not."""
    from tracekit.perfetto.events import plan_event

    arm64 = {"row": pl.Int64, "ret": pl.Int32, "esr_ec": pl.UInt32, "vcpu_pc": pl.UInt64}
    plan = plan_event("kvm_exit", arm64)
    assert plan.dedicated == "kvm_exit"
    msg = plan.build([2, 0x16, 0x40000010], None)["kvm_exit"]
    assert (msg.ret, msg.esr_ec, msg.vcpu_pc) == (2, 0x16, 0x40000010)
    assert plan_event("kvm_entry", {"vcpu_pc": pl.UInt64}).dedicated == "kvm_entry"
    x86 = {"exit_reason": pl.UInt32, "guest_rip": pl.UInt64, "isa": pl.UInt32}
    assert plan_event("kvm_exit", x86).dedicated is None


def test_kprobes_keep_their_fetched_arguments() -> None:
    """A kprobe with a fetched VMID is generic with every field (the dedicated one has none)."""
    from tracekit.perfetto.events import plan_event

    plan = plan_event("tk_free_stage2", {"__probe_ip": pl.UInt64, "vmid": pl.UInt64})
    generic = plan.build([0xFFFF8000800100A0, 7], None)["generic"]
    assert {f.name: f.uint_value for f in generic.field} == {
        "__probe_ip": 0xFFFF8000800100A0,
        "vmid": 7,
    }


def test_trace_processor_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    """--trace-processor with a non-executable file: one line, nothing started."""
    from tracekit.errors import TracekitError
    from tracekit.perfetto.processor import import_stats

    fake = tmp_path / "trace_processor_shell"
    fake.write_text("not a program")
    with pytest.raises(TracekitError, match="not an executable trace_processor"):
        import_stats(fake, tmp_path / "t.pftrace")


def test_progress_is_told_per_chunk_up_to_every_event(tmp_path: Path) -> None:
    """The export tells its progress per trace, ending at all of its events."""
    trace = tracekit.open(FIXTURES / "small.v7.dat", use_cache=False)
    told: list[tuple[str, int, int]] = []
    export_trace(trace, tmp_path / "p.pftrace", progress=lambda *args: told.append(args))
    assert told and told[-1][1:] == (trace.events.height, trace.events.height)


def test_cli_progress_lines_at_each_tenth(capsys: pytest.CaptureFixture[str]) -> None:
    """Large traces get a stderr line per tenth; small ones none."""
    from tracekit.cli.perfetto import ProgressLines

    lines = ProgressLines(least=100)
    for done in range(0, 1001, 50):
        lines("run", done, 1000)
    lines("tiny", 5, 10)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 10 and err[-1] == "exporting run: 1,000 of 1,000 events (100%)"


def test_tables_that_disagree_are_a_one_line_error(tmp_path: Path) -> None:
    """A typed table short of a row its events table has (a damaged cache): one line
    saying what to do, and no file half written is taken for an export."""
    trace = tracekit.open(FIXTURES / "small.v7.dat", use_cache=False)
    name = trace.event_names[0]
    trace._tables.by_event[name] = trace.event(name).slice(1)  # its first row gone
    with pytest.raises(TracekitError, match=r"tables disagree.*remove its ingest cache"):
        export_trace(trace, tmp_path / "out.pftrace")
    assert not list(tmp_path.iterdir())  # nor a partial file left
