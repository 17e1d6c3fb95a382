"""One example per command, shown at the end of its --help (as git and perf do).

Kept in one table so every command has one and a test can parse each against its
command's options.
"""

from __future__ import annotations

import click

EXAMPLES: dict[str, list[str]] = {
    "board-pack": ["tracekit board-pack -o tracekit-board.tar.gz"],
    "campaign": [
        "tracekit campaign plan.toml -o camp",
        "tracekit campaign plan.toml --board --state /var/lib/tracekit/campaign.json"
        " -o /var/lib/tracekit/campaign --reboot",
        "tracekit campaign plan.toml -o camp --lava --lava-identity lab",
    ],
    "dataset": [
        "tracekit dataset camp-a camp-b -o results/",
        "tracekit dataset camp-c -o results/ --campaign a76-vmid",
    ],
    "cleanup": ["sudo python3 -m tracekit cleanup"],
    "collect": [
        "sudo python3 -m tracekit collect --rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1 -o bundle",
        "tracekit collect --rt-cpu 3 --stress-cpus 0-2 --guest-cpu 1 -o bundle --dry-run",
    ],
    "events": [
        "tracekit events trace.dat --event sched_switch --cpu 0-2,5 --format csv",
        "tracekit events bundle --phase after --event kvm_exit --limit 20",
    ],
    "ingest": [
        "tracekit ingest trace.dat",
        "tracekit ingest bundle --parquet bundle-tables/",
    ],
    "perfetto": [
        "tracekit perfetto bundle --open",
        "tracekit perfetto bundle --phase after --window 10:12 -o after.pftrace",
    ],
    "report": [
        "tracekit report bundle",
        "tracekit report bundle --format email -o reply.txt",
        "tracekit report camp/ --format html -o report.html",
        "tracekit report results/",
    ],
    "simulate": ["tracekit simulate models"],
    "simulate models": ["tracekit simulate models"],
    "simulate predict": ["tracekit simulate predict brief-literal plan.toml"],
    "symbols": ["tracekit symbols resolve vmlinux 0xffff800008123456 --kallsyms kallsyms.txt"],
    "symbols fetch": ["tracekit symbols fetch --kernel bookworm"],
    "symbols guest": ["tracekit symbols guest reproducer/build/guests/mmu-on.elf"],
    "symbols hypcalls": ["tracekit symbols hypcalls --release 6.1.0-50-arm64"],
    "symbols offsetof": ["tracekit symbols offsetof vmlinux kvm_s2_mmu.vmid"],
    "symbols probe-args": ["tracekit symbols probe-args vmlinux -o probe-args.json"],
    "symbols resolve": ["tracekit symbols resolve kallsyms.txt 0xffff800008123456"],
    "verify": ["tracekit verify bundle"],
    "vhost": ["tracekit vhost run --kvm-mode nvhe --smp 4 -- uname -a"],
    "vhost build": ["tracekit vhost build"],
    "vhost kernels": ["tracekit vhost kernels"],
    "vhost run": [
        "tracekit vhost run --kvm-mode nvhe --cpu-model cortex-a76 --smp 4 --"
        " /tracekit/reproducer/build/vmm --cpus 1 /tracekit/reproducer/build/guests/mmu-on.elf",
    ],
}


def add_examples_to(key: str, command: click.Command) -> None:
    """Put the examples of the command KEY ("symbols fetch") at the end of its help, and
    those of its subcommands at the end of theirs."""
    lines = EXAMPLES.get(key)
    if lines:
        # \b keeps click from rewrapping the lines.
        command.epilog = "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            add_examples_to(f"{key} {name}", sub)
