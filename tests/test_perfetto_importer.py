"""Every kind of export loaded by Perfetto's own importer (trace_processor), checked by SQL.

The importer is the reference: per event name its ftrace_event rows equal ingest's
counts, sched_slice and thread_state are filled where sched_switch was recorded, every
tracekit track and counter is there with its name, unit and samples, and its `stats`
show no import error and the data losses tracekit counted. Each check's output names
the trace_processor version it used (tests/trace_processor_support.py finds it).
"""

from __future__ import annotations

import bisect
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from perfetto_support import read_export
from test_report_groundtruth import gt_bundle
from trace_processor_support import Imported, require_shell
from vm_bundles import KERNELS, during_tlbi_loop_bundle, make_vm_bundle

import tracekit
from tracekit.ingest.bundle import load_bundle
from tracekit.ingest.tables import LOST_SCHEMA
from tracekit.perfetto import ftrace
from tracekit.perfetto.bundle import export_bundle
from tracekit.perfetto.export import TIMELINE, export_trace
from tracekit.perfetto.protos import CounterDescriptor
from tracekit.perfetto.writer import read_members

INGEST = Path(__file__).parent / "fixtures" / "ingest"
BUNDLE = Path(__file__).parent / "fixtures" / "perfetto" / "nvhe-a76-kprobes"
# A real bundle whose guest run has events of ids without a format file (unknown_id_N).
WAKEUP = Path(__file__).parent / "fixtures" / "analysis" / "wakeup-bundle"


def _scenario(name: str, scenario: str) -> Callable[[Path], Path]:
    """A bundle around one of the VM fixtures, as its scenario's collect lays it out."""
    kernel = KERNELS.get(name, "6.1.0-50-arm64")
    return lambda root: make_vm_bundle(root, {"guest": name}, kernel, scenario=scenario)


# name -> what it is: a trace.dat (x86 VM, and a real arm64 KVM host), a raw capture,
# a text trace, a trace with lost events, a whole bundle's timeline with its scenario
# tracks (VM lifecycle, teardown kprobes, stage-2 flushes, cyclictest, TLBI probe); then
# bundles made around fixtures (callables): each scenario's tracks (teardown on 6.1 and
# 6.12, cache toggle, guest broadcast) and the ground truth's per-CPU EL2 and broadcast
# invalidation tracks (issue 15); a bundle with events of unknown ids.
EXPORTS: dict[str, Path | Callable[[Path], Path]] = {
    "tracedat": INGEST / "small.v7.dat",
    "arm64": INGEST / "arm64-nvhe.dat",
    "graph": INGEST / "arm64-nvhe-graph.dat",
    "rawcap": INGEST / "rawcap",
    "text": INGEST / "small.trace.txt",
    "lost": INGEST / "overrun.v7zstd.dat",
    "bundle": BUNDLE,
    "teardown-6.1": _scenario("teardown-6.1-a76", "teardown"),
    "teardown-6.12": _scenario("teardown-6.12-max", "teardown"),
    "cache-toggle": _scenario("cacheflush-2vcpu", "cache-toggle"),
    "guest-broadcast": during_tlbi_loop_bundle,
    "groundtruth": gt_bundle,
    "unknown-ids": WAKEUP,
}
# An error stat that the recorded data itself causes, checked against the data below.
SWITCH_MISMATCH = "mismatched_sched_switch_tids"


class Case:
    """One export: the source's trace (stacked runs for a bundle) and, for a bundle, each
    traced run's own; the file, its import."""

    def __init__(
        self,
        trace: Any,
        out: Path,
        counts: Counter[str],
        imported: Imported,
        runs: list[Any] | None = None,
    ) -> None:
        self.trace = trace
        self.out = out
        self.counts = counts
        self.imported = imported
        self.runs = [trace] if runs is None else runs

    def say(self, what: str) -> str:
        """A check's message, naming the importer's version."""
        return f"{self.imported.version} on {self.out.name}: {what}"


@pytest.fixture(scope="module", params=sorted(EXPORTS))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    """One fixture exported and imported by trace_processor."""
    shell = require_shell()
    source = EXPORTS[request.param]
    out = tmp_path_factory.mktemp("tp") / f"{request.param}.pftrace"
    if source in (BUNDLE, WAKEUP) or callable(source):
        root = out.parent / "bundle"
        if callable(source):
            source(root)
        else:
            shutil.copytree(source, root, ignore=shutil.ignore_patterns(".tracekit-cache"))
        result, _ = export_bundle(root, out)
        trace = tracekit.open(root, use_cache=False)
        runs = _run_traces(root)
    else:
        trace = tracekit.open(source, use_cache=False)
        kallsyms = source / "kallsyms"
        symbols = None
        if kallsyms.is_file():
            from tracekit.symbols.kallsyms import address_names

            symbols = address_names(str(kallsyms))
        result = export_trace(trace, out, symbols=symbols)
        runs = None
    imported = Imported(shell, out)
    print(f"trace_processor: {imported.version} ({shell})")
    return Case(trace, out, result.source_counts, imported, runs)


def _run_traces(root: Path) -> list[Any]:
    """A bundle's traced runs' traces, in time order."""
    data = load_bundle(root)
    runs = sorted(data.manifest.runs, key=lambda run: run.start_ns or 0)
    return [data.run(r).trace for r in runs if data.run(r).trace_path is not None]


def test_ftrace_events_per_name_equal_ingest(case: Case) -> None:
    """ftrace_event rows per name are ingest's counts, and no row lacks a name."""
    got = case.imported.column(
        "select ifnull(name, '<NULL>') name, count(*) n from ftrace_event group by name"
    )
    assert got == dict(case.counts), case.say("ftrace_event counts differ from ingest's")


def test_sched_tables_are_filled(case: Case) -> None:
    """One sched_slice per sched_switch, and thread_state rows, where switches were recorded."""
    switches = case.counts.get("sched_switch", 0)
    if not switches:
        pytest.skip("no sched_switch in this fixture")
    slices = case.imported.scalar("select count(*) from sched_slice")
    states = case.imported.scalar("select count(*) from thread_state")
    assert slices == switches, case.say(f"{slices} sched slices for {switches} switches")
    assert states > 0, case.say("thread_state is empty")


# Fields compared as the importer shows them in ftrace_event's args (compact sched
# included: it must give back the recorded values).
SAMPLED = {
    "sched_switch": ("prev_comm", "prev_pid", "prev_prio", "next_comm", "next_pid", "next_prio"),
    "sched_waking": ("comm", "pid", "prio", "target_cpu"),
}


@pytest.mark.parametrize("event", sorted(SAMPLED))
def test_sched_field_values_equal_ingest(case: Case, event: str) -> None:
    """Every sched_switch/sched_waking: ts, CPU, common_pid and fields as recorded."""
    if event not in case.counts:
        pytest.skip(f"no {event} in this fixture")
    fields = SAMPLED[event]
    picks = ", ".join(f"extract_arg(e.arg_set_id, '{f}') as {f}" for f in fields)
    rows = case.imported.query(
        f"select e.ts, e.cpu, t.tid, {picks} from ftrace_event e join thread t using (utid) "
        f"where e.name = '{event}'"
    )
    got = sorted(tuple(r.values()) for r in rows)
    table = case.trace.event(event).select("ts", "cpu", "common_pid", *fields)
    want = sorted(tuple("[NULL]" if v is None else str(v) for v in r) for r in table.iter_rows())
    assert got == want, case.say(f"{event} values differ from ingest's")


def test_every_track_and_counter_is_imported(case: Case) -> None:
    """Each tracekit track by name with its slices, each counter with its unit and sample
    count."""
    export = read_export(case.out)
    rows = case.imported.query(
        "select t.name name, ifnull(ct.unit, '') unit, "
        "(select count(*) from counter c where c.track_id = t.id) samples, "
        "(select count(*) from slice s where s.track_id = t.id) slices "
        "from track t left join counter_track ct using (id)"
    )
    got = Counter(r["name"] for r in rows)
    want = Counter(export.names[uuid] for uuid in _drawn(export))
    assert not want - got, case.say(f"tracks missing: {sorted((want - got).elements())}")
    samples: Counter[str] = Counter()
    for r in rows:
        samples[r["name"]] += int(r["samples"])
    units = {r["name"]: r["unit"] for r in rows if r["unit"]}
    for name, values in export.counters.items():
        assert samples[name] == len(values), case.say(f"{name}: {samples[name]} samples")
    slices: Counter[str] = Counter()
    for r in rows:
        slices[r["name"]] += int(r["slices"])
    for name, spans in export.slices.items():
        assert slices[name] == len(spans), case.say(f"{name}: {slices[name]} slices")
    for packet in export.packets:
        descriptor = packet.track_descriptor
        counter = packet.HasField("track_descriptor") and descriptor.HasField("counter")
        if counter and descriptor.counter.unit == CounterDescriptor.UNIT_TIME_NS:
            assert units.get(descriptor.name) == "ns", case.say(f"{descriptor.name}: unit")


def _drawn(export: Any) -> set[int]:
    """Tracks with an event or a descendant with one (the importer keeps no empty track)."""
    drawn: set[int] = set()
    for packet in export.packets:
        uuid = packet.track_event.track_uuid if packet.HasField("track_event") else 0
        while uuid and uuid not in drawn:
            drawn.add(uuid)
            uuid = export.parents.get(uuid, 0)
    return drawn


def test_no_import_error(case: Case) -> None:
    """No error stat, except the sched_switch pid mismatches the recorded data has."""
    problems = {
        k: v
        for k, v in case.imported.problems().items()
        if not k.startswith("ftrace_cpu_has_data_loss")
    }
    mismatches = problems.pop(SWITCH_MISMATCH, 0)
    assert problems == {}, case.say(f"import errors {problems}")
    want = sum(_switch_mismatches(trace) for trace in case.runs)
    assert mismatches == want, case.say(f"{SWITCH_MISMATCH}: {mismatches}, recorded {want}")


def _switch_mismatches(trace: Any) -> int:
    """sched_switches whose prev_pid is not the previous switch's next_pid on that CPU in
    one recording (a run's: the gap between two runs is no mismatch)."""
    if "sched_switch" not in trace.event_names:
        return 0
    switches = (
        trace.event("sched_switch")
        .sort("ts", maintain_order=True)
        .with_columns(last=pl.col("next_pid").shift(1).over("cpu"))
    )
    return switches.filter(pl.col("last") != pl.col("prev_pid")).height


def test_no_sched_slice_spans_an_untraced_gap(case: Case) -> None:
    """Every ended sched slice lies within one traced run: none is drawn through the time
    between two runs, when nothing was recorded."""
    if len(case.runs) < 2 or not case.counts.get("sched_switch"):
        pytest.skip("not a bundle of two traced runs with sched_switch")
    spans = sorted((int(t.events["ts"].min()), int(t.events["ts"].max())) for t in case.runs)
    starts = [first for first, _ in spans]
    rows = case.imported.query("select ts, dur from sched_slice where dur > 0")
    across = []
    for r in rows:
        ts, end = int(r["ts"]), int(r["ts"]) + int(r["dur"])
        first, last = spans[max(bisect.bisect_right(starts, ts) - 1, 0)]
        if not first <= ts <= end <= last:
            across.append((ts, end))
    assert not across, case.say(f"{len(across)} sched slices span runs, e.g. {across[:3]}")


def test_data_losses_equal_tracekits(case: Case) -> None:
    """The importer's per-CPU loss flags and overrun counts are tracekit's lost events."""
    lost = case.trace.lost
    rows = case.imported.query(
        "select name, idx, value from stats where value != 0 and name in "
        "('ftrace_cpu_has_data_loss', 'ftrace_cpu_overrun_end', 'ftrace_cpu_dropped_events_end')"
    )
    flagged = {int(r["idx"]) for r in rows if r["name"] == "ftrace_cpu_has_data_loss"}
    overrun: Counter[int] = Counter()  # summed over a TAR's traces (a row per trace)
    dropped: Counter[int] = Counter()
    for r in rows:
        into = {"ftrace_cpu_overrun_end": overrun, "ftrace_cpu_dropped_events_end": dropped}
        if r["name"] in into:
            into[r["name"]][int(r["idx"])] += int(r["value"])
    assert flagged == _cpus_with_loss(lost), case.say("CPUs flagged with data loss")
    assert dict(overrun) == _counts(lost, "stats_overrun"), case.say("overrun per CPU")
    assert dict(dropped) == _counts(lost, "stats_dropped"), case.say("dropped per CPU")


def _cpus_with_loss(lost: pl.DataFrame) -> set[int]:
    """CPUs where tracekit saw events lost (a flagged page, an overrun, a drop)."""
    real = lost.filter(
        (pl.col("source") == "page_flag")
        | (pl.col("source").is_in(["stats_overrun", "stats_dropped"]) & (pl.col("count") > 0))
    )
    return set(real["cpu"].to_list())


def _counts(lost: pl.DataFrame, source: str) -> dict[int, int]:
    """A loss counter's non-zero total per CPU."""
    rows = lost.filter((pl.col("source") == source) & (pl.col("count") > 0))
    summed = rows.group_by("cpu").agg(pl.col("count").sum())
    return dict(summed.select("cpu", "count").iter_rows())


def test_cli_trace_processor_prints_version_and_fails_on_loss(tmp_path: Path) -> None:
    """`--trace-processor` names the importer's version and exits 1 on data-loss stats."""
    shell = require_shell()
    out = tmp_path / "lost.pftrace"
    cmd = [sys.executable, "-m", "tracekit", "perfetto", str(EXPORTS["lost"]), "-o", str(out)]
    done = subprocess.run([*cmd, "--trace-processor", str(shell)], capture_output=True, text=True)
    assert f"trace_processor {Imported(shell, out).version}" in done.stdout
    assert "data_loss: ftrace_cpu_has_data_loss[0] = 1" in done.stdout
    assert done.returncode == 1 and "error/data-loss stats" in done.stderr


def test_cli_trace_processor_passes_a_multi_run_bundle(tmp_path: Path) -> None:
    """A bundle of two traced runs: the importer reports no error (its untraced gap is no
    sched_switch mismatch), and the export is a TAR of the runs and the tracks."""
    shell = require_shell()
    root = tmp_path / "bundle"
    shutil.copytree(BUNDLE, root, ignore=shutil.ignore_patterns(".tracekit-cache"))
    out = tmp_path / "bundle.pftrace"
    cmd = [sys.executable, "-m", "tracekit", "perfetto", str(root), "-o", str(out)]
    done = subprocess.run([*cmd, "--trace-processor", str(shell)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "imported it with no error or data-loss stat\n" in done.stdout
    names = [name for name, _ in read_members(out)]
    assert names == ["01-before-traced-0.pftrace", "02-guest.pftrace", TIMELINE]


class _ChainTrace:
    """A generated trace whose switches chain per CPU (prev = the last next), with
    wakings by the running task: compact sched is lossless for all but the first ones."""

    def __init__(self, n: int, cpus: int = 2) -> None:
        rng = np.random.default_rng(3)
        cpu = rng.integers(0, cpus, size=n).astype(np.int32)
        ts = np.cumsum(rng.integers(100, 5000, size=n)) + 10**9
        waking = rng.random(n) < 0.4
        nxt = rng.integers(1, 50, size=n).astype(np.int32)
        running = np.zeros(n, dtype=np.int32)
        last = {c: 0 for c in range(cpus)}
        for i in range(n):  # the task each CPU runs before event i
            running[i] = last[int(cpu[i])]
            if not waking[i]:
                last[int(cpu[i])] = int(nxt[i])
        names = np.where(waking, "sched_waking", "sched_switch")
        self.path = Path("<chain>")
        self.meta: dict[str, Any] = {
            "uname": "Linux chain 6.1.0 aarch64",
            "cpus": list(range(cpus)),
        }
        self.lost = pl.DataFrame(schema=LOST_SCHEMA)
        self.events = pl.DataFrame(
            {"row": np.arange(n), "ts": ts, "cpu": cpu, "common_pid": running,
             "tgid": pl.Series([None] * n, dtype=pl.Int32),
             "comm": pl.Series([f"t{p}" for p in running], dtype=pl.Categorical),
             "event": pl.Series(names, dtype=pl.Categorical),
             "system": pl.Series(["sched"] * n, dtype=pl.Categorical),
             "flags": rng.integers(0, 4, size=n).astype(np.uint8),
             "preempt_count": np.zeros(n, dtype=np.uint8)}
        )  # fmt: skip
        base = self.events.select("row", "ts", "cpu", "common_pid")
        comm = [f"t{p}" if p else f"swapper/{c}" for p, c in zip(running, cpu, strict=True)]
        full = base.with_columns(
            prev_comm=pl.Series(comm), prev_pid=pl.Series(running), prev_prio=pl.lit(120),
            prev_state=pl.lit(1, dtype=pl.Int64), next_comm=pl.Series([f"t{p}" for p in nxt]),
            next_pid=pl.Series(nxt), next_prio=pl.lit(120),
            comm=pl.Series([f"t{p}" for p in nxt]), pid=pl.Series(nxt), prio=pl.lit(120),
            target_cpu=pl.Series(cpu),
        )  # fmt: skip
        own = {"sched_switch": SWITCH, "sched_waking": WAKING}
        self._tables = {
            name: full.filter(pl.Series(names == name)).select("row", "ts", "cpu", "common_pid", *f)
            for name, f in own.items()
        }
        self.event_names = sorted(self._tables)

    def event(self, name: str) -> pl.DataFrame:
        """One typed table."""
        return self._tables[name]


SWITCH = ("prev_comm", "prev_pid", "prev_prio", "prev_state", "next_comm", "next_pid", "next_prio")
WAKING = ("comm", "pid", "prio", "target_cpu")


def test_compact_sched_across_chunks_imports_as_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks and bundles cut a chained trace many times: the importer still gets every
    switch and waking, a slice per switch, no mismatch, every value as recorded."""
    shell = require_shell()
    monkeypatch.setattr(ftrace, "CHUNK_ROWS", 700)
    trace = _ChainTrace(6000)
    out = tmp_path / "chain.pftrace"
    result = export_trace(trace, out)  # type: ignore[arg-type]
    compact = sum(
        len(p.ftrace_events.compact_sched.switch_timestamp)
        + len(p.ftrace_events.compact_sched.waking_timestamp)
        for p in read_export(out).packets
    )
    assert compact > 5000  # all but each CPU's first switches and the idle task's
    case = Case(trace, out, result.source_counts, Imported(shell, out))
    test_ftrace_events_per_name_equal_ingest(case)
    test_sched_tables_are_filled(case)
    test_no_import_error(case)
    for event in SAMPLED:
        test_sched_field_values_equal_ingest(case, event)
