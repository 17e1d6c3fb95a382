"""`tracekit campaign --lava`: job definitions checked by LAVA's own schema, plan mistakes
as one line, and the submit/follow/fetch/retry loop against a stand-in farm.

No LAVA server runs here (lava-server needs PostgreSQL and a web stack); the loop is
driven through a `lavacli` stand-in on PATH that keeps jobs in a JSON file and "runs" a
job by copying a generated bundle to the file:// store, as a real job's upload would.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from bundlegen import Spec, generate
from click.testing import CliRunner
from lava_support import lava_schemas

from tracekit.campaign import lava
from tracekit.campaign.plan import parse_plan
from tracekit.campaign.run import open_campaign
from tracekit.campaign.state import DONE, FAILED, load
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.report.load import load_bundles

UBOOT = {
    "device_type": "rk3399-rock-pi-4b",
    "tags": ["big-little"],
    "pack_url": "https://store.example/tracekit-pack.tar.gz",
    "store": "https://store.example/upload",
    "kernels": {
        "bookworm": {"url": "https://store.example/6.1/Image", "type": "image"},
        "trixie": {"url": "https://store.example/6.12/Image", "type": "image"},
    },
    "deploy": {
        "to": "tftp",
        "dtb": {"url": "https://store.example/rk3399-rock-pi-4b.dtb"},
        "nfsrootfs": {"url": "https://store.example/rootfs.tar.xz", "compression": "xz"},
    },
    "boot": {"method": "u-boot", "commands": "nfs", "prompts": ["root@"]},
    "context": {"extra_kernel_args": "console=ttyS2,1500000"},
}
QEMU = {
    "device_type": "qemu",
    "pack_url": "file:///srv/pack.tar.gz",
    "store": "file:///srv/store",
    "kernels": {"bookworm": {"url": "file:///srv/Image", "image_arg": "-kernel {kernel}"}},
    "deploy": {
        "to": "tmpfs",
        "images": {"ramdisk": {"url": "file:///srv/initrd.gz", "image_arg": "-initrd {ramdisk}"}},
    },
    "boot": {"method": "qemu", "media": "tmpfs", "prompts": ["# "]},
    "context": {"arch": "arm64", "machine": "virt,virtualization=on", "cpu": "cortex-a76"},
}


def _plan(lava_table: dict, **matrix: list) -> dict:
    """Plan data: a placement, short runs, the given matrix and [lava] table."""
    return {
        "seed": 3,
        "matrix": matrix or {"kvm_mode": ["nvhe", "protected"]},
        "placements": {"default": {"rt_cpu": 3, "stress_cpus": "0-2", "guest_cpu": "1"}},
        "collect": {"runs": 2},
        "lava": lava_table,
    }


def _jobs(tmp_path: Path, data: dict) -> dict[str, dict]:
    """The job definitions `--lava-jobs-only` writes, read back with YAML."""
    plan = parse_plan(data, "plan.toml")
    campaign = open_campaign(plan, "lava", tmp_path / "campaign.json")
    written = lava.write_jobs(plan, campaign, tmp_path)
    return {cell: yaml.safe_load(path.read_text()) for cell, path in written.items()}


@pytest.mark.parametrize(
    ("table", "matrix"),
    [
        (UBOOT, {"kernel": ["bookworm", "trixie"], "kvm_mode": ["nvhe", "protected"]}),
        (QEMU, {"kvm_mode": ["nvhe"]}),
    ],
)
def test_every_job_passes_lavas_own_schema(tmp_path: Path, table: dict, matrix: dict) -> None:
    schemas = lava_schemas()
    jobs = _jobs(tmp_path, _plan(table, **matrix))
    assert len(jobs) == len(matrix.get("kernel", [1])) * len(matrix["kvm_mode"])
    for job in jobs.values():
        schemas.validate(job, strict=True, extra_context_variables=list(job["context"]))


def test_the_schema_is_really_applied(tmp_path: Path) -> None:
    """A job the schema must refuse (no job timeout) is refused: the check has teeth."""
    schemas = lava_schemas()
    job = next(iter(_jobs(tmp_path, _plan(UBOOT)).values()))
    del job["timeouts"]["job"]
    with pytest.raises(Exception, match="job"):
        schemas.validate(job, strict=True, extra_context_variables=list(job["context"]))


def test_a_job_deploys_its_kernel_and_runs_its_cells_collect(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path, _plan(UBOOT, kernel=["trixie"], kvm_mode=["protected"]))
    ((cell, job),) = jobs.items()
    deploy, boot, test = (next(iter(a.values())) for a in job["actions"])
    assert deploy["kernel"]["url"].endswith("6.12/Image") and boot["method"] == "u-boot"
    args = job["context"]["extra_kernel_args"]
    assert args.startswith("console=ttyS2") and "kvm-arm.mode=protected" in args
    assert "isolcpus=3" in args and job["tags"] == ["big-little"]
    steps = test["definitions"][0]["repository"]["run"]["steps"]
    run = next(s for s in steps if "collect" in s and "lava-test-case collect" in s)
    assert f"{lava.WORKDIR}/{lava.PACK_RUN} collect --rt-cpu 3" in run
    assert f"-o {lava.WORKDIR}/{cell}" in run and "--runs 2" in run
    url = f"https://store.example/upload/plan/{cell}.tar.gz"
    assert any(f"lava-test-reference bundle --result pass --reference {url}" in s for s in steps)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"device_type": None}, "[lava] lacks device_type"),
        ({"store": "ftp://x"}, "store must start with"),
        ({"colour": "red"}, "[lava] has no key 'colour'"),
        ({"priority": "urgent"}, "priority must be one of"),
        ({"action_timeout": 500}, "must not exceed job_timeout"),
        ({"boot": {"commands": "nfs"}}, "[lava.boot] needs method"),
    ],
)
def test_plan_mistakes_are_one_line(change: dict, message: str) -> None:
    table = {k: v for k, v in (UBOOT | change).items() if v is not None}
    with pytest.raises(TracekitError, match=r"^plan plan\.toml: ") as err:
        parse_plan(_plan(table), "plan.toml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_kernel_without_an_image_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TracekitError, match=r"kernel 'sid' has no \[lava.kernels.sid\]"):
        _jobs(tmp_path, _plan(UBOOT, kernel=["sid"]))


# The stand-in farm: `lavacli jobs submit FILE` / `lavacli jobs show ID --json`. A job's
# outcome comes from FARM/outcomes.json by cell (a list consumed one per submission:
# "complete" uploads the cell's bundle to the store, "incomplete" does not).
STAND_IN = r"""#!PYTHON
import json, shutil, sys, tarfile
from pathlib import Path
farm = Path("FARM")
jobs_file = farm / "jobs.json"
jobs = json.loads(jobs_file.read_text()) if jobs_file.exists() else {}
args = sys.argv[1:]
if args[:2] == ["jobs", "submit"]:
    job = __import__("yaml").safe_load(Path(args[2]).read_text())
    cell = job["metadata"]["tracekit.cell"]
    outcomes = json.loads((farm / "outcomes.json").read_text())
    outcome = outcomes[cell].pop(0)
    (farm / "outcomes.json").write_text(json.dumps(outcomes))
    job_id = str(len(jobs) + 1)
    jobs[job_id] = {"state": "Finished", "health": outcome.capitalize(), "cell": cell}
    if outcome == "complete":
        store = farm / "store" / job["metadata"]["tracekit.campaign"]
        store.mkdir(parents=True, exist_ok=True)
        with tarfile.open(store / f"{cell}.tar.gz", "w:gz") as tar:
            tar.add(farm / "bundle", arcname=cell)
    jobs_file.write_text(json.dumps(jobs))
    print(job_id)
elif args[:2] == ["jobs", "show"]:
    print(json.dumps(jobs[args[2]]))
else:
    sys.exit("unknown command")
"""


@pytest.fixture
def farm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in lavacli on PATH and a file:// store; one generated bundle to upload."""
    root = tmp_path / "farm"
    (root / "bin").mkdir(parents=True)
    generate(root / "bundle", Spec(runs=2, seed=5))
    script = root / "bin" / "lavacli"
    script.write_text(STAND_IN.replace("PYTHON", sys.executable).replace("FARM", str(root)))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return root


def test_jobs_are_followed_fetched_and_retried_at_most_twice(farm: Path, tmp_path: Path) -> None:
    table = QEMU | {"store": f"file://{farm / 'store'}"}
    plan = parse_plan(_plan(table, kvm_mode=["nvhe", "protected"]), "plan.toml")
    cells = [r.cell_id for r in open_campaign(plan, "lava", tmp_path / "x.json").cells]
    outcomes = {cells[0]: ["incomplete", "complete"], cells[1]: ["incomplete"] * 3}
    (farm / "outcomes.json").write_text(json.dumps(outcomes))
    out = tmp_path / "camp"
    lines: list[str] = []
    result = lava.run_lava_campaign(plan, out, lines.append, lava.Lavacli(), poll_s=0)
    first, second = (next(r for r in result.cells if r.cell_id == c) for c in cells)
    assert first.status == DONE and [a.outcome for a in first.attempts] == ["failed", "done"]
    assert second.status == FAILED and len(second.attempts) == 1 + lava.MAX_RETRIES
    assert "not tried again" in second.notes[-1]
    assert load(out / "campaign.json").cells[0].status in (DONE, FAILED)
    (bundle,) = load_bundles([out])
    assert bundle.path.name == cells[0] and bundle.latencies.height > 0
    assert any("submitting again" in line for line in lines)


def test_cli_writes_job_files_only(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan(UBOOT)))
    out = tmp_path / "camp"
    result = CliRunner().invoke(main, ["campaign", str(plan), "-o", str(out), "--lava-jobs-only"])
    assert result.exit_code == 0, result.output
    assert "2 LAVA job definitions" in result.output
    assert len(list((out / lava.JOBS_DIR).glob("*.yaml"))) == 2


def test_a_bad_archive_at_the_store_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "x.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(__file__, arcname="cell/notes.txt")
    with pytest.raises(TracekitError, match=r"holds no cell/manifest\.json"):
        lava.fetch_bundle(f"file://{bad}", tmp_path, "cell")
    assert lava.fetch_bundle(f"file://{tmp_path / 'absent.tar.gz'}", tmp_path, "cell") is False
