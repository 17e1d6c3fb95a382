"""The kernels of the `:tk` and `:kpatch` flavours: Debian's source, built by tracekit.

Both start from the source and config of the Debian kernel the suite's default flavour
boots, trimmed the same way (kbuild.py): `:tk` is that tree unpatched, `:kpatch` the
same tree with reproducer/kpatch/<series>/ applied. `:tk-ci` and `:kpatch-ci` are the
same pair with the CI config made from that trimmed one (kbuild.ci_fragment). The
unpatched build is always made too, so that the patched kernel is only ever compared
with it, never with Debian's.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.vhost import apt, kbuild, ksource
from tracekit.vhost.kernels import SUITES as SUITES_BY_NAME
from tracekit.vhost.kernels import KernelSpec
from tracekit.vhost.rootfs import KernelFiles

Progress = Callable[[str], None]

# The series written for each suite's kernel (reproducer/kpatch/<series>/).
SERIES = {"bookworm": "6.1", "trixie": "6.12", "sid": "7.2"}
# Set in both builds' config input: Kconfig of the unpatched tree drops what it lacks,
# so A and B are built from the same input.
SERIES_SYMBOLS = ("KVM_ARM_DEBUG_MAINT",)
# Set per suite in both builds' input, over Debian's setting (which is off): 7.2's nVHE
# hypervisor tracing (NVHE_EL2_TRACING, hidden, default y with ftrace) exists only
# inside `if NVHE_EL2_DEBUG` (arch/arm64/kvm/Kconfig). That debug mode also turns on
# pKVM's EL2 ownership selftest at its init, 32 more hyp pages and EL2 lock assertions
# (BUG_ON, pKVM only); hyp panics' host stage-2 relaxing and pKVM stack traces are
# PKVM_DISABLE_STAGE2_ON_PANIC's in 7.2, which stays off.
SUITE_SYMBOLS = {"sid": ("NVHE_EL2_DEBUG",)}
# Checked on in both builds' .config: the symbols set, and what they were set for.
SUITE_EXPECTED = {"sid": ("NVHE_EL2_DEBUG", "NVHE_EL2_TRACING")}


def built_suites() -> list[str]:
    """The suites with a series that tracekit also builds (a `:kpatch` flavour)."""
    return [s for s in SERIES if s in SUITES_BY_NAME and "kpatch" in SUITES_BY_NAME[s].flavours]


def series_dir(suite: str) -> Path:
    """reproducer/kpatch/<series>/ of the checkout, for a suite that has one."""
    from tracekit.vhost.runner import project_tree

    if suite not in SERIES:
        raise TracekitError(
            f"no kernel patch series for {suite} yet (reproducer/kpatch/ has: "
            f"{', '.join(SERIES.values())}); use --kernel {'|'.join(built_suites())}:kpatch"
        )
    return project_tree() / "reproducer" / "kpatch" / SERIES[suite]


# The packages that may hold the kernel's config: linux-image-ABI-FLAVOUR (bookworm,
# trixie: boot/config-REL), or sid's linux-base-ABI-FLAVOUR (usr/lib/modules/REL/config;
# its linux-image-* is only dependencies). Not the generic `linux-base_*` (userland).
CONFIG_PACKAGES = ("linux-image-", "linux-base-")


def is_config_path(name: str) -> bool:
    """Whether a path in a kernel package's data is the config the kernel was built with."""
    parts = name.split("/")
    if name.startswith("./boot/config-"):
        return True
    return name.startswith("./usr/lib/modules/") and len(parts) == 6 and parts[-1] == "config"


def debian_kernel_deb(debs: list[Path]) -> Path:
    """The downloaded package of the suite's kernel that ships its config."""
    for deb in debs:
        if deb.name.startswith(CONFIG_PACKAGES) and _deb_member(deb, is_config_path):
            return deb
    raise TracekitError(
        "the suite's kernel packages hold no boot/config-* nor usr/lib/modules/*/config: "
        "cannot take its config"
    )


def _deb_member(deb: Path, wanted: Callable[[str], bool]) -> bytes | None:
    """The first file of a .deb's data whose path `wanted` accepts."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        for member in tar:
            if member.isfile() and wanted(member.name):
                extracted = tar.extractfile(member)
                return extracted.read() if extracted else None
    return None


def debian_version(deb: Path) -> str:
    """The package's version: that of the `linux` source it was built from."""
    done = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def debian_config_text(deb: Path) -> str:
    """The config the Debian kernel package ships: the one its kernel was built with."""
    return (_deb_member(deb, is_config_path) or b"").decode()


def debian_inputs(suite: str, progress: Progress) -> tuple[str, str]:
    """The Debian kernel version and config a suite boots today (its packages fetched)."""
    spec = KernelSpec(suite)
    state = ksource.binary_state(suite)
    apt.update(state, progress)
    closure = apt.resolve(state, spec.packages())
    deb = debian_kernel_deb(apt.download(state, spec.packages(), closure, progress))
    return debian_version(deb), debian_config_text(deb)


def with_symbols_on(config: str, names: tuple[str, ...]) -> str:
    """`config` with each named symbol set to y in place of its own line."""
    lines = [line for line in config.splitlines() if kbuild.symbol_of(line) not in names]
    return "\n".join([*lines, *(f"CONFIG_{name}=y" for name in names)]) + "\n"


def input_config(debian_config: str, tree: Path, config: str = "full", suite: str = "") -> str:
    """The config both builds start from: Debian's, trimmed (`full`), or the CI config
    made from it (`ci`, kbuild.ci_fragment), the suite's and the series' symbols on."""
    trimmed = kbuild.trimmed_config(debian_config, kbuild.platform_symbols(tree))
    trimmed = with_symbols_on(trimmed, SUITE_SYMBOLS.get(suite, ()))
    if config == "ci":
        with tempfile.TemporaryDirectory(prefix="ci-config-", dir=tree.parent) as scratch:
            trimmed = kbuild.ci_config(tree, kbuild.ci_fragment(trimmed, tree), Path(scratch))
    return trimmed + "".join(f"CONFIG_{name}=y\n" for name in SERIES_SYMBOLS)


def build_for(spec: KernelSpec, debs: list[Path], progress: Progress) -> kbuild.BuiltKernel:
    """The built kernel of a `:tk` or `:kpatch` spec (and the unpatched one beside it)."""
    deb = debian_kernel_deb(debs)
    version = debian_version(deb)
    tree = ksource.pristine_tree(spec.suite, version, progress)
    wanted = input_config(debian_config_text(deb), tree, spec.info.config, spec.suite)
    base = kbuild.build_kernel(tree, wanted, version, "", progress)
    _check_on(base, SUITE_EXPECTED.get(spec.suite, ()), "the suite's input config sets")
    result = base
    if spec.info.build == "kpatch":
        patches = ksource.series_files(series_dir(spec.suite))
        patched = ksource.patched_tree(tree, patches, progress)
        touched = ksource.touched_files(patches)
        result = kbuild.build_kernel(
            patched,
            wanted,
            version,
            ksource.series_hash(patches),
            progress,
            seed=base.directory,
            changed=touched,
        )
        _check_on(result, SUITE_EXPECTED.get(spec.suite, ()), "the suite's input config sets")
        _check_series_on(result)
        _check_series_warnings(result, touched)
    kbuild.enforce_cap(ksource.source_root(), [base.directory, result.directory], progress)
    return result


def _check_on(kernel: kbuild.BuiltKernel, names: tuple[str, ...], why: str) -> None:
    """One line if the build's config lost a symbol it was meant to have."""
    lines = set((kernel.directory / ".config").read_text().splitlines())
    lost = [name for name in names if f"CONFIG_{name}=y" not in lines]
    if lost:
        raise TracekitError(
            f"{kernel.release}'s config has no {', '.join(lost)}, which {why} "
            f"(kcustom.SUITE_SYMBOLS): this source's Kconfig differs from what tracekit expects"
        )


def _check_series_on(kernel: kbuild.BuiltKernel) -> None:
    """One line if the patched build's config lost the series' symbols."""
    lines = set((kernel.directory / ".config").read_text().splitlines())
    lost = [name for name in SERIES_SYMBOLS if f"CONFIG_{name}=y" not in lines]
    if lost:
        raise TracekitError(
            f"the patched kernel's config has no {', '.join(lost)}: the series did not add "
            "its Kconfig symbol (check reproducer/kpatch/ against this source)"
        )


def series_warnings(log_text: str, touched: list[str]) -> list[str]:
    """The compiler's warnings in a build log that name a file the series writes."""
    # Kbuild names sources relative to the build directory (`../PATH`), headers too.
    names = {f"../{path}" for path in touched} | set(touched)
    found = []
    for line in log_text.splitlines():
        where, sep, _ = line.partition(": warning: ")
        if sep and where.split(":", 1)[0] in names:
            found.append(line)
    return found


def _check_series_warnings(kernel: kbuild.BuiltKernel, touched: list[str]) -> None:
    """One line if compiling the series warned (the kernel's own -Werror is off)."""
    log = kernel.directory / kbuild.BUILD_LOG
    found = series_warnings(log.read_text(errors="replace"), touched) if log.is_file() else []
    if found:
        raise TracekitError(
            f"the patched kernel built, but the series warns ({len(found)}: {found[0]}): "
            f"fix reproducer/kpatch/ (full log: {log})"
        )


def kernel_files(kernel: kbuild.BuiltKernel) -> KernelFiles:
    """The build as the image builder takes a kernel: every module is built in."""
    modules = kernel.directory / "tracekit-modules" / kernel.release
    (modules / "kernel").mkdir(parents=True, exist_ok=True)
    (modules / "modules.builtin").write_bytes((kernel.directory / "modules.builtin").read_bytes())
    return KernelFiles(kernel.image, kernel.release, modules, kernel.directory / ".config")
