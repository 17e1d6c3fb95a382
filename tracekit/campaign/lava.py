"""Campaign cells as LAVA jobs: one job definition per cell, submitted and followed with
lavacli, each bundle fetched back into the usual campaign directory.

A LAVA device cannot send files back, so each job uploads its bundle (a tar.gz) to the
plan's store and records where with lava-test-reference; tracekit then fetches it from
there into `<campaign dir>/<cell id>/`, beside campaign.json, so `tracekit report DIR`
reads a farm's campaign unchanged. A job that ends Incomplete or Canceled, or leaves no
bundle, is submitted again, at most twice. lavacli's own configuration holds the farm's
URL and token (`--lava-identity` names one of its identities): never the plan or a bundle.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracekit.boardpack import TOP
from tracekit.bundle import MANIFEST
from tracekit.campaign import state
from tracekit.campaign.cells import Cell
from tracekit.campaign.command import collect_argv, isolation_args
from tracekit.campaign.plan import Plan
from tracekit.campaign.state import Campaign, CellRecord
from tracekit.errors import TracekitError

Echo = Callable[[str], None]
# `tracekit board-pack`'s archive unpacks to this directory: run.sh starts tracekit,
# the reproducer's guests sit beside it.
PACK_DIR = TOP
PACK_RUN = f"{PACK_DIR}/run.sh"
PACK_GUESTS = f"{PACK_DIR}/reproducer/build/guests"
WORKDIR = "/tmp/tracekit-lava"
JOBS_DIR = "lava-jobs"
MAX_RETRIES = 2  # a failed job is submitted again at most this many times
FINISHED = "Finished"
COMPLETE = "Complete"
KVM_ARGS = {"nvhe": "kvm-arm.mode=nvhe", "protected": "kvm-arm.mode=protected", "vhe": ""}
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def check_lava_plan(plan: Plan) -> None:
    """A LAVA campaign needs [lava]; its cores are the device's; each kernel has an image."""
    if not plan.lava:
        raise TracekitError(f"plan {plan.source}: --lava needs a [lava] table (docs/campaign.md)")
    if len(plan.matrix["cpu_model"]) > 1:
        raise TracekitError(
            f"plan {plan.source}: [matrix] cpu_model has several values, but a LAVA device"
            " type has the cores it has; run one campaign per device type"
        )
    kernels = plan.lava["kernels"]
    for kernel in plan.matrix["kernel"]:
        if kernels and kernel not in kernels:
            raise TracekitError(
                f"plan {plan.source}: [matrix] kernel {kernel!r} has no [lava.kernels.{kernel}]"
                " image to deploy"
            )
    if not kernels and len(plan.matrix["kernel"]) > 1:
        raise TracekitError(
            f"plan {plan.source}: several kernels in [matrix] but no [lava.kernels] to deploy"
            " them; add one [lava.kernels.NAME] table per kernel"
        )


def campaign_name(plan: Plan) -> str:
    """The campaign's name in the store: [lava] campaign, else the plan file's stem."""
    return str(plan.lava.get("campaign") or Path(plan.source).stem or "campaign")


def bundle_url(plan: Plan, cell_id: str) -> str:
    """Where a cell's job uploads its bundle, and tracekit fetches it from."""
    return f"{plan.lava['store'].rstrip('/')}/{campaign_name(plan)}/{cell_id}.tar.gz"


def kernel_args(cell: Cell, plan: Plan) -> str:
    """The job's extra_kernel_args: the lab's, the cell's KVM mode, the rt CPU's isolation."""
    placement = plan.placements[cell.axes["placement"]]
    parts = [
        str(plan.lava["context"].get("extra_kernel_args", "")),
        KVM_ARGS[cell.axes["kvm_mode"]],
        isolation_args(placement.rt_cpu),
    ]
    return " ".join(part for part in parts if part)


def job_definition(cell: Cell, plan: Plan) -> dict[str, Any]:
    """The LAVA job for one cell: the lab's deploy and boot, then tracekit's test action."""
    lava = plan.lava
    deploy = dict(lava["deploy"])
    if lava["kernels"]:
        # A tmpfs (QEMU) deploy lists its files under images; the others name a kernel.
        kernel = dict(lava["kernels"][cell.kernel])
        if deploy["to"] == "tmpfs":
            deploy["images"] = dict(deploy.get("images", {})) | {"kernel": kernel}
        else:
            deploy["kernel"] = kernel
    job: dict[str, Any] = {
        "device_type": lava["device_type"],
        "job_name": f"tracekit {campaign_name(plan)} {cell.cell_id}",
        "priority": lava["priority"],
        "visibility": lava["visibility"],
        "timeouts": {
            "job": {"minutes": lava["job_timeout"]},
            "action": {"minutes": lava["action_timeout"]},
            "connection": {"minutes": 2},
        },
        "context": dict(lava["context"]) | {"extra_kernel_args": kernel_args(cell, plan)},
        "metadata": {"tracekit.campaign": campaign_name(plan), "tracekit.cell": cell.cell_id},
        "actions": [
            {"deploy": deploy},
            {"boot": dict(lava["boot"])},
            {"test": _test_action(cell, plan)},
        ],
    }
    if lava["tags"]:
        job["tags"] = list(lava["tags"])
    return job


def _test_action(cell: Cell, plan: Plan) -> dict[str, Any]:
    """Unpack the board pack, run the cell's collect, upload the bundle, say where."""
    bundle = f"{WORKDIR}/{cell.cell_id}"
    collect = collect_argv(cell, plan, bundle, f"{WORKDIR}/{PACK_GUESTS}", "python3")
    # collect_argv starts with `python3 -m tracekit`; the pack's run.sh stands for that
    # (it checks the board's python3 and runs tracekit from the pack).
    command = shlex.join([f"{WORKDIR}/{PACK_RUN}", *collect[3:]])
    archive, url = f"{bundle}.tar.gz", bundle_url(plan, cell.cell_id)
    steps = [
        f"mkdir -p {WORKDIR} && cd {WORKDIR}",
        f"{_fetch_step(plan.lava['pack_url'], 'pack.tar.gz')} && tar xzf pack.tar.gz",
        f"if {command}; then lava-test-case collect --result pass;"
        " else lava-test-case collect --result fail; fi",
        f"tar czf {shlex.quote(archive)} -C {WORKDIR} {shlex.quote(cell.cell_id)}",
        f"if {_upload_step(archive, url)}; then lava-test-reference bundle --result pass"
        f" --reference {shlex.quote(url)}; else lava-test-case bundle-upload --result fail; fi",
    ]
    return {
        "timeout": {"minutes": plan.lava["action_timeout"]},
        "definitions": [
            {
                "from": "inline",
                "name": "tracekit-collect",
                "path": "inline/tracekit-collect.yaml",
                "repository": {
                    "metadata": {
                        "format": "Lava-Test Test Definition 1.0",
                        "name": "tracekit-collect",
                        "description": f"tracekit collect, cell {cell.cell_id}",
                    },
                    "run": {"steps": steps},
                },
            }
        ],
    }


def _fetch_step(url: str, name: str) -> str:
    """A shell step that gets `url` as `name`: a local copy, curl, or busybox's wget."""
    q = shlex.quote
    if url.startswith("file://"):
        return f"cp {q(url.removeprefix('file://'))} {q(name)}"
    return f"(curl -fsSL {q(url)} -o {q(name)} || wget -q -O {q(name)} {q(url)})"


def _upload_step(archive: str, url: str) -> str:
    """A shell step that puts `archive` at `url` (HTTP PUT, or a copy on a mounted store)."""
    q = shlex.quote
    if url.startswith("file://"):
        target = url.removeprefix("file://")
        return f"mkdir -p {q(str(Path(target).parent))} && cp {q(archive)} {q(target)}"
    return f"curl -fsS -T {q(archive)} {q(url)}"


def to_yaml(data: Any, indent: int = 0) -> str:
    """Plain data as block YAML; every string double-quoted (JSON's escapes are YAML's)."""
    pad = " " * indent
    if isinstance(data, dict) and data:
        lines = []
        for key, value in data.items():
            name = key if _PLAIN_KEY.match(key) else json.dumps(key)
            if isinstance(value, dict | list) and value:
                lines.append(f"{pad}{name}:\n{to_yaml(value, indent + 2)}")
            else:
                lines.append(f"{pad}{name}: {_scalar(value)}")
        return "\n".join(lines)
    if isinstance(data, list) and data:
        lines = []
        for item in data:
            if isinstance(item, dict | list) and item:
                body = to_yaml(item, indent + 2)
                lines.append(f"{pad}- {body[indent + 2 :]}")
            else:
                lines.append(f"{pad}- {_scalar(item)}")
        return "\n".join(lines)
    return f"{pad}{_scalar(data)}"


def _scalar(value: Any) -> str:
    """One scalar (or an empty collection) in YAML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(str(value))


def write_jobs(plan: Plan, campaign: Campaign, out: Path) -> dict[str, Path]:
    """Each cell's job definition as <out>/lava-jobs/<cell id>.yaml."""
    check_lava_plan(plan)
    jobs = out / JOBS_DIR
    jobs.mkdir(parents=True, exist_ok=True)
    written = {}
    for record in campaign.cells:
        cell = Cell(record.cell_id, record.position, record.repeat, record.axes)
        path = jobs / f"{record.cell_id}.yaml"
        path.write_text(to_yaml(job_definition(cell, plan)) + "\n")
        written[record.cell_id] = path
    return written


class Lavacli:
    """The farm, through the lavacli command (its config holds the URL and the token)."""

    def __init__(self, identity: str | None = None, program: str = "lavacli") -> None:
        self.argv = [program, *(["--identity", identity] if identity else [])]

    def _run(self, *args: str) -> str:
        """Run one lavacli command; a failure is one line with its own message."""
        if shutil.which(self.argv[0]) is None:
            raise TracekitError(
                f"{self.argv[0]} not found; install it (apt-get install lavacli, or pip"
                " install lavacli) and add an identity with `lavacli identities add`"
            )
        proc = subprocess.run([*self.argv, *args], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            raise TracekitError(f"lavacli {args[0]} {args[1]}: {why[-1] if why else 'failed'}")
        return proc.stdout

    def submit(self, job: Path) -> str:
        """Submit a job definition; its job id."""
        ids = self._run("jobs", "submit", str(job)).split()
        if not ids:
            raise TracekitError(f"lavacli jobs submit {job}: printed no job id")
        return ids[0]

    def status(self, job_id: str) -> tuple[str, str]:
        """(state, health) of a job, as LAVA names them (Finished, Complete, ...)."""
        shown = self._run("jobs", "show", job_id, "--json")
        try:
            data = json.loads(shown)
        except ValueError:
            raise TracekitError(f"lavacli jobs show {job_id}: not JSON output") from None
        return str(data.get("state", "")), str(data.get("health", ""))


def fetch_bundle(url: str, out: Path, cell_id: str) -> bool:
    """Fetch a cell's uploaded bundle and unpack it as <out>/<cell id>; False if absent."""
    try:
        if url.startswith("file://"):
            data = Path(url.removeprefix("file://")).read_bytes()
        else:
            with urllib.request.urlopen(url, timeout=120) as response:
                data = response.read()
    except OSError:
        return False
    staging = out / f".{cell_id}.fetch"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            archive.extractall(staging, filter="data")
    except (tarfile.TarError, OSError) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise TracekitError(f"{url}: not a bundle archive ({err})") from None
    found = staging / cell_id
    if not (found / MANIFEST).is_file():
        shutil.rmtree(staging, ignore_errors=True)
        raise TracekitError(f"{url}: holds no {cell_id}/{MANIFEST}; the job uploaded no bundle")
    target = out / cell_id
    shutil.rmtree(target, ignore_errors=True)
    found.rename(target)
    shutil.rmtree(staging, ignore_errors=True)
    return True


def run_lava_campaign(
    plan: Plan,
    out: Path,
    echo: Echo,
    client: Lavacli,
    poll_s: float = 30.0,
) -> Campaign:
    """Submit every pending cell, follow the jobs, fetch each bundle, retry failures."""
    from tracekit.campaign.run import open_campaign, record_paths

    state_path = out / state.CAMPAIGN_FILE
    campaign = open_campaign(plan, "lava", state_path)
    paths = record_paths(out, state_path)
    jobs = write_jobs(plan, campaign, out)
    running: dict[str, tuple[CellRecord, state.Attempt, str]] = {}
    while True:
        for record in campaign.cells:
            if record.status == state.PENDING and record.cell_id not in running:
                attempt = state.begin_attempt(record)
                job_id = client.submit(jobs[record.cell_id])
                attempt.note = f"lava job {job_id}"
                running[record.cell_id] = (record, attempt, job_id)
                echo(f"campaign: cell {record.cell_id}: submitted as LAVA job {job_id}")
        state.save(campaign, paths)
        if not running:
            break
        time.sleep(poll_s)
        for cell_id, (record, attempt, job_id) in list(running.items()):
            job_state, health = client.status(job_id)
            if job_state != FINISHED:
                continue
            del running[cell_id]
            _finish(plan, out, record, attempt, job_id, health, echo)
        state.save(campaign, paths)
    campaign.complete = True
    state.save(campaign, paths)
    return campaign


def _finish(
    plan: Plan,
    out: Path,
    record: CellRecord,
    attempt: state.Attempt,
    job_id: str,
    health: str,
    echo: Echo,
) -> None:
    """Close a finished job's attempt: done with its bundle fetched, else failed or retried."""
    url = bundle_url(plan, record.cell_id)
    fetched = health == COMPLETE and fetch_bundle(url, out, record.cell_id)
    if fetched:
        record.bundle = record.cell_id
        state.end_attempt(record, attempt, "done", 0, f"lava job {job_id}")
        echo(f"campaign: cell {record.cell_id}: done (job {job_id})")
        return
    why = f"job {health or 'ended'}" if health != COMPLETE else "no bundle at the store"
    state.end_attempt(record, attempt, "failed", None, f"lava job {job_id}: {why}")
    failures = sum(1 for a in record.attempts if a.outcome == "failed")
    if failures <= MAX_RETRIES:
        record.status = state.PENDING
        echo(f"campaign: cell {record.cell_id}: lava job {job_id}: {why}; submitting again")
    else:
        record.notes.append(f"failed {failures} times on the farm; not tried again")
        echo(f"campaign: cell {record.cell_id}: failed {failures} times; given up")
