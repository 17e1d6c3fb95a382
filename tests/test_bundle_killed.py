"""Bundles of killed runs read INCOMPLETE in `report`, `perfetto` and `verify`, with what a
stopped writer cut shown as damaged, never a reader's error.

The damage is the kill matrix's (scripts/vhost_kill_matrix.py, 2026-12-02): SIGKILL in a
quiet run left cyclictest.txt cut mid-line at 24576 bytes (its stdio buffer) with the
manifest still saying "running"; SIGTERM in a quiet run left a cyclictest.txt larger than
the manifest recorded (the tool flushed after the checksum); stress-ng that failed left
its YAML without metrics. Each is made here from a real bundle (the report fixture, an
emulated host's) or the raw-capture fixture, changed by code as the kill left it. A CPU
file cut mid-page is what a SIGKILL during the copy of a traced run's pages leaves.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.bundle import BundleWriter, Manifest, RunRecord
from tracekit.cli import main
from tracekit.ingest.bundle import load_bundle

REPORT_FIXTURE = Path(__file__).parent / "fixtures" / "report" / "nvhe-a76"
RAWCAP = Path(__file__).parent / "fixtures" / "ingest" / "rawcap"
CYCLIC = "runs/before-quiet-0/cyclictest.txt"
STRESS = "runs/before-quiet-0/stress-ng.yaml"
KILLED = "collection still running, or killed before it could say so (SIGKILL, power cut)"


def _killed(root: Path, runs: tuple[str, ...] = ("before-quiet-0",)) -> None:
    """Make a copied bundle's manifest what a kill leaves: incomplete, `runs` still
    running and unrecorded (SIGKILL's manifest never recorded their files)."""
    path = root / "manifest.json"
    data = json.loads(path.read_text())
    data |= {"complete": False, "incomplete_reason": KILLED}
    for run in data["runs"]:
        if run["run_id"] in runs:
            run |= {"status": "running", "files": [], "end_ns": None}
    data["files"] = {k: v for k, v in data["files"].items() if not any(f"/{r}/" in k for r in runs)}
    path.write_text(json.dumps(data))


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A copy of a real emulated-host bundle, as a SIGKILL in its first quiet run left it."""
    root = tmp_path / "b"
    shutil.copytree(REPORT_FIXTURE, root)
    _killed(root)
    return root


def _outputs(root: Path, tmp_path: Path) -> dict[str, str]:
    """`verify`, `report` and `perfetto` on a bundle: each one's whole output."""
    said = {}
    for name, argv in (
        ("verify", ["verify", str(root)]),
        ("report", ["report", "--no-progress", str(root)]),
        ("perfetto", ["perfetto", str(root), "-o", str(tmp_path / "out.pftrace")]),
    ):
        done = CliRunner().invoke(main, argv)
        assert not isinstance(done.exception, Exception), (name, done.exception)  # no traceback
        assert done.exit_code == (1 if name == "verify" else 0), (name, done.output)
        said[name] = " ".join(done.output.split())  # unwrapped
    return said


def _cut_mid_line(path: Path) -> str:
    """Cut a file inside its last sample's latency, as a killed writer leaves it."""
    text = path.read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[-1]
    cut = text[: text.rindex(last) + len(last) - 2]
    path.write_text(cut)
    return cut


def test_a_cyclictest_output_cut_mid_line_reads_incomplete_and_cut(
    bundle: Path, tmp_path: Path
) -> None:
    whole = len(load_bundle(bundle).latencies.filter(run_id="before-quiet-0"))
    lines = (bundle / CYCLIC).read_text().splitlines()
    last = max(n for n, line in enumerate(lines) if line.strip()[:1].isdigit())
    (bundle / CYCLIC).write_text("\n".join(lines[: last + 1]) + "\n")  # killed: no summary
    _cut_mid_line(bundle / CYCLIC)
    said = _outputs(bundle, tmp_path)
    for name in ("verify", "report", "perfetto"):
        assert "INCOMPLETE" in said[name], name
        assert f"{CYCLIC}: cut mid-line (its writer was stopped)" in said[name], name
    assert "DAMAGED bundle: 1 file(s) missing, changed or cut" in said["report"]
    # The cut sample (a shortened number) is left out, every whole one is read.
    data = load_bundle(bundle)
    assert len(data.latencies.filter(run_id="before-quiet-0")) == whole - 1


def test_a_cyclictest_output_larger_than_the_manifest_is_damaged_everywhere(
    tmp_path: Path,
) -> None:
    root = tmp_path / "b"
    shutil.copytree(REPORT_FIXTURE, root)
    data = json.loads((root / "manifest.json").read_text())
    data |= {"complete": False, "incomplete_reason": "interrupted (stopped by SIGTERM)"}
    (root / "manifest.json").write_text(json.dumps(data))
    recorded = data["files"][CYCLIC]["size"]
    late = "       0:    9999:     123\n"
    with (root / CYCLIC).open("a") as out:  # what the tool wrote after the checksum
        out.write(late)
    said = _outputs(root, tmp_path)
    problem = f"{CYCLIC}: {recorded + len(late)} bytes, the manifest recorded {recorded}"
    for name in ("verify", "report", "perfetto"):
        assert "INCOMPLETE" in said[name] and problem in said[name], name
    assert load_bundle(root).latencies.filter(run_id="before-quiet-0").is_empty()  # not read


def test_a_stopped_stress_ng_without_metrics_or_cut_reads_incomplete(
    bundle: Path, tmp_path: Path
) -> None:
    yaml = bundle / STRESS
    head = yaml.read_text().split("metrics:")[0]
    yaml.write_text(head + "metrics:\n...\n")  # what the power cut's failed stress-ng wrote
    said = _outputs(bundle, tmp_path)
    for name in ("report", "perfetto"):
        assert "INCOMPLETE" in said[name], name
        assert f"{STRESS}: not read, the run ended running (stress-ng reader" in said[name]
        assert "its throughput is not known" in said[name], name
    assert "before-quiet-0" not in load_bundle(bundle).stress["run_id"].to_list()
    shutil.copy(REPORT_FIXTURE / STRESS, yaml)
    _cut_mid_line(yaml)
    said = _outputs(bundle, tmp_path)
    for name in ("verify", "report", "perfetto"):
        assert f"{STRESS}: cut mid-line (its writer was stopped): not read" in said[name], name
    assert "before-quiet-0" not in load_bundle(bundle).stress["run_id"].to_list()


@pytest.mark.parametrize(
    "metrics",
    [
        "    - stressor: tlb-shootdown\n",  # stopped after the first whole line
        "    - stressor: tlb-shootdown\n      bogo-ops-per-second-real-time: \n",  # no value
        "    - stressor: a\n      bogo-ops-per-second-real-time: 1.5\n    - stressor: b\n",
    ],
    ids=["stressor-only", "empty-value", "one-of-two"],
)
def test_a_stopped_stress_ng_with_part_of_its_metrics_reads_incomplete_in_one_line(
    bundle: Path, tmp_path: Path, metrics: str
) -> None:
    # The YAML parses, but its table lacks the throughput (for a stressor): a polars
    # column error in report and perfetto before, or a sum that skipped a stressor.
    yaml = bundle / STRESS
    yaml.write_text(yaml.read_text().split("metrics:")[0] + "metrics:\n" + metrics)
    said = _outputs(bundle, tmp_path)
    problem = (
        f"{STRESS}: not read, the run ended running (no stress-ng "
        "bogo-ops-per-second-real-time for every stressor; the run's stress-ng did not finish)"
    )
    for name in ("report", "perfetto"):
        assert "INCOMPLETE" in said[name] and problem in said[name], name
    assert "before-quiet-0" not in load_bundle(bundle).stress["run_id"].to_list()


def test_a_run_stopped_before_cyclictest_printed_a_sample_has_none(bundle: Path) -> None:
    text = (bundle / CYCLIC).read_text()
    first = next(n for n, line in enumerate(text.splitlines()) if line.lstrip()[:1].isdigit())
    (bundle / CYCLIC).write_text("\n".join(text.splitlines()[:first]) + "\n")
    data = load_bundle(bundle)
    assert data.latencies.filter(run_id="before-quiet-0").is_empty()
    assert f"{CYCLIC}: no sample (cyclictest was stopped before printing one)" in data.problems


def _traced_bundle(root: Path) -> Path:
    """A bundle whose traced run (the raw-capture fixture) was killed: manifest 'running'."""
    writer = BundleWriter.create(root, Manifest())
    shutil.copytree(RAWCAP, writer.path("runs/t0/trace"))
    writer.start_run(RunRecord("t0", "before", "traced", 0))
    return root


def test_a_cpu_file_cut_mid_page_is_read_to_the_cut_and_its_loss_counted(
    tmp_path: Path,
) -> None:
    root = _traced_bundle(tmp_path / "b")
    whole = load_bundle(root)
    events = whole.run(whole.manifest.runs[0]).trace.events  # type: ignore[union-attr]
    raw = root / "runs/t0/trace/per_cpu/cpu1/trace_pipe_raw"
    first_page = tmp_path / "first-page"  # the capture with cpu1's first page only
    shutil.copytree(RAWCAP, first_page)
    with (first_page / "per_cpu/cpu1/trace_pipe_raw").open("r+b") as f:
        f.truncate(4096)
    kept = len(tracekit.open(first_page, use_cache=False).events.filter(cpu=1))
    with raw.open("r+b") as f:
        f.truncate(4096 + 1000)  # one whole page, then part of the second
    said = _outputs(root, tmp_path)
    problem = "runs/t0/trace/per_cpu/cpu1/trace_pipe_raw: cut mid-page (its writer was stopped)"
    for name in ("verify", "report", "perfetto"):
        assert "INCOMPLETE" in said[name] and problem in said[name], name
    cut = load_bundle(root)
    run = cut.run(cut.manifest.runs[0])
    assert run.trace is not None
    on_cpu1 = run.trace.events.filter(cpu=1)
    assert 0 < len(on_cpu1) == kept < len(events.filter(cpu=1))  # the whole page is read
    # The capture's stats say how many events cpu1 gave: those not read are lost.
    assert run.lost_per_cpu.get(1, 0) == len(events.filter(cpu=1)) - len(on_cpu1)


def test_a_bundle_stopped_before_its_first_run_exports_its_notes(tmp_path: Path) -> None:
    root = tmp_path / "b"
    writer = BundleWriter.create(root, Manifest())
    writer.mark_incomplete("interrupted (stopped by SIGINT)")
    result = CliRunner().invoke(main, ["perfetto", str(root), "-o", str(tmp_path / "o.pftrace")])
    assert result.exit_code == 0, result.output
    assert "INCOMPLETE: interrupted (stopped by SIGINT)" in result.output


def test_a_vmm_output_and_a_probe_summary_cut_mid_line_are_said_not_misread(
    tmp_path: Path,
) -> None:
    root = tmp_path / "b"
    shutil.copytree(REPORT_FIXTURE, root)
    _killed(root, ("guest", "before-probe-page-cpu0"))
    vmm = root / "runs/guest/vmm.txt"
    lines = vmm.read_text().splitlines()
    vm = next(n for n, line in enumerate(lines) if line.startswith("record=vm "))
    vmm.write_text("\n".join(lines[: vm + 1])[:-4])  # the VM's record, cut in its last number
    probe = root / "runs/before-probe-page-cpu0/probe.json"
    probe.write_text(probe.read_text()[:40])
    said = _outputs(root, tmp_path)
    for name in ("verify", "report", "perfetto"):
        assert "runs/guest/vmm.txt: cut mid-line (its writer was stopped)" in said[name], name
        assert "before-probe-page-cpu0/probe.json: cut mid-line" in said[name], name
    data = load_bundle(root)
    guest = next(r for r in data.manifest.runs if r.run_id == "guest")
    vmm_output = data.run(guest).vmm
    assert vmm_output is not None and vmm_output.vms.is_empty()  # the cut record is not read
    assert "before-probe-page-cpu0" not in data.probes["run_id"].to_list()


@pytest.mark.parametrize(
    "summary", ["", '{"record": "tlbiprobe", "cpu": 0}\n'], ids=["empty", "without-numbers"]
)
def test_a_killed_probe_slots_summary_reads_incomplete_in_one_line(
    tmp_path: Path, summary: str
) -> None:
    # The kill matrix's kill-probe cell (2026-12-02 14:04), once its SIGKILL landed while
    # tlbiprobe ran, left probe.json empty: report and perfetto stopped with exit 2.
    root = tmp_path / "b"
    shutil.copytree(REPORT_FIXTURE, root)
    slot = "before-probe-page-cpu0"
    _killed(root, (slot,))
    (root / "runs" / slot / "probe.json").write_text(summary)
    said = _outputs(root, tmp_path)
    for name in ("report", "perfetto"):
        assert "INCOMPLETE" in said[name], name
        assert f"runs/{slot}/probe.json: not read, the run ended running" in said[name], name
        assert "the probe slot's summary is not known" in said[name], name
    assert slot not in load_bundle(root).probes["run_id"].to_list()
