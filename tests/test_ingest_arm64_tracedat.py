"""An arm64 trace.dat from `tracekit collect --capture trace-cmd` in the emulated nVHE host.

tests/fixtures/ingest/README.md says how arm64-nvhe.dat was recorded and cut. The binary
reader must agree with this machine's `trace-cmd report` (which reads an arm64
little-endian file) event by event and field by field, and the text reader must read
trace-cmd's text of the same file into the same events.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from ingest_truth import have_trace_cmd, parse_lines, report_raw, split_fields
from test_ingest_tracecmd import _value_matches

import tracekit
from tracekit.analysis import vm
from tracekit.ingest.formats import Kind
from tracekit.ingest.tracedat import read_tracedat

FIX = Path(__file__).parent / "fixtures" / "ingest"
ARM = FIX / "arm64-nvhe.dat"
REPORT = FIX / "arm64-nvhe.report.txt"  # `trace-cmd report arm64-nvhe.dat`
# `trace-cmd record -p function_graph` in the same boot (top-level buffer, no instance).
GRAPH = FIX / "arm64-nvhe-graph.dat"

needs_trace_cmd = pytest.mark.skipif(not have_trace_cmd(), reason="trace-cmd is not installed")


def _matches(kind: Kind, ours: object, text: str) -> bool:
    """As for the x86 files, plus two renderings of trace-cmd -R: a `const char *` neither
    side finds in printk_formats (a string in kernel rodata) is the address both ways,
    0x-prefixed here and bare there; funcgraph_exit's calltime/rettime print as bare hex."""
    text = text.strip()
    if kind == Kind.CONST_STR and str(ours).startswith("0x"):
        return int(str(ours), 16) == int(text, 16)
    if kind == Kind.INT and not text.lstrip("-").isdigit() and _is_hex(text):
        return int(str(ours)) == int(text, 16)
    return _value_matches(kind, ours, text)


def _is_hex(text: str) -> bool:
    """Whether the text is bare hexadecimal digits."""
    return bool(text) and all(c in "0123456789abcdef" for c in text)


@pytest.fixture(scope="module")
def binary() -> tracekit.Trace:  # type: ignore[name-defined]
    """tracekit's native decode of the fixture."""
    return tracekit.open(ARM, use_cache=False)


def test_fixture_has_what_the_analyses_read(binary) -> None:  # type: ignore[no-untyped-def]
    """sched, irq, hrtimer, kvm, tracekit's kprobes (entry and return) and markers."""
    names = set(binary.event_names)
    assert {"sched_switch", "sched_waking", "irq_handler_entry", "hrtimer_expire_entry"} <= names
    assert {"kvm_entry", "kvm_exit", "kvm_arm_vmid_update", "kvm_free_stage2_pgd"} <= names
    assert any(n.endswith("_ret") for n in names), "no return probe"
    markers = binary.event("print")["buf"].to_list()
    assert any(m.startswith("tracekit-vmm:") and "event=create" in m for m in markers)
    assert binary.meta["uname"].split()[2].endswith("arm64")
    assert binary.meta["instance"].startswith("tracekit-")
    assert binary.event("kvm_arm_vmid_update")["vmid_id"].max() > 0


def _compare_with_trace_cmd(path: Path) -> dict[str, int]:
    """Events and fields of tracekit's decode against `trace-cmd report -R -t`, per event."""
    binary = tracekit.open(path, use_cache=False)
    truth, dropped = parse_lines(report_raw(path))
    ev = binary.events
    assert dropped == []
    assert ev.height == len(truth) > 500
    assert ev["ts"].to_list() == [t.ts for t in truth]
    assert ev["cpu"].to_list() == [t.cpu for t in truth]
    assert ev["common_pid"].to_list() == [t.pid for t in truth]
    assert ev["event"].cast(pl.String).to_list() == [t.event for t in truth]
    formats = {f.name: f for f in read_tracedat(path).formats.events.values()}
    checked: dict[str, int] = {}
    for name in binary.event_names:
        fmt = formats[name]
        names = [spec.name for spec in fmt.own]
        for row in binary.event(name).iter_rows(named=True):
            got = split_fields(truth[row["row"]].fields, names)
            for spec in fmt.own:
                if spec.name in got:
                    assert _matches(spec.kind, row[spec.name], got[spec.name]), (
                        name, spec.name, row[spec.name], got[spec.name])  # fmt: skip
                    checked[name] = checked.get(name, 0) + 1
    return checked


@needs_trace_cmd
def test_binary_matches_trace_cmd_report() -> None:
    """Same events in the same order with the same ts, cpu, pid, name and every field."""
    checked = _compare_with_trace_cmd(ARM)
    assert sum(checked.values()) > 2000
    for name in (
        "kvm_exit",
        "kvm_arm_vmid_update",
        "print",
        "sched_switch",
        "hrtimer_expire_entry",
    ):
        assert checked.get(name, 0) > 0, f"no field of {name} compared"


@needs_trace_cmd
def test_function_graph_file_matches_trace_cmd_report() -> None:
    """The same for function_graph's entry/exit records (calltime, rettime, depth)."""
    checked = _compare_with_trace_cmd(GRAPH)
    assert checked["funcgraph_entry"] > 5 and checked["funcgraph_exit"] > 5
    graph = tracekit.open(GRAPH, use_cache=False)
    exits = graph.event("funcgraph_exit")
    assert (exits["rettime"] > exits["calltime"]).all()
    assert "kvm_arm_vmid_update" in graph.event("funcgraph_entry")["func_sym"].to_list()


def test_text_report_matches_binary(binary) -> None:  # type: ignore[no-untyped-def]
    """trace-cmd's default text of the file: same events, µs times, CPUs, pids, names."""
    text = tracekit.open(REPORT, use_cache=False)
    assert text.meta["skipped"] == []
    ev = binary.events
    assert text.events.height == ev.height
    assert text.events["ts"].to_list() == ((ev["ts"] + 500) // 1000 * 1000).to_list()
    assert text.events["cpu"].to_list() == ev["cpu"].to_list()
    assert text.events["common_pid"].to_list() == ev["common_pid"].to_list()
    assert text.events["event"].to_list() == ev["event"].to_list()
    # Fields the text prints plainly come out with the binary's values.
    for name, col in (("kvm_arm_vmid_update", "vmid_id"), ("irq_handler_entry", "irq")):
        assert text.event(name)[col].cast(pl.Int64).to_list() == (
            binary.event(name)[col].cast(pl.Int64).to_list()
        )
    # trace-cmd prints a marker as `print: tracing_mark_write: MESSAGE`; the text reader
    # splits it into the binary readers' ip_sym and buf.
    prints = text.event("print")
    markers = binary.event("print")["buf"].str.strip_chars()
    assert prints["buf"].str.strip_chars().to_list() == markers.to_list()
    assert set(prints["ip_sym"]) == set(binary.event("print")["ip_sym"])
    assert any(m.startswith("tracekit-vmm:") for m in markers)
    # ... so the VM analysis finds the VMM's lifecycle in either.
    assert vm.vmm_markers(prints).equals(
        vm.vmm_markers(binary.event("print")).with_columns(
            pl.col("ts") // 1000 * 1000 + (pl.col("ts") % 1000 >= 500) * 1000
        )
    )
