"""`tracekit collect`: root on the arm64 host; standard library, click and pyelftools only."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cpus import parse_cpu_list
from tracekit.errors import TracekitError
from tracekit.host.protocol import AFTER_GUEST_ACTIONS


def _one_cpu(text: str, option: str) -> int:
    """A CPU list that must name exactly one CPU."""
    cpus = parse_cpu_list(text)
    if len(cpus) != 1:
        raise TracekitError(f"{option} takes exactly one CPU, not {text!r}")
    return cpus[0]


def _int_list(text: str | None, option: str) -> list[int]:
    """A comma-separated list of whole numbers ("36,40,44"); empty when not given."""
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise TracekitError(f"{option} takes numbers separated by commas, not {text!r}") from None


@click.command()
@click.option("--rt-cpu", required=True, help="The isolated CPU where cyclictest measures.")
@click.option("--stress-cpus", required=True, help="CPU list for stress-ng, e.g. 0-2.")
@click.option("--guest-cpu", "guest_cpus", required=True, help="CPU (list) for the guest.")
@click.option("--runs", default=8, show_default=True, help="Quiet runs per phase.")
@click.option("--traced-runs", default=2, show_default=True, help="Traced runs per phase.")
@click.option("--duration", default=20, show_default=True, help="Seconds per run.")
@click.option("--interval", default=1000, show_default=True, help="cyclictest interval (us).")
@click.option("--guest", type=click.Path(path_type=Path), help="Guest ELF (reproducer).")
@click.option(
    "--after-guest",
    default="none",
    show_default=True,
    type=click.Choice(list(AFTER_GUEST_ACTIONS)),
    help="What to do between the guest and the 'after' phase (hotplug-other: hotplug a"
    " stress CPU that did not run the guest, the control of hotplug; rollover-minus-one:"
    " the VMs of a rollover but one, so no rollover, the control of rollover;"
    " tlbi:OP@TARGET: one EL2 invalidation through reproducer/kpatch's interface, the"
    " VMID one needs --vmid).",
)
@click.option(
    "--rollover-max-vms",
    default=70000,
    show_default=True,
    help="Budget of throwaway VMs for --after-guest rollover (or rollover-minus-one)"
    " before giving up.",
)
@click.option(
    "--scenario",
    default="main",
    show_default=True,
    help="main, teardown, cache-toggle, guest-broadcast or vm-churn (--dry-run shows its plan).",
)
@click.option(
    "--ipa-bits",
    help="Guest IPA size(s); teardown sweeps them, e.g. 36,40,44 (default: up to the limit).",
)
@click.option("--vcpus", help="Guest vCPU count(s); cache-toggle sweeps them, e.g. 1,2,4.")
@click.option("--touch-kb", help="KB each vCPU touches; cache-toggle sweeps them, e.g. 0,4096.")
@click.option(
    "--repeat", type=int, help="teardown, cache-toggle: VMs per sweep point; vm-churn: VMs."
)
@click.option(
    "--hold-vm/--no-hold-vm",
    default=None,
    help="vm-churn: keep one idle, never-run VM open over the churn, so EL2 is not brought "
    "up and down per VM where KVM does not keep it up (6.1) (default: held).",
)
@click.option(
    "--tlbi-count",
    type=int,
    help="TLBIs a TLBI guest issues (any scenario; guest-broadcast's default: endless).",
)
@click.option(
    "--probe-modes",
    help="Probe slot modes, e.g. page,range: page (mprotect of one page), range (mprotect),"
    " munmap (default: the scenario's, page).",
)
@click.option(
    "--probe-pages",
    help="Range/munmap probe slots: page counts, e.g. 1,511,513 (the default: both sides"
    " of the kernel's 512-page by-VA limit).",
)
@click.option(
    "--vm-budget",
    type=int,
    help="Seconds one sweep point (or the vm-churn run) may take before it is stopped.",
)
@click.option(
    "--knob",
    "knobs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set one of the guest's knobs over its preset, e.g. spin_us=500 or pages=64 (repeatable;"
    " every knob: reproducer/README.md).",
)
@click.option(
    "--backing",
    default="4k",
    show_default=True,
    type=click.Choice(["4k", "thp", "hugetlb", "default"]),
    help="Guest RAM backing, and so the stage-2 page size (default: unaligned, as mmap gives).",
)
@click.option(
    "--vmid",
    type=int,
    help="Give the guest this VMID: VMID-1 throwaway MMU-off VMs run before the before phase "
    "(counted, recorded; that phase is then not a fresh host's).",
)
@click.option(
    "--function-graph",
    is_flag=True,
    help="Follow the TLB-flush/teardown paths (function_graph on 6.11+, else kprobes).",
)
@click.option(
    "--capture",
    default="raw",
    show_default=True,
    type=click.Choice(["raw", "trace-cmd"]),
    help="How traced runs are read out: tracekit's raw capture (runs/<run>/trace) or "
    "`trace-cmd extract` of the same instance (runs/<run>/trace.dat).",
)
@click.option("--events", multiple=True, help="Extra events (system/event), repeatable.")
@click.option("--kprobe", multiple=True, help="Extra kprobe definition, repeatable.")
@click.option("--perf-counters", is_flag=True, help="Record perf stat per CPU.")
@click.option("--buffer-kb", default=16384, show_default=True, help="Ring buffer per CPU.")
@click.option("--vmm", help="Path of the reproducer's vmm (default: reproducer/build).")
@click.option("--probe", help="Path of the reproducer's tlbiprobe.")
@click.option(
    "--probe-args",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="kprobe fetch arguments from `tracekit symbols probe-args` (kernels without BTF).",
)
@click.option(
    "--allow-dirty",
    is_flag=True,
    help="Collect even on a host where a VM already ran since boot (preflight reads it).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@click.option("--board-cpus", help="--dry-run for a board: its online CPUs (0-7), not this host's.")
@click.option("--board-ipa-bits", type=int, help="--dry-run for a board: its KVM's IPA limit.")
@click.option(
    "--board-facts",
    type=click.Path(path_type=Path, dir_okay=False),
    help="--dry-run for a board: a manifest.json recorded there, or JSON with online_cpus"
    " and ipa_limit_bits.",
)
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path))
def collect(
    rt_cpu: str,
    stress_cpus: str,
    guest_cpus: str,
    runs: int,
    traced_runs: int,
    duration: int,
    interval: int,
    guest: Path | None,
    after_guest: str,
    rollover_max_vms: int,
    scenario: str,
    ipa_bits: str | None,
    vcpus: str | None,
    touch_kb: str | None,
    repeat: int | None,
    tlbi_count: int | None,
    hold_vm: bool | None,
    probe_modes: str | None,
    probe_pages: str | None,
    vm_budget: int | None,
    knobs: tuple[str, ...],
    backing: str,
    vmid: int | None,
    function_graph: bool,
    capture: str,
    events: tuple[str, ...],
    kprobe: tuple[str, ...],
    perf_counters: bool,
    buffer_kb: int,
    vmm: str | None,
    probe: str | None,
    probe_args: Path | None,
    allow_dirty: bool,
    dry_run: bool,
    board_cpus: str | None,
    board_ipa_bits: int | None,
    board_facts: Path | None,
    output: Path,
) -> None:
    """Run the experiment on this arm64 host and record it into a bundle (root)."""
    from tracekit.host.board import board_from
    from tracekit.host.collect import CollectOptions
    from tracekit.host.collect import collect as run_collect

    options = CollectOptions(
        rt_cpu=_one_cpu(rt_cpu, "--rt-cpu"),
        stress_cpus=parse_cpu_list(stress_cpus),
        guest_cpus=parse_cpu_list(guest_cpus),
        output=output,
        guest=guest,
        runs=runs,
        traced_runs=traced_runs,
        duration_s=duration,
        interval_us=interval,
        after_guest=after_guest,
        scenario=scenario,
        events=list(events),
        kprobes=list(kprobe),
        perf_counters=perf_counters,
        buffer_kb=buffer_kb,
        allow_dirty=allow_dirty,
        dry_run=dry_run,
        vmm=vmm,
        probe=probe,
        probe_args=probe_args,
        rollover_max_vms=rollover_max_vms,
        function_graph=function_graph,
        capture=capture,
        ipa_bits=_int_list(ipa_bits, "--ipa-bits"),
        vcpus=_int_list(vcpus, "--vcpus"),
        touch_kb=_int_list(touch_kb, "--touch-kb"),
        repeat=repeat,
        tlbi_count=tlbi_count,
        vm_budget_s=vm_budget,
        hold_vm=hold_vm,
        probe_pages=_int_list(probe_pages, "--probe-pages"),
        probe_modes=[m for m in (probe_modes or "").split(",") if m],
        knobs=list(knobs),
        backing=backing,
        vmid=vmid,
        board=board_from(board_cpus, board_ipa_bits, board_facts),
    )
    bundle = run_collect(options, echo=click.echo)
    if bundle is not None:
        click.echo(f"bundle: {bundle}")
