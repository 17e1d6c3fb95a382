"""Which kernels the emulated host can boot: what is cached, what Debian offers now.

The offer is read from each suite's private apt lists (no network unless asked to
refresh them), so `tracekit vhost kernels` works offline and says when it does not know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tracekit.errors import TracekitError
from tracekit.vhost import apt
from tracekit.vhost.cache import vhost_cache
from tracekit.vhost.image import IMAGE_RECORD, find_image
from tracekit.vhost.kernels import SUITES, KernelSpec


@dataclass(frozen=True)
class KernelEntry:
    """One `--kernel` choice: its series, the version on offer, the cached image, KVM."""

    spec: KernelSpec
    series: str
    available: str  # the metapackage's version in the apt lists, "" if unknown
    cached_release: str  # the cached image's kernel release, "" if none
    cached_version: str  # the cached image's metapackage version, "" if none

    @property
    def kvm(self) -> str:
        """`yes`, or `no` with Debian's reason."""
        return "yes" if self.spec.has_kvm else f"no ({self.spec.info.note})"


def _apt_state(suite: str) -> apt.AptState:
    """The suite's private apt state (the one `vhost build` uses)."""
    return apt.AptState(vhost_cache() / "apt" / suite, suite, apt.mirror_from_env())


def _has_lists(state: apt.AptState) -> bool:
    """Whether the suite's package lists were ever fetched."""
    return any((state.root / "lists").glob("*_Packages*"))


def available_version(spec: KernelSpec) -> str:
    """The version apt would install for the spec's metapackage, from the local lists."""
    state = _apt_state(spec.suite)
    if not _has_lists(state):
        return ""
    try:
        closure = apt.resolve(state, [spec.info.metapackage])
    except TracekitError:
        return ""
    return next((p.version for p in closure if p.name == spec.info.metapackage), "")


def _cached_version(spec: KernelSpec, packages: list[str]) -> str:
    """The metapackage version recorded in a cached image's package list."""
    prefix = f"{spec.info.metapackage}="
    return next((p.removeprefix(prefix) for p in packages if p.startswith(prefix)), "")


def list_kernels(
    refresh: bool = False, progress: apt.Progress = lambda message: None
) -> list[KernelEntry]:
    """Every known kernel spec with what is cached and what can be had."""
    if refresh:
        for suite in SUITES:
            state = _apt_state(suite)
            apt.check_tools(state)
            apt.update(state, progress)
    entries = []
    for suite, info in SUITES.items():
        for flavour in info.flavours:
            spec = KernelSpec(suite, flavour)
            image = find_image(spec)
            packages = image.packages if image else []
            entries.append(
                KernelEntry(
                    spec=spec,
                    series=info.kernel_series,
                    available=available_version(spec),
                    cached_release=image.kernel_release if image else "",
                    cached_version=_cached_version(spec, packages),
                )
            )
    return entries


def cached_download_mb(spec: KernelSpec) -> float | None:
    """Size of the .deb files a cached image was built from, in MB (its cold download)."""
    image = find_image(spec)
    if image is None:
        return None
    archives = _apt_state(spec.suite).archives
    total = 0
    for entry in json.loads((image.directory / IMAGE_RECORD).read_text())["packages"]:
        name, _, version = entry.partition("=")
        matches = list(archives.glob(f"{name}_{version.replace(':', '%3a')}_*.deb"))
        total += sum(path.stat().st_size for path in matches)
    return round(total / 1e6, 1)
