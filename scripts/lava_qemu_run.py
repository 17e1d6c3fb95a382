#!/usr/bin/env python3
"""One campaign cell's LAVA job, run by LAVA's own dispatcher against a QEMU device here.

What runs: `tracekit campaign --lava`'s job definition for one cell (tracekit's
campaign/lava.py, unchanged), executed by `lava-run` from Debian bookworm's
lava-dispatcher 2023.01 on a QEMU device whose description is rendered from
lava-server's own qemu.jinja2 device-type template. The device boots the emulated arm64
host (Debian's arm64 kernel and tracekit's vhost initramfs, KVM inside in nVHE); LAVA
appends its test overlay to the initramfs, logs in on the serial console, and runs the
job's test action: unpack the board pack, `tracekit collect` the cell, upload the bundle
to the store, lava-test-reference it. The pack is `tracekit board-pack`'s archive. The
script then fetches the bundle from the store as `tracekit campaign --lava` does and
prints what each step gave.

How the dispatcher is provided (nothing is installed on this machine): the .debs of
lava-common, lava-dispatcher, lava-dispatcher-host, lava-server and ipxe-qemu (the NIC
ROM the template's network device loads) are fetched with
`apt-get download` into ~/.cache/tracekit/lava and unpacked there; their Python
dependencies come from PyPI into a venv there. python3-guestfs (libguestfs bindings,
not on PyPI) is replaced by an empty module: lava_dispatcher imports it at module level,
and only deploys that build disk images call it; this job's deploy appends the overlay
to a cpio ramdisk, which needs no guestfs (the dispatcher's log shows which actions ran).

Not exercised: lava-server (scheduler, web UI, XML-RPC), so not lavacli's submit and
status either (tests/test_campaign_lava.py drives those against a stand-in); a real
board's deploy (tftp, nfs) and power control; upload over HTTP (the store here is a
9p-shared directory, a file:// store).

    python3 scripts/lava_qemu_run.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tracekit.boardpack import board_pack, default_cross
from tracekit.campaign import lava
from tracekit.campaign.plan import parse_plan
from tracekit.campaign.run import open_campaign
from tracekit.ingest.bundle import load_bundle
from tracekit.vhost.cache import cache_root
from tracekit.vhost.image import require_image
from tracekit.vhost.kernels import parse_kernel_spec
from tracekit.vhost.kvmmode import kernel_args_for
from tracekit.vhost.qemu import BASE_KERNEL_ARGS, cpu_option, smp_option
from tracekit.vhost.runner import project_tree

# ipxe-qemu: the NIC ROM the template's -net nic (virtio-net-pci) loads, unpacked beside.
DEBS = ("lava-common", "lava-dispatcher", "lava-dispatcher-host", "lava-server", "ipxe-qemu")
PYPI = (
    "pexpect", "pyyaml", "jinja2", "requests", "voluptuous", "pyudev", "setproctitle",
    "netifaces", "configobj", "python-magic", "pytz", "aiohttp",
)  # fmt: skip
SITE = "usr/lib/python3/dist-packages"
TEMPLATES = "usr/share/lava-server/device-types"
SMP, MEMORY_MB, CPU_MODEL, KVM_MODE = 2, 2048, "cortex-a76", "nvhe"
PLAN = {
    "seed": 3,
    "matrix": {"kvm_mode": [KVM_MODE], "cpu_model": [CPU_MODEL], "guest": ["mmu-on"]},
    "placements": {"default": {"rt_cpu": 1, "stress_cpus": "0", "guest_cpu": "0"}},
    "collect": {"runs": 1, "traced_runs": 0, "duration": 1},
}


def say(message: str) -> None:
    """A progress line."""
    print(f"lava-qemu: {message}", flush=True)


def dispatcher(root: Path) -> tuple[Path, Path]:
    """The unpacked Debian packages and a venv with their PyPI dependencies."""
    debs, unpacked, venv = root / "debs", root / "root", root / "venv"
    debs.mkdir(parents=True, exist_ok=True)
    for package in DEBS:
        if not list(debs.glob(f"{package}_*.deb")):
            subprocess.run(["apt-get", "download", package], cwd=debs, check=True)
        deb = sorted(debs.glob(f"{package}_*.deb"))[-1]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    if not (venv / "bin" / "python").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *PYPI], check=True)
    stub = root / "stub"
    stub.mkdir(exist_ok=True)
    (stub / "guestfs.py").write_text('"""Stand-in: imported by lava_dispatcher, unused here."""\n')
    return unpacked, venv


def pack(work: Path) -> Path:
    """`tracekit board-pack`'s archive, as a board gets it, on the store's share."""
    archive = work / "share" / "pack.tar.gz"
    archive.parent.mkdir(parents=True, exist_ok=True)
    return board_pack(archive, default_cross(), say)


def control_share(work: Path) -> Path:
    """The vhost /init's control share: a command that gives LAVA a shell on the console."""
    ctl = work / "ctl"
    ctl.mkdir(parents=True, exist_ok=True)
    (ctl / "token").write_text("lava\n")
    (ctl / "command.sh").write_text("exec setsid cttyhack sh -i </dev/console >/dev/console 2>&1\n")
    return ctl


def device_yaml(unpacked: Path, venv: Path, work: Path, append: str) -> str:
    """The QEMU device, rendered from lava-server's own qemu.jinja2 as the server would
    (with the dispatcher venv's jinja2: tracekit itself does not need it)."""
    shares = {
        "tkctl": work / "ctl",
        "tkproject": project_tree(),
        "tkout": work / "out",
        "tkpyc": work / "pyc",
        "tkshare": work / "share",
    }
    virtfs = [
        f"-virtfs local,path={path},mount_tag={tag},security_model=none"
        + (",readonly=on" if tag == "tkproject" else "")
        for tag, path in shares.items()
    ]
    for path in shares.values():
        path.mkdir(parents=True, exist_ok=True)
    context = {
        "arch": "arm64",
        "cpu": cpu_option(CPU_MODEL),
        "machine": "virt,virtualization=on,gic-version=3",
        "memory": MEMORY_MB,
        "extra_options": [
            f"-smp {smp_option(SMP, 1)}",
            "-accel tcg,thread=multi",
            "-no-reboot",
            f"-L {unpacked / 'usr/lib/ipxe/qemu'} -L /usr/share/qemu",
            f'-append "{append}"',
            *virtfs,
        ],
    }
    render = (
        "import jinja2, json, sys; d, c = sys.argv[1], json.loads(sys.argv[2]);"
        " env = jinja2.Environment(loader=jinja2.FileSystemLoader(d));"
        " print(env.get_template('qemu.jinja2').render(**c))"
    )
    python = str(venv / "bin" / "python")
    argv = [python, "-c", render, str(unpacked / TEMPLATES), json.dumps(context)]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def lava_table(work: Path, image_dir: Path) -> dict:
    """The plan's [lava] table for this QEMU device (a file:// store on the 9p share)."""
    return {
        "device_type": "qemu",
        "job_timeout": 60,
        "action_timeout": 45,
        "pack_url": "file:///share/pack.tar.gz",
        "store": "file:///share/store",
        "campaign": "lava-qemu",
        "kernels": {
            "bookworm": {"url": f"file://{image_dir / 'vmlinuz'}", "image_arg": "-kernel {kernel}"}
        },
        "deploy": {
            "to": "tmpfs",
            "images": {
                "ramdisk": {
                    "url": f"file://{image_dir / 'initramfs.cpio'}",
                    "image_arg": "-initrd {ramdisk}",
                    "format": "cpio.newc",
                    "overlays": {"lava": True},
                }
            },
        },
        "boot": {"method": "qemu", "media": "tmpfs", "prompts": ["# "]},
        "context": {"arch": "arm64"},
    }


def main() -> None:
    """Render, run, fetch, and print the outcome."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=cache_root() / "lava" / "run")
    args = parser.parse_args()
    work = args.out.resolve()
    shutil.rmtree(work, ignore_errors=True)
    root = cache_root() / "lava"
    unpacked, venv = dispatcher(root)
    image = require_image(parse_kernel_spec("bookworm"), say)
    pack(work)
    control_share(work)
    plan = parse_plan(PLAN | {"lava": lava_table(work, image.kernel.parent)}, "lava-qemu.toml")
    campaign = open_campaign(plan, "lava", work / "campaign" / "campaign.json")
    (cell_id, job_file), *_ = lava.write_jobs(plan, campaign, work / "campaign").items()
    job = json.loads(json.dumps(__import__("yaml").safe_load(job_file.read_text())))
    extra = job["context"]["extra_kernel_args"]
    # Not quiet: LAVA's boot waits for the kernel's "Linux version" line first.
    base = [arg for arg in BASE_KERNEL_ARGS if arg not in ("quiet", "loglevel=3")]
    append = " ".join([*base, *kernel_args_for(KVM_MODE), "tracekit.share=1", extra])
    device = work / "device.yaml"
    device.write_text(device_yaml(unpacked, venv, work, append))
    say(f"job {job_file.relative_to(work)}, device {device.relative_to(work)}; running lava-run")
    env = {
        "PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": f"{unpacked / SITE}:{root / 'stub'}",
        "HOME": str(work),
    }
    start = time.monotonic()
    log = work / "lava-run.log"
    with log.open("w") as handle:
        status = subprocess.run(
            [str(venv / "bin" / "python"), str(unpacked / "usr/bin/lava-run"),
             "--job-id", "1", "--output-dir", str(work / "lava-out"),
             "--device", str(device), str(job_file)],
            stdout=handle, stderr=subprocess.STDOUT, env=env, check=False,
        ).returncode  # fmt: skip
    minutes = (time.monotonic() - start) / 60
    summarise(work, log, status, minutes, plan, cell_id)


def summarise(work: Path, log: Path, status: int, minutes: float, plan, cell_id: str) -> None:  # type: ignore[no-untyped-def]
    """What the dispatcher did (its own results records), and the bundle the job left."""
    print(f"lava-run exit status {status} after {minutes:.1f} min (log {log.name})")
    for line in log.read_text(errors="replace").splitlines():
        try:
            # The dispatcher logs test-case line numbers with a YAML tag (`! "542"`).
            entry = json.loads(line.replace(': ! "', ': "'))
        except ValueError:
            continue
        if entry.get("lvl") == "results" and isinstance(entry.get("msg"), dict):
            result = entry["msg"]
            extra = result.get("extra", {})
            why = f" ({extra['fail']})" if isinstance(extra, dict) and "fail" in extra else ""
            print(f"  {result.get('definition')}/{result.get('case')}: {result.get('result')}{why}")
    # The store is /share/store inside the device and work/share/store here: same files.
    device_url = lava.bundle_url(plan, cell_id)
    here = device_url.replace("file:///share/", f"file://{work}/share/")
    fetched = lava.fetch_bundle(here, work / "campaign", cell_id)
    print(f"bundle uploaded by the job to {device_url}; fetched: {fetched}")
    if fetched:
        data = load_bundle(work / "campaign" / cell_id)
        m = data.manifest
        print(
            f"  {cell_id}: complete={m.complete}, kernel {m.host.get('kernel_release')},"
            f" KVM {m.host.get('kvm', {}).get('mode')}, {len(m.runs)} runs,"
            f" {data.latencies.height} cyclictest samples; emulated={m.host.get('emulated')}"
        )


if __name__ == "__main__":
    main()
