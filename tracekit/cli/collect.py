"""`tracekit collect`: root on the arm64 host; standard library, click and pyelftools only."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cpus import parse_cpu_list
from tracekit.errors import TracekitError


def _one_cpu(text: str, option: str) -> int:
    """A CPU list that must name exactly one CPU."""
    cpus = parse_cpu_list(text)
    if len(cpus) != 1:
        raise TracekitError(f"{option} takes exactly one CPU, not {text!r}")
    return cpus[0]


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
    type=click.Choice(["none", "hotplug", "rollover"]),
    help="What to do between the guest and the 'after' phase.",
)
@click.option(
    "--rollover-max-vms",
    default=70000,
    show_default=True,
    help="Budget of throwaway VMs for --after-guest rollover before giving up.",
)
@click.option("--scenario", default="main", show_default=True)
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
@click.option("--allow-dirty", is_flag=True, help="Collect even if a VM already ran.")
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
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
    events: tuple[str, ...],
    kprobe: tuple[str, ...],
    perf_counters: bool,
    buffer_kb: int,
    vmm: str | None,
    probe: str | None,
    probe_args: Path | None,
    allow_dirty: bool,
    dry_run: bool,
    output: Path,
) -> None:
    """Run the experiment on this arm64 host and record it into a bundle (root)."""
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
    )
    bundle = run_collect(options, echo=click.echo)
    if bundle is not None:
        click.echo(f"bundle: {bundle}")
