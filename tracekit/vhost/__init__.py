"""The emulated arm64 host: Debian arm64 packages -> initramfs -> QEMU with EL2 and KVM.

Library entry point: `run(VhostConfig(...), command) -> VhostResult`. Only the standard
library and pyelftools (module dependencies) are used here, never polars, so this runs
anywhere tracekit's host side does.
"""

from tracekit.vhost.runner import VhostConfig, VhostResult, run

__all__ = ["VhostConfig", "VhostResult", "run"]
