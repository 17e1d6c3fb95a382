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
    help="Debian suite[:flavour], e.g. bookworm, trixie, sid:16k (see `vhost kernels`).",
)
@click.option("--force", is_flag=True, help="Rebuild even if the cached image is current.")
@click.option(
    "--ground-truth",
    is_flag=True,
    help="Also build the TCG plugin of `vhost run --ground-truth` (fetches QEMU's header).",
)
def build(kernel: str, force: bool, ground_truth: bool) -> None:
    """Fetch Debian arm64 packages and build the kernel + initramfs (cached by version)."""
    from tracekit.vhost.image import build_image
    from tracekit.vhost.kernels import parse_kernel_spec

    image = build_image(parse_kernel_spec(kernel), _progress, force=force)
    click.echo(f"{image.spec.name}: kernel {image.kernel_release}, image {image.directory}")
    if ground_truth:
        from tracekit.vhost.groundtruth import build_plugin

        click.echo(f"ground-truth plugin: {build_plugin(_progress)}")


@vhost.command()
@click.option("--refresh", is_flag=True, help="Fetch every suite's package lists first.")
def kernels(refresh: bool) -> None:
    """List the kernels --kernel takes: version on offer, cached image, KVM or not."""
    from tracekit.vhost.catalogue import cached_download_mb, list_kernels

    rows = [("KERNEL", "SERIES", "AVAILABLE", "CACHED", "DOWNLOAD", "KVM")]
    for entry in list_kernels(refresh=refresh, progress=_progress):
        size = cached_download_mb(entry.spec) if entry.cached_release else None
        cached = f"{entry.cached_release} ({entry.cached_version})" if entry.cached_release else "-"
        rows.append(
            (
                entry.spec.name,
                entry.series,
                entry.available or "? (no package lists: --refresh)",
                cached,
                "-" if size is None else f"{size:.0f} MB",
                entry.kvm,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]))
    click.echo(
        "DOWNLOAD: the .deb files of the cached image (what a cold cache fetches). "
        "Build one with `tracekit vhost build --kernel KERNEL`."
    )


@vhost.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--kvm-mode",
    type=click.Choice(KVM_MODES),
    default="nvhe",
    show_default=True,
    help="KVM mode to ask the kernel for (what it really did is reported).",
)
@click.option(
    "--kernel",
    default="bookworm",
    show_default=True,
    help="Debian suite[:flavour], e.g. trixie or sid:16k (see `vhost kernels`).",
)
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
@click.option(
    "--ground-truth",
    is_flag=True,
    help="Load the TCG plugin: every TLBI, DSB, IC IALLU(IS) logged into --out.",
)
@click.option(
    "--simulate",
    metavar="MODEL",
    help="Inject a simulated mechanism (a shipped model's name or a .toml file; "
    "docs/simulate.md); implies --ground-truth.",
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
    ground_truth: bool,
    simulate: str | None,
    command: tuple[str, ...],
) -> None:
    """Boot the emulated host and run COMMAND as root in it; exit with its status.

    Exit 3 instead of 0: under a --simulate model cleared by cpu-on, the plugin did not
    watch where the kernel enters after CPU_ON, or did not see each power-on the kernel
    logged there (the notes say why).

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
        ground_truth=ground_truth,
        simulate=simulate,
    )
    result = run_vhost(config, list(command), progress=_progress)
    booted = "" if result.boot_s is None else f"; booted in {result.boot_s:g} s"
    _progress(
        f"kernel {result.kernel_release} ({result.kernel}){booted}; KVM mode: {result.kvm_mode} "
        f"(asked {result.kvm_mode_requested}); /dev/kvm "
        f"{'present' if result.dev_kvm else 'absent'}"
    )
    for note in result.notes:
        _progress(note)
    _progress(f"exit status {result.exit_status}; logs in {result.out_dir}")
    sys.exit(result.exit_status)
