"""Kernel choices for the emulated host: `SUITE[:FLAVOUR]` -> Debian package names.

Adding a suite or flavour is a data change here, not code elsewhere: the builder only
asks a KernelSpec which packages to fetch and which downloaded packages hold the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.errors import TracekitError


@dataclass(frozen=True)
class Flavour:
    """One Debian kernel flavour: its metapackage and whether KVM is built in."""

    metapackage: str
    has_kvm: bool
    note: str = ""
    page_kb: int = 4
    # "" for Debian's binary kernel; "base" or "kpatch" for one tracekit builds from
    # Debian's source with the default flavour's config, unpatched or with the series.
    build: str = ""
    kernel_args: tuple[str, ...] = ()
    # A built kernel's config: "full" (Debian's, trimmed) or "ci" (allnoconfig plus what
    # the emulated host and the kpatch tests need: kbuild.CI_ON, CI_KEPT_KCONFIGS).
    config: str = "full"


@dataclass(frozen=True)
class Suite:
    """One Debian suite that ships arm64 kernels the emulated host can boot."""

    name: str
    kernel_series: str
    flavours: dict[str, Flavour]


# The debug series' own switch: its interface exists only when the kernel is booted so.
KPATCH_ARGS = ("kvm-arm.debug_maint=1",)


def _built_flavours() -> dict[str, Flavour]:
    """The kernels tracekit builds from a suite's source: unpatched (A) and patched (B)."""
    return {
        "tk": Flavour(
            "linux-image-arm64",
            has_kvm=True,
            note="built by tracekit: Debian's source and config, trimmed, unpatched",
            build="base",
        ),
        "kpatch": Flavour(
            "linux-image-arm64",
            has_kvm=True,
            note="built by tracekit: as :tk plus reproducer/kpatch (EL2 maintenance debugfs)",
            build="kpatch",
            kernel_args=KPATCH_ARGS,
        ),
        "tk-ci": Flavour(
            "linux-image-arm64",
            has_kvm=True,
            note="built by tracekit: Debian's source, the smallest config CI boots, unpatched",
            build="base",
            config="ci",
        ),
        "kpatch-ci": Flavour(
            "linux-image-arm64",
            has_kvm=True,
            note="built by tracekit: as :tk-ci plus reproducer/kpatch",
            build="kpatch",
            kernel_args=KPATCH_ARGS,
            config="ci",
        ),
    }


# "" is the default flavour (the generic arm64 kernel).
SUITES: dict[str, Suite] = {
    "bookworm": Suite(
        name="bookworm",
        kernel_series="6.1",
        flavours={
            "": Flavour("linux-image-arm64", has_kvm=True),
            "rt": Flavour(
                "linux-image-rt-arm64",
                has_kvm=False,
                note="Debian builds the PREEMPT_RT flavour without KVM",
            ),
            **_built_flavours(),
        },
    ),
    "trixie": Suite(
        name="trixie",
        kernel_series="6.12",
        flavours={"": Flavour("linux-image-arm64", has_kvm=True), **_built_flavours()},
    ),
    # sid's kernel is split: linux-image-* depends on linux-binary-* (vmlinuz) and
    # linux-modules-* (modules as .ko.xz); both are taken as kernel packages below. Its
    # series is the one sid's linux-image-arm64 had when reproducer/kpatch/7.2 was
    # written (7.2.13-1): a newer sid kernel needs a port of the series first.
    "sid": Suite(
        name="sid",
        kernel_series="7.2",
        flavours={
            "": Flavour("linux-image-arm64", has_kvm=True),
            "16k": Flavour(
                "linux-image-arm64-16k",
                has_kvm=True,
                note="16 KB pages: needs a CPU model with the 16 KB granule",
                page_kb=16,
            ),
            **_built_flavours(),
        },
    ),
}

# Downloaded packages whose names start with these hold the kernel image, modules and
# config: sid splits the kernel into linux-binary-REL (usr/lib/modules/REL/vmlinuz),
# linux-modules-REL (.ko.xz) and linux-base-REL (config, System.map, dtbs); the generic
# `linux-base_*` package (no dash) is userland. They are unpacked apart from the rootfs,
# which only receives the few modules the host needs.
KERNEL_PACKAGE_PREFIXES = ("linux-image-", "linux-binary-", "linux-modules-", "linux-base-")

# The userland every emulated host carries (the kernel metapackage is added per spec).
USERLAND_PACKAGES = (
    "busybox-static",
    "libc-bin",
    "python3",
    "python3-click",
    "python3-pyelftools",
    "stress-ng",
    "rt-tests",
    "trace-cmd",
    "linux-perf",
    "kmod",
)

# Modules loaded at boot, roots of the dependency closure: virtio-pci transport and 9p.
BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p")


@dataclass(frozen=True)
class KernelSpec:
    """A parsed `--kernel` value: a Debian suite and an optional flavour."""

    suite: str
    flavour: str = ""

    @property
    def name(self) -> str:
        """The spec as the user writes it, e.g. `bookworm` or `bookworm:rt`."""
        return f"{self.suite}:{self.flavour}" if self.flavour else self.suite

    @property
    def info(self) -> Flavour:
        """The flavour's package data."""
        return SUITES[self.suite].flavours[self.flavour]

    @property
    def has_kvm(self) -> bool:
        """Whether this kernel can run guests at all."""
        return self.info.has_kvm

    def packages(self) -> list[str]:
        """Every package to fetch by name for this kernel's image."""
        return [self.info.metapackage, *USERLAND_PACKAGES]


def known_specs() -> list[str]:
    """Every `--kernel` value that can be had, for messages and help."""
    return [
        KernelSpec(suite, flavour).name
        for suite, info in SUITES.items()
        for flavour in info.flavours
    ]


def parse_kernel_spec(text: str) -> KernelSpec:
    """Parse `SUITE[:FLAVOUR]`; unknown values name the ones that exist."""
    suite, _, flavour = text.strip().partition(":")
    choices = ", ".join(known_specs())
    if suite not in SUITES:
        raise TracekitError(
            f"unknown kernel suite {suite!r} in --kernel {text!r}; use one of: {choices}"
        )
    if flavour not in SUITES[suite].flavours:
        raise TracekitError(
            f"unknown kernel flavour {flavour!r} for suite {suite!r}; use one of: {choices}"
        )
    return KernelSpec(suite, flavour)


def is_kernel_package(deb_filename: str) -> bool:
    """Whether a downloaded .deb holds the kernel (image or modules), not userland."""
    return deb_filename.startswith(KERNEL_PACKAGE_PREFIXES)
