"""`tracekit vhost`: the emulated arm64 host (placeholder until the vhost work lands)."""

import click


@click.group()
def vhost() -> None:
    """The emulated arm64 host: QEMU with EL2, a Debian arm64 kernel, KVM inside."""
