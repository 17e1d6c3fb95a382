"""`tracekit vhost`: build and boot the emulated arm64 host (thin layer over tracekit.vhost)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tracekit.vhost.kvmmode import KVM_MODES
from tracekit.vhost.qemu import CPU_MODELS


def _progress(message: str) -> None:
    """Progress and notes go to stderr, so stdout is the command's own output."""
    click.echo(f"vhost: {message}", err=True)


@click.group()
def vhost() -> None:
    """The emulated arm64 host: QEMU with EL2, a Debian arm64 kernel, KVM inside.

    Its timings are emulated, never hardware timings.
    """


@vhost.command()
@click.option(
    "--kernel",
    default="bookworm",
    show_default=True,
    help="Debian suite[:flavour], e.g. bookworm or bookworm:rt.",
)
@click.option("--force", is_flag=True, help="Rebuild even if the cached image is current.")
def build(kernel: str, force: bool) -> None:
    """Fetch Debian arm64 packages and build the kernel + initramfs (cached by version)."""
    from tracekit.vhost.image import build_image
    from tracekit.vhost.kernels import parse_kernel_spec

    image = build_image(parse_kernel_spec(kernel), _progress, force=force)
    click.echo(f"{image.spec.name}: kernel {image.kernel_release}, image {image.directory}")


@vhost.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--kvm-mode",
    type=click.Choice(KVM_MODES),
    default="nvhe",
    show_default=True,
    help="KVM mode to ask the kernel for (what it really did is reported).",
)
@click.option("--kernel", default="bookworm", show_default=True, help="Debian suite[:flavour].")
@click.option(
    "--cpu-model",
    type=click.Choice(CPU_MODELS),
    default="cortex-a76",
    show_default=True,
    help="QEMU CPU model (only max has VHE).",
)
@click.option("--smp", type=click.IntRange(1, 64), default=4, show_default=True, help="CPUs.")
@click.option(
    "--clusters",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Split the CPUs into this many clusters.",
)
@click.option(
    "--memory", type=click.IntRange(512), default=2048, show_default=True, help="Memory in MB."
)
@click.option("--append", default="", help="Extra kernel arguments, e.g. 'isolcpus=3'.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=600,
    show_default=True,
    help="Seconds before QEMU is stopped.",
)
@click.option(
    "--share",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A host directory mounted read-write at /share.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("vhost-out"),
    show_default=True,
    help="Output directory, mounted at /out (the command's working directory).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    kvm_mode: str,
    kernel: str,
    cpu_model: str,
    smp: int,
    clusters: int,
    memory: int,
    append: str,
    timeout: float,
    share: Path | None,
    out: Path,
    command: tuple[str, ...],
) -> None:
    """Boot the emulated host and run COMMAND as root in it; exit with its status.

    Inside: the project tree at /tracekit (read-only, on PYTHONPATH), --out at /out,
    --share at /share, tracefs at /sys/kernel/tracing.
    """
    from tracekit.vhost.runner import VhostConfig
    from tracekit.vhost.runner import run as run_vhost

    config = VhostConfig(
        kvm_mode=kvm_mode,
        kernel=kernel,
        cpu_model=cpu_model,
        smp=smp,
        clusters=clusters,
        memory_mb=memory,
        append=append,
        timeout_s=timeout,
        share=share,
        out=out,
    )
    result = run_vhost(config, list(command), progress=_progress)
    _progress(
        f"kernel {result.kernel_release} ({result.kernel}); KVM mode: {result.kvm_mode} "
        f"(asked {result.kvm_mode_requested}); /dev/kvm "
        f"{'present' if result.dev_kvm else 'absent'}"
    )
    for note in result.notes:
        _progress(note)
    _progress(f"exit status {result.exit_status}; logs in {result.out_dir}")
    sys.exit(result.exit_status)
