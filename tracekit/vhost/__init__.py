"""The emulated arm64 host: Debian arm64 packages -> initramfs -> QEMU with EL2 and KVM.

Library entry point: `run(VhostConfig(...), command) -> VhostResult`. Only the standard
library and pyelftools (module dependencies) are used here, never polars, so this runs
anywhere tracekit's host side does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracekit.vhost.runner import VhostConfig, VhostResult, run

__all__ = ["VhostConfig", "VhostResult", "run"]


def __getattr__(name: str) -> object:
    """The entry point, imported on first use: the CLI's option choices (kvmmode, qemu)
    must not pull in the image builder and pyelftools, half of every `tracekit` start
    (~6 s of `collect`'s in the emulated host)."""
    if name in __all__:
        from tracekit.vhost import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
