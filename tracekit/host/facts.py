"""The host facts a bundle records and a collection prints first, and the freshness gate.

Preflight (tracekit/host/preflight.py) reads the machine; this adds what KVM says
(tracekit/host/kvmstate.py: IPA limit, VMID width, whether a VM has run since boot),
EL2 tracing and tool versions, as plain JSON data for the manifest.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tracekit.cpus import format_cpu_list, parse_cpu_list
from tracekit.errors import TracekitError
from tracekit.host import tools as toolbox
from tracekit.host.kvmstate import (
    detect_el2_tracing,
    read_enable_virt_at_load,
    read_ipa_limit,
    read_vmid_state,
)
from tracekit.host.preflight import read_host_facts
from tracekit.host.procs import boot_id
from tracekit.host.tracefs import Tracefs


def online_cpus() -> list[int]:
    """The CPUs online now, from sysfs."""
    return parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text())


def host_facts(tools: toolbox.ToolPaths, rt_cpu: int, tracefs: Tracefs) -> dict[str, Any]:
    """Preflight facts (kernel, KVM mode, cores, isolation, emulation), KVM state, tools."""
    facts = jsonable(asdict(read_host_facts([rt_cpu])))
    uname = os.uname()
    facts["kernel_release"] = uname.release
    facts["machine"] = uname.machine
    facts["online_cpus"] = format_cpu_list(online_cpus())
    facts["emulated"] = facts["emulation"]["emulated"]
    # Cells of one boot share its state (the effect lasts until reboot): the campaign
    # analysis counts them as one boot, so each bundle says which boot it was.
    facts["boot_id"] = boot_id()
    simulated = simulated_model(facts["emulated"])
    if simulated:
        facts["simulated"] = simulated
    facts["tools"] = {
        "cyclictest": toolbox.tool_version([tools.cyclictest, "--help"]),
        "stress-ng": toolbox.tool_version([tools.stress_ng, "--version"]),
    }
    if tools.trace_cmd:
        facts["tools"]["trace-cmd"] = toolbox.tool_version([tools.trace_cmd, "--version"])
    facts["ipa_limit_bits"] = read_ipa_limit()
    facts["kvm_params"] = {"enable_virt_at_load": read_enable_virt_at_load()}
    facts["groundtruth_plugin"] = groundtruth_plugin(facts["emulated"])
    vmids = read_vmid_state(tracefs)
    facts["vmid_bits"] = vmids.bits
    # "fresh", "dirty" or "unknown": every report prints it (the effect lasts until reboot).
    facts["freshness"] = {
        "state": vmids.freshness,
        "evidence": vmids.evidence,
        "vmid_generation": vmids.generation,
        "vmid_map_word0": vmids.map0,
    }
    facts["el2_tracing"] = detect_el2_tracing(tracefs.root)
    return facts


def groundtruth_plugin(emulated: bool) -> str:
    """ "yes" when `tracekit vhost run --ground-truth` loaded QEMU's plugin under this host
    (its callbacks sit on every TLBI and DSB the measured paths run), else "no"."""
    loaded = emulated and os.environ.get("TRACEKIT_VHOST") == "1"
    return "yes" if loaded and os.environ.get("TRACEKIT_VHOST_GROUND_TRUTH") == "1" else "no"


def simulated_model(emulated: bool) -> dict[str, str] | None:
    """The simulated mechanism `tracekit vhost run --simulate` injected (name, hash), if any.

    Only an emulated host can carry one: the variable on a board is refused, never
    recorded (a board's bundle must never claim a model).
    """
    label = os.environ.get("TRACEKIT_SIMULATED")
    if not label:
        return None
    if not emulated or os.environ.get("TRACEKIT_VHOST") != "1":
        raise TracekitError(
            "TRACEKIT_SIMULATED is set on a host that is not tracekit's emulated one: "
            "a simulated mechanism exists only there; unset it"
        )
    name, _, digest = label.partition("@")
    return {"model": name, "hash": digest, "label": label}


def describe_host(facts: dict[str, Any]) -> list[str]:
    """The preflight lines printed before a collection starts."""
    cores = sorted({core["name"] for core in facts["cpus"]})
    isolation = facts["isolation"][0]
    isolated = [k for k in ("isolcpus", "nohz_full", "rcu_nocbs") if isolation.get(k)]
    freshness = facts["freshness"]
    lines = [
        f"host: {facts['kernel_release']} ({facts['machine']}), cores: {', '.join(cores)}",
        f"host: KVM mode {facts['kvm']['mode']} ({facts['kvm']['evidence']})",
        f"host: rt CPU {isolation['cpu']} isolation: {', '.join(isolated) or 'NONE'}",
        f"host: VMID width {facts['vmid_bits'] or 'unknown'} bits, IPA limit "
        f"{facts['ipa_limit_bits'] or 'unknown'} bits, EL2 tracing "
        f"{'offered' if facts['el2_tracing']['available'] else 'not offered'}",
        f"host: freshness {freshness['state']} ({freshness['evidence']})",
    ]
    if facts["emulated"]:
        lines.append(
            f"host: EMULATED ({facts['emulation']['kind']}): timings are not hardware timings"
        )
    if facts.get("simulated"):
        lines.append(
            f"host: SIMULATED EFFECT ({facts['simulated']['label']}): a modelled mechanism "
            "injected by the TCG plugin, not the hardware's"
        )
    return lines


def check_freshness(facts: dict[str, Any], needs_fresh: bool, allow_dirty: bool) -> None:
    """Refuse a host known to have run a VM when the scenario's "before" needs a fresh one."""
    freshness = facts["freshness"]
    if needs_fresh and freshness["state"] == "dirty" and not allow_dirty:
        raise TracekitError(
            f"this host is not fresh: {freshness['evidence']}; the state under study lasts "
            "until reboot, so reboot first (or pass --allow-dirty to collect anyway)"
        )


def jsonable(value: Any) -> Any:
    """Paths and tuples as JSON-friendly strings and lists."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
