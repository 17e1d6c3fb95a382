"""tracekit's own kernels: config trimming, release strings, the patch series, the cache.

The fast tests run on configs and trees made here. The `kbuild` ones need Debian's
bookworm, trixie and sid linux sources (the versions they ship today, fetched into the
cache, ~140 MB, ~150 MB and ~165 MB) and, for the boots, the CI kernels' cross builds
(~7, ~10 and ~12 min cold on this 2-core machine).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tracekit.errors import TracekitError
from tracekit.vhost import kbuild, kcustom, ksource
from tracekit.vhost.kernels import BOOT_MODULES, parse_kernel_spec
from tracekit.vhost.kernels import SUITES as SUITES_BY_NAME
from tracekit.vhost.rootfs import install_modules

KPATCH = Path(__file__).parent.parent / "reproducer" / "kpatch"
SERIES = KPATCH / "6.1"
# Each suite with a series, and that series.
SUITES = pytest.mark.parametrize("suite", sorted(kcustom.SERIES))
# The suites whose series tracekit also builds (all three).
BUILT = pytest.mark.parametrize("suite", sorted(kcustom.built_suites()))


@functools.cache
def suite_version(suite: str) -> str:
    """The version a suite ships today: Debian's pool keeps only the current one."""
    return kcustom.debian_inputs(suite, print)[0]


def bookworm_version() -> str:
    """The 6.1 version bookworm ships today."""
    return suite_version("bookworm")


DEBIAN_LIKE = """\
CONFIG_LOCALVERSION="-debian"
CONFIG_KVM=y
CONFIG_VIRTIO_PCI=m
CONFIG_NET_9P=m
CONFIG_NET_9P_VIRTIO=m
CONFIG_9P_FS=m
CONFIG_EXT4_FS=m
CONFIG_ARCH_ROCKCHIP=y
CONFIG_ARCH_VEXPRESS=y
CONFIG_XEN=y
CONFIG_DEBUG_INFO=y
CONFIG_DEBUG_INFO_DWARF_TOOLCHAIN_DEFAULT=y
# CONFIG_DEBUG_INFO_NONE is not set
CONFIG_DEBUG_INFO_BTF=y
CONFIG_MODULE_SIG=y
CONFIG_SYSTEM_TRUSTED_KEYS="debian/certs/debian-uefi-certs.pem"
CONFIG_KPROBES=y
# CONFIG_FOO is not set
"""


def _lines(config: str) -> set[str]:
    """A config's lines as a set."""
    return set(config.splitlines())


def test_trimmed_config_keeps_what_the_image_needs() -> None:
    """Modules off, the 9p chain built in, SoCs, Xen, DWARF, BTF and signing off."""
    trimmed = _lines(kbuild.trimmed_config(DEBIAN_LIKE, ["ARCH_ROCKCHIP", "ARCH_VEXPRESS"]))
    for name in ("VIRTIO_PCI", "NET_9P", "NET_9P_VIRTIO", "9P_FS", "KVM", "KPROBES"):
        assert f"CONFIG_{name}=y" in trimmed
    for name in ("EXT4_FS", "ARCH_ROCKCHIP", "ARCH_VEXPRESS", "XEN", "DEBUG_INFO", "MODULE_SIG"):
        assert f"# CONFIG_{name} is not set" in trimmed
    assert "# CONFIG_DEBUG_INFO_BTF is not set" in trimmed
    assert "CONFIG_DEBUG_INFO_NONE=y" in trimmed
    assert 'CONFIG_SYSTEM_TRUSTED_KEYS=""' in trimmed
    assert 'CONFIG_LOCALVERSION=""' in trimmed
    assert "# CONFIG_FOO is not set" in trimmed


def test_trimmed_config_adds_missing_builtins() -> None:
    """A config without the 9p symbols still gets them (olddefconfig checks the rest)."""
    trimmed = _lines(kbuild.trimmed_config("CONFIG_KVM=y\n", []))
    assert {"CONFIG_9P_FS=y", "CONFIG_NET_9P_VIRTIO=y", "CONFIG_KVM=y"} <= trimmed


def test_series_symbols_are_in_both_builds_input(tmp_path: Path) -> None:
    """A and B start from one config: the series' Kconfig symbol is set for both."""
    (tmp_path / "arch" / "arm64").mkdir(parents=True)
    (tmp_path / "arch" / "arm64" / "Kconfig.platforms").write_text(
        "menu x\nconfig ARCH_ROCKCHIP\n\tbool\nconfig ARCH_XGENE\n\tbool\n"
    )
    assert kbuild.platform_symbols(tmp_path) == ["ARCH_ROCKCHIP", "ARCH_XGENE"]
    config = kcustom.input_config(DEBIAN_LIKE, tmp_path)
    assert "CONFIG_KVM_ARM_DEBUG_MAINT=y" in _lines(config)
    assert "# CONFIG_ARCH_ROCKCHIP is not set" in _lines(config)


def test_suite_symbols_replace_debians_setting(tmp_path: Path) -> None:
    """sid's input sets NVHE_EL2_DEBUG (7.2's hypervisor tracing hangs on it) in place of
    Debian's `is not set`, for A and B alike; the other suites' inputs leave it alone."""
    (tmp_path / "arch" / "arm64").mkdir(parents=True)
    (tmp_path / "arch" / "arm64" / "Kconfig.platforms").write_text("config ARCH_XGENE\n")
    debian = DEBIAN_LIKE + "# CONFIG_NVHE_EL2_DEBUG is not set\n"
    sid = _lines(kcustom.input_config(debian, tmp_path, suite="sid"))
    assert "CONFIG_NVHE_EL2_DEBUG=y" in sid
    assert "# CONFIG_NVHE_EL2_DEBUG is not set" not in sid
    trixie = _lines(kcustom.input_config(debian, tmp_path, suite="trixie"))
    assert "# CONFIG_NVHE_EL2_DEBUG is not set" in trixie
    assert sid - {"CONFIG_NVHE_EL2_DEBUG=y"} == trixie - {"# CONFIG_NVHE_EL2_DEBUG is not set"}


def test_config_hash_and_release_suffix() -> None:
    """The release names the config and, patched, the series; unpatched has no -kp."""
    digest = kbuild.config_hash("CONFIG_KVM=y\n")
    assert digest == kbuild.config_hash("CONFIG_KVM=y\n")
    assert digest != kbuild.config_hash("CONFIG_KVM=n\n")
    assert kbuild.release_suffix(digest, "") == f"-tk{digest[:6]}"
    assert kbuild.release_suffix(digest, "0123abcd") == f"-tk{digest[:6]}-kp0123abcd"


@BUILT
def test_built_flavours(suite: str) -> None:
    """SUITE:tk and SUITE:kpatch build Debian's source; only kpatch enables the series,
    the one written for the suite's kernel series."""
    tk, kp = parse_kernel_spec(f"{suite}:tk"), parse_kernel_spec(f"{suite}:kpatch")
    assert (tk.info.build, kp.info.build) == ("base", "kpatch")
    assert tk.info.kernel_args == ()
    assert kp.info.kernel_args == ("kvm-arm.debug_maint=1",)
    assert tk.packages() == parse_kernel_spec(suite).packages()
    assert kcustom.SERIES[suite] == SUITES_BY_NAME[suite].kernel_series
    assert kcustom.series_dir(suite) == KPATCH / kcustom.SERIES[suite]


def test_a_suite_without_a_series() -> None:
    """A suite without a series: one line naming the series there are and the suites
    that build one."""
    with pytest.raises(
        TracekitError,
        match=r"no kernel patch series for forky .*6\.1, 6\.12, 7\.2\).*"
        r"bookworm\|trixie\|sid:kpatch",
    ):
        kcustom.series_dir("forky")
    assert kcustom.built_suites() == ["bookworm", "trixie", "sid"]
    assert kcustom.series_dir("sid") == KPATCH / "7.2"


def test_ci_fragment_keeps_the_kept_files_settings(tmp_path: Path) -> None:
    """The CI fragment: the full config's settings of symbols the kept Kconfig files
    define (as they are, on or off), CI_OFF off even there, CI_ON on, nothing else."""
    (tmp_path / "arch" / "arm64").mkdir(parents=True)
    (tmp_path / "arch" / "arm64" / "Kconfig").write_text(
        "config ARM64_ERRATUM_4118414\n\tbool\nmenuconfig ARM64_SVE\n\tbool\n"
        "config EFI\n\tbool\nconfig ARM64_MTE\n\tbool\n"
    )
    full = (
        "CONFIG_ARM64_ERRATUM_4118414=y\nCONFIG_ARM64_SVE=y\n# CONFIG_ARM64_MTE is not set\n"
        "CONFIG_EFI=y\nCONFIG_EXT4_FS=y\nCONFIG_KVM=y\n"
    )
    fragment = _lines(kbuild.ci_fragment(full, tmp_path))
    kept = {"CONFIG_ARM64_ERRATUM_4118414=y", "CONFIG_ARM64_SVE=y", "# CONFIG_ARM64_MTE is not set"}
    assert kept <= fragment
    assert "# CONFIG_EFI is not set" in fragment and "CONFIG_EFI=y" not in fragment
    assert not any("EXT4_FS" in line for line in fragment)  # allnoconfig turns it off
    assert {f"CONFIG_{name}=y" for name in kbuild.CI_ON} <= fragment


@BUILT
def test_ci_flavours_build_the_ci_config(suite: str) -> None:
    """SUITE:tk-ci and :kpatch-ci are :tk and :kpatch with the CI config."""
    tk, kp = parse_kernel_spec(f"{suite}:tk-ci"), parse_kernel_spec(f"{suite}:kpatch-ci")
    assert (tk.info.build, kp.info.build) == ("base", "kpatch")
    assert (tk.info.config, kp.info.config) == ("ci", "ci")
    assert kp.info.kernel_args == parse_kernel_spec(f"{suite}:kpatch").info.kernel_args
    assert parse_kernel_spec(f"{suite}:kpatch").info.config == "full"


@pytest.mark.kbuild
def test_ci_config_of_debian_source_keeps_what_the_tests_need(tmp_path: Path) -> None:
    """allnoconfig plus the fragment, on Debian's 6.1 source and config: everything the
    image and the kpatch tests need is on, and about half of the full config's options."""
    tree = ksource.pristine_tree("bookworm", bookworm_version(), print)
    full = kbuild.trimmed_config(DEBIAN_LIKE, kbuild.platform_symbols(tree))
    config = kbuild.ci_config(tree, kbuild.ci_fragment(full, tree), tmp_path)
    lines = _lines(config)
    wanted = set(kbuild.REQUIRED) | set(kbuild.CI_ON) - set(kcustom.SERIES_SYMBOLS)
    assert not [name for name in sorted(wanted) if f"CONFIG_{name}=y" not in lines]
    assert "# CONFIG_EFI is not set" in lines and "# CONFIG_EXT4_FS is not set" in lines


@pytest.mark.kbuild
def test_sids_ci_config_has_the_hypervisor_tracing() -> None:
    """sid's CI config, made from its Debian config (NVHE_EL2_DEBUG off there) and its 7.2
    source: NVHE_EL2_DEBUG on, and with it 7.2's nVHE hypervisor tracing (hidden, default
    y with ftrace) and the trace remote it selects; the pKVM panic option stays off."""
    version, debian = kcustom.debian_inputs("sid", print)
    assert "# CONFIG_NVHE_EL2_DEBUG is not set" in _lines(debian)
    tree = ksource.pristine_tree("sid", version, print)
    lines = _lines(kcustom.input_config(debian, tree, "ci", "sid"))
    assert {"CONFIG_NVHE_EL2_TRACING=y", "CONFIG_TRACE_REMOTE=y"} <= lines
    assert "# CONFIG_PKVM_DISABLE_STAGE2_ON_PANIC is not set" in lines


@SUITES
def test_the_series_lists_its_patches_in_order(suite: str) -> None:
    """Each shipped series: every file listed, hash over the contents in order."""
    patches = ksource.series_files(kcustom.series_dir(suite))
    assert [p.name[:4] for p in patches] == ["0001", "0002", "0003"]
    assert len(ksource.series_hash(patches)) == 8
    assert ksource.series_hash(patches) != ksource.series_hash(patches[::-1])
    touched = ksource.touched_files(patches)
    assert "arch/arm64/kvm/debug_maint.c" in touched
    assert "arch/arm64/kvm/mmu.c" in touched


def _subjects(series: Path) -> list[str]:
    """Each patch's subject line, its "[PATCH n/m]" cut (format-patch folds long ones)."""
    found = []
    for patch in ksource.series_files(series):
        header = patch.read_text().split("\n\n", 1)[0]
        subject = re.search(r"^Subject: (.*(?:\n .*)*)", header, re.M)
        assert subject is not None, patch.name
        found.append(re.sub(r"^\[PATCH [^]]*\] ", "", " ".join(subject.group(1).split())))
    return found


# Files a port's patch 2 writes instead of 6.1's arch/arm64/kvm/arm.c and asm/kvm_host.h
# (6.1's per-CPU EL2 bring-up, kvm_arm_call_with_hyp): 6.12 and 7.2 hold
# kvm_enable_virtualization() around an operation instead (6.12's per-CPU enabling runs
# on the hotplug thread with interrupts on, so the IPI could interleave with it: review
# of the 6.12 port, must-fix 1), and 7.2 makes that pair visible again (static there).
_NOT_PORTED = {"arch/arm64/kvm/arm.c", "arch/arm64/include/asm/kvm_host.h"}
_PATCH2_FILES = {
    "6.12": set(),
    "7.2": {"include/linux/kvm_host.h", "virt/kvm/kvm_main.c"},
}


@pytest.mark.parametrize("port", ["6.12", "7.2"])
def test_the_ports_are_the_same_series(port: str) -> None:
    """6.12 and 7.2 are ports of 6.1: the same patches, in the same order, writing the same
    files (patch 2 but for its bring-up of EL2, above), so the interface tracekit reads is
    one; each patch's notes say it is not for merging."""
    ported = KPATCH / port
    assert _subjects(ported) == _subjects(SERIES)
    assert len(_subjects(SERIES)) == 3
    pairs = zip(ksource.series_files(SERIES), ksource.series_files(ported), strict=True)
    for index, (old, new) in enumerate(pairs):
        expected = set(ksource.touched_files([old]))
        if index == 1:
            assert expected >= _NOT_PORTED
            expected = expected - _NOT_PORTED | _PATCH2_FILES[port]
        assert set(ksource.touched_files([new])) == expected, new.name
        assert "Not for merging" in new.read_text(), new.name
        assert "From: Your Name <your.name@example.org>" in new.read_text(), new.name


def test_the_72_hypercall_is_before_the_pkvm_only_marker() -> None:
    """7.2's enum is split by MARKER()s and, outside protected mode, handle_host_hcall
    refuses every id from __KVM_HOST_SMCCC_FUNC_PKVM_ONLY on: the 7.2 patch adds the call
    last before that marker (not at the enum's end, as 6.12's does), and its handler in
    the same place of host_hcall[], before the first pKVM-only one. Read from the patch
    text (test_series_hypercall_is_the_last_one_nvhe_accepts checks the patched tree)."""
    text = ksource.series_files(KPATCH / "7.2")[0].read_text()
    enum = re.search(r"^\+\t__KVM_HOST_SMCCC_FUNC___kvm_debug_maint,\n((?: .*\n)*)", text, re.M)
    assert enum is not None
    after = [line.strip() for line in enum.group(1).splitlines() if line.strip()]
    assert after[0] == "MARKER(__KVM_HOST_SMCCC_FUNC_PKVM_ONLY),"
    # The slot exists only with CONFIG_KVM_ARM_DEBUG_MAINT (review S3): inside an #ifdef.
    table = re.search(
        r"^\+#ifdef CONFIG_KVM_ARM_DEBUG_MAINT\n\+\tHANDLE_FUNC\(__kvm_debug_maint\),\n"
        r"\+#endif\n((?: .*\n)*)",
        text,
        re.M,
    )
    assert table is not None
    following = [line.strip() for line in table.group(1).splitlines() if line.strip()]
    assert following[0] == "HANDLE_FUNC(__pkvm_host_share_hyp),"
    assert text.count("__KVM_HOST_SMCCC_FUNC___kvm_debug_maint,") == 1
    assert "write_sysreg(hcr" not in text  # 7.2 writes HCR_EL2 with write_sysreg_hcr()


def test_series_file_naming_a_missing_patch(tmp_path: Path) -> None:
    """A series that names an absent patch is one line naming it."""
    (tmp_path / "series").write_text("# comment\n0001-a.patch\n")
    with pytest.raises(TracekitError, match=r"0001-a\.patch"):
        ksource.series_files(tmp_path)


def _git(tree: Path, *args: str) -> str:
    """Run git in `tree` with a fixed identity."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "HOME": str(tree)}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", *args], cwd=tree, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("patch") is None, reason="git")
def test_patched_tree_leaves_the_pristine_tree_alone(tmp_path: Path) -> None:
    """The patched copy is hard-linked except the files the series writes; builds are skipped."""
    pristine = tmp_path / "linux-1.0"
    (pristine / "kvm").mkdir(parents=True)
    (pristine / "kvm" / "mmu.c").write_text("int a;\n")
    (pristine / "kvm" / "arm.c").write_text("int b;\n")
    _git(pristine, "init", "-q")
    _git(pristine, "add", ".")
    _git(pristine, "commit", "-qm", "base")
    (pristine / "kvm" / "mmu.c").write_text("int a;\nint c;\n")
    _git(pristine, "commit", "-qam", "add c")
    series = tmp_path / "series-dir"
    series.mkdir()
    _git(pristine, "format-patch", "-q", "-o", str(series), "HEAD~1")
    _git(pristine, "reset", "-q", "--hard", "HEAD~1")
    shutil.rmtree(pristine / ".git")
    (pristine / "build-0123").mkdir()  # a build of the pristine tree: not to be linked
    (series / "series").write_text("\n".join(p.name for p in series.glob("*.patch")) + "\n")

    tree = ksource.patched_tree(pristine, ksource.series_files(series), lambda m: None)
    assert (tree / "kvm" / "mmu.c").read_text() == "int a;\nint c;\n"
    assert (pristine / "kvm" / "mmu.c").read_text() == "int a;\n"
    assert (tree / "kvm" / "arm.c").stat().st_ino == (pristine / "kvm" / "arm.c").stat().st_ino
    assert not (tree / "build-0123").exists()
    assert ksource.patched_tree(pristine, ksource.series_files(series), print) == tree


def _one_patch(root: Path, old: str) -> tuple[Path, Path]:
    """A tree linux-1.0 whose f.c holds "x", and a series of one patch turning `old` to "y"."""
    pristine = root / "linux-1.0"
    pristine.mkdir()
    (pristine / "f.c").write_text("x\n")
    series = root / "s"
    series.mkdir()
    (series / "0001-x.patch").write_text(f"--- a/f.c\n+++ b/f.c\n@@ -1 +1 @@\n-{old}\n+y\n")
    (series / "series").write_text("0001-x.patch\n")
    return pristine, series


def test_a_tree_someone_built_in_is_made_again(tmp_path: Path) -> None:
    """make inside a cached tree leaves a .config that makes kbuild refuse every O= build of
    it: the tree is patched again instead of being handed out."""
    pristine, series = _one_patch(tmp_path, "x")
    tree = ksource.patched_tree(pristine, ksource.series_files(series), lambda m: None)
    assert not ksource.built_in(tree)
    (tree / ".config").write_text("CONFIG_A=y\n")
    assert ksource.built_in(tree)
    made: list[str] = []
    assert ksource.patched_tree(pristine, ksource.series_files(series), made.append) == tree
    assert made and not (tree / ".config").exists()
    assert (tree / "f.c").read_text() == "y\n"


def test_make_error_is_the_line_that_says_what_went_wrong() -> None:
    """Not the sub-make's closing `Error 2`: the first line make starred, else the compiler's."""
    unclean = (
        "***\n*** The source tree is not clean, please run 'make ARCH=arm64 mrproper'\n"
        "*** in /src\n***\nmake[1]: *** [/src/Makefile:668: outputmakefile] Error 1\n"
        "make: *** [Makefile:250: __sub-make] Error 2\n"
    )
    assert kbuild.make_error(unclean).startswith("The source tree is not clean")
    compiled = "  CC      mm/a.o\nmm/a.c:3:1: error: expected ';'\nmake: *** [x] Error 2\n"
    assert kbuild.make_error(compiled) == "mm/a.c:3:1: error: expected ';'"
    assert kbuild.make_error("") == "no output"


def test_a_missing_build_tool_is_named_before_make_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kconfig needs flex and bison: without them, one line naming the packages, not make's
    `Error 127` (a fresh machine without them failed so)."""
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda t: None if t in ("flex", "bison") else real_which(t)
    )
    with pytest.raises(TracekitError, match=r"building a kernel needs flex, bison: `apt-get"):
        kbuild.ci_config(tmp_path / "no-tree", "", tmp_path / "scratch")
    assert not (tmp_path / "scratch").exists()


def test_a_patch_that_does_not_apply(tmp_path: Path) -> None:
    """A series that does not fit the tree is one line naming the patch; no tree is left."""
    pristine, series = _one_patch(tmp_path, "not there")
    with pytest.raises(TracekitError, match=r"0001-x\.patch does not apply to linux-1\.0"):
        ksource.patched_tree(pristine, ksource.series_files(series), lambda m: None)
    assert not list(tmp_path.glob("linux-1.0+*"))


def test_cache_cap_removes_least_recently_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the cap, the oldest builds go first; the ones in use are kept."""
    builds = []
    for age, name in enumerate(["a/build-1", "b/build-2", "c/build-3"]):
        build = tmp_path / name
        build.mkdir(parents=True)
        (build / "vmlinux").write_bytes(b"x" * 100_000)
        os.utime(build, (1000 + age, 1000 + age))
        builds.append(build)
    monkeypatch.setenv(kbuild.CACHE_CAP_ENV, str(250_000 / 1e9))
    removed = kbuild.enforce_cap(tmp_path, [builds[0]], lambda m: None)
    assert removed == [builds[1]]
    assert builds[0].exists() and builds[2].exists()
    monkeypatch.setenv(kbuild.CACHE_CAP_ENV, "lots")
    with pytest.raises(TracekitError, match="not a number of GB"):
        kbuild.cache_cap_bytes()


@pytest.mark.kbuild
@BUILT
def test_series_applies_to_debian_source_and_is_checkpatch_clean(suite: str) -> None:
    """Each series applies to its suite's Debian source; checkpatch --strict (the tree's
    own, run in the tree: --no-tree hid its CHECK on <asm/cpufeature.h>) finds no error
    and no check, and warns only of MAINTAINERS for a new file."""
    tree = ksource.pristine_tree(suite, suite_version(suite), print)
    patches = ksource.series_files(kcustom.series_dir(suite))
    patched = ksource.patched_tree(tree, patches, print)
    assert (patched / "arch" / "arm64" / "kvm" / "debug_maint.c").is_file()
    done = subprocess.run(
        ["perl", "scripts/checkpatch.pl", "--strict", *map(str, patches)],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    totals = [line for line in done.stdout.splitlines() if line.startswith("total:")]
    assert len(totals) == len(patches)
    # The only warning is checkpatch's "does MAINTAINERS need updating?" for a new file,
    # which arch/arm64/kvm/'s entry already covers.
    assert all(line.startswith("total: 0 errors") and "0 checks" in line for line in totals)
    assert done.stdout.count("WARNING:") == done.stdout.count("MAINTAINERS need updating")


def _deb(
    tmp_path: Path, name: str, version: str, files: dict[str, str], data: Path | None = None
) -> Path:
    """A real .deb (dpkg-deb -b) holding `files` (the last one `data`'s bytes if given)."""
    root = tmp_path / f"{name}-root"
    (root / "DEBIAN").mkdir(parents=True)
    control = f"Package: {name}\nVersion: {version}\nArchitecture: arm64\n"
    control += "Maintainer: t <t@t>\nDescription: test\n"
    (root / "DEBIAN" / "control").write_text(control)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    if data is not None:
        shutil.copy(data, root / path)
    deb = tmp_path / f"{name}_{version}_arm64.deb"
    subprocess.run(["dpkg-deb", "-b", str(root), str(deb)], check=True, capture_output=True)
    return deb


def test_linux_source_package_is_named_by_the_major_and_minor() -> None:
    """6.12.117-1 comes as linux-source-6.12, an epoch ignored."""
    assert ksource.linux_source_package("6.12.117-1") == "linux-source-6.12"
    assert ksource.linux_source_package("1:7.2.13-1") == "linux-source-7.2"


def _linux_source_deb(tmp_path: Path, version: str) -> Path:
    """A linux-source-X.Y .deb as Debian ships it: the tree in usr/src/*.tar.xz."""
    package = ksource.linux_source_package(version)
    top = tmp_path / "inner" / package
    (top / "arch" / "arm64" / "kvm").mkdir(parents=True)
    (top / "Makefile").write_text("VERSION = 6\n")
    (top / "arch" / "arm64" / "kvm" / "mmu.c").write_text("int a;\n")
    tarball = tmp_path / f"{package}.tar.xz"
    subprocess.run(["tar", "-cJf", str(tarball), "-C", str(top.parent), package], check=True)
    return _deb(tmp_path, package, version, {f"usr/src/{tarball.name}": ""}, tarball)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_pristine_tree_from_the_linux_source_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source package 404s: the tree comes from linux-source-X.Y's inner tarball, its
    top directory cut, recorded as such, and is taken from the cache the second time."""
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    deb = _linux_source_deb(tmp_path, "6.12.117-1")
    downloads = ksource.source_root() / "dl-6.12.117-1"
    downloads.mkdir(parents=True)
    shutil.copy(deb, downloads / "linux-source-6.12_6.12.117-1_all.deb")

    def no_source(*args: object) -> str:
        raise TracekitError("the mirror has no files for linux 6.12.117-1 (404)")

    monkeypatch.setattr(ksource, "_from_source_package", no_source)
    said: list[str] = []
    tree = ksource.pristine_tree("trixie", "6.12.117-1", said.append)
    assert (tree / "arch" / "arm64" / "kvm" / "mmu.c").read_text() == "int a;\n"
    assert (tree / ".tracekit-unpacked").read_text().splitlines() == [
        "6.12.117-1",
        "binary package linux-source-6.12 6.12.117-1",
    ]
    assert any("404" in line and "trying linux-source-6.12" in line for line in said)
    monkeypatch.setattr(ksource, "_from_binary_package", no_source)
    assert ksource.pristine_tree("trixie", "6.12.117-1", said.append) == tree


def test_pristine_tree_with_neither_source_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither the source package nor linux-source-X.Y: one error naming both failures."""
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))

    def fails(why: str) -> Callable[..., str]:
        """A stand-in for either fetcher, failing with `why`."""

        def fetch(*args: object) -> str:
            raise TracekitError(why)

        return fetch

    monkeypatch.setattr(ksource, "_from_source_package", fails("source 404"))
    monkeypatch.setattr(ksource, "_from_binary_package", fails("binary 404"))
    with pytest.raises(TracekitError) as caught:
        ksource.pristine_tree("sid", "7.2.13-1", lambda m: None)
    message = str(caught.value)
    assert "\n" not in message
    assert "the source package: source 404; linux-source-7.2: binary 404" in message


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_a_linux_source_package_without_its_tarball(tmp_path: Path) -> None:
    """A .deb without usr/src/linux-source-X.Y.tar.xz: one line naming the member."""
    deb = _deb(tmp_path, "linux-source-6.12", "6.12.117-1", {"usr/share/doc/x": "x"})
    with pytest.raises(TracekitError, match=r"could not unpack \./usr/src/linux-source-6\.12"):
        ksource._untar_inner(deb, "./usr/src/linux-source-6.12.tar.xz", tmp_path / "t")


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_debian_kernel_package_gives_version_and_config(tmp_path: Path) -> None:
    """The image package (not the metapackage) is the one with boot/config-REL."""
    meta = _deb(tmp_path, "linux-image-arm64", "6.1.176-1", {"usr/share/doc/x": "x"})
    image = _deb(
        tmp_path, "linux-image-6.1.0-50-arm64", "6.1.176-1", {"boot/config-6.1.0-50-arm64": "C\n"}
    )
    assert kcustom.debian_kernel_deb([meta, image]) == image
    assert kcustom.debian_version(image) == "6.1.176-1"
    assert kcustom.debian_config_text(image) == "C\n"
    with pytest.raises(TracekitError, match="no boot/config"):
        kcustom.debian_kernel_deb([meta])


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_sids_config_comes_from_its_linux_base_package(tmp_path: Path) -> None:
    """sid's linux-image-REL holds no file of the kernel: its config is linux-base-REL's
    usr/lib/modules/REL/config (beside System.map and the dtbs), not a module's file."""
    release = "7.2.13+deb14-arm64"
    image = _deb(tmp_path, f"linux-image-{release}", "7.2.13-1", {"usr/share/doc/x": "x"})
    base = _deb(
        tmp_path,
        f"linux-base-{release}",
        "7.2.13-1",
        {
            f"usr/lib/modules/{release}/System.map": "ffff t _text\n",
            f"usr/lib/modules/{release}/dtb/arm/config": "not it\n",
            f"usr/lib/modules/{release}/config": "CONFIG_KVM=y\n",
        },
    )
    assert kcustom.debian_kernel_deb([image, base]) == base
    assert kcustom.debian_version(base) == "7.2.13-1"
    assert kcustom.debian_config_text(base) == "CONFIG_KVM=y\n"
    assert not kcustom.is_config_path(f"./usr/lib/modules/{release}/kernel/x/config")


def test_image_targets_follow_the_top_makefile(tmp_path: Path) -> None:
    """6.x's top Makefile has a modules.builtin rule; 7.2's vmlinux writes the file itself
    and the top Makefile names it only in clean lists."""
    (tmp_path / "Makefile").write_text("vmlinux.o modules.builtin.modinfo modules.builtin: x\n")
    assert kbuild.image_targets(tmp_path) == ["Image", "modules.builtin"]
    (tmp_path / "Makefile").write_text("CLEAN_FILES += modules.builtin modules.order \\\n")
    assert kbuild.image_targets(tmp_path) == ["Image"]


def test_built_kernel_as_the_image_builder_takes_it(tmp_path: Path) -> None:
    """Everything built in: an empty module tree with the build's modules.builtin."""
    build = tmp_path / "build-0123456789"
    (build / "arch" / "arm64" / "boot").mkdir(parents=True)
    (build / "arch" / "arm64" / "boot" / "Image").write_bytes(b"image")
    (build / "modules.builtin").write_text("kernel/net/9p/9pnet.ko\n")
    (build / ".config").write_text("CONFIG_KVM=y\n")
    kernel = kbuild.BuiltKernel(build, "6.1.176-tk012345", "6.1.176-1", "", "0123456789", 1.0)
    assert kbuild.load_build(build) is None  # no record yet: not a finished build
    files = kcustom.kernel_files(kernel)
    assert files.image == kernel.image and files.release == "6.1.176-tk012345"
    assert (files.modules_dir / "modules.builtin").read_text() == "kernel/net/9p/9pnet.ko\n"
    assert (files.modules_dir / "kernel").is_dir() and files.config == build / ".config"


def test_an_all_builtin_kernel_loads_no_module(tmp_path: Path) -> None:
    """With the 9p chain built in, /init's module list is empty (no `insmod ''`)."""
    build = tmp_path / "build-0123456789"
    build.mkdir()
    builtin = ["drivers/virtio/virtio_pci.ko", "net/9p/9pnet.ko", "net/9p/9pnet_virtio.ko"]
    builtin.append("fs/9p/9p.ko")
    (build / "modules.builtin").write_text("".join(f"kernel/{m}\n" for m in builtin))
    (build / ".config").write_text("CONFIG_9P_FS=y\n")
    kernel = kbuild.BuiltKernel(build, "6.1.176-tk012345", "6.1.176-1", "", "0123456789", 1.0)
    root = tmp_path / "root"
    root.mkdir()
    assert install_modules(kcustom.kernel_files(kernel), root, list(BOOT_MODULES)) == []
    assert (root / "etc" / "tracekit" / "modules").read_text() == ""
    assert (root / "boot" / "config-6.1.176-tk012345").read_text() == "CONFIG_9P_FS=y\n"


def test_a_finished_build_is_taken_from_the_cache(tmp_path: Path) -> None:
    """A build directory with its record and Image is returned as is: no tool, no make."""
    config = "CONFIG_KVM=y\n"
    build = tmp_path / "linux-1.0" / f"build-{kbuild.config_hash(config)}"
    (build / "arch" / "arm64" / "boot").mkdir(parents=True)
    (build / "arch" / "arm64" / "boot" / "Image").write_bytes(b"image")
    record = {"release": "1.0-tkx", "source_version": "1.0-1", "patch_hash": ""}
    record |= {"config_hash": kbuild.config_hash(config), "build_s": 12.5}
    (build / kbuild.BUILD_RECORD).write_text(json.dumps(record))
    kernel = kbuild.build_kernel(build.parent, config, "1.0-1", "", lambda m: None)
    assert (kernel.directory, kernel.release, kernel.build_s) == (build, "1.0-tkx", 12.5)


def test_series_warnings_are_those_in_files_the_series_writes() -> None:
    """A warning in a file the series writes is found; one elsewhere and notes are not."""
    log = (
        "  CC      arch/arm64/kvm/debug_maint.o\n"
        "../arch/arm64/kvm/debug_maint.c:12:5: warning: unused variable 'x' [-Wunused]\n"
        "In file included from ../arch/arm64/kvm/arm.c:9:\n"
        "../arch/arm64/include/asm/kvm_host.h:861:6: warning: no previous prototype\n"
        "../drivers/base/core.c:1:1: warning: not ours\n"
        "../arch/arm64/kvm/mmu.c:3:1: note: declared here\n"
    )
    touched = ["arch/arm64/kvm/debug_maint.c", "arch/arm64/include/asm/kvm_host.h"]
    touched.append("arch/arm64/kvm/mmu.c")
    found = kcustom.series_warnings(log, touched)
    assert [line.split(":")[0] for line in found] == [
        "../arch/arm64/kvm/debug_maint.c",
        "../arch/arm64/include/asm/kvm_host.h",
    ]
    assert kcustom.series_warnings("../drivers/base/core.c:1:1: warning: x\n", touched) == []


def test_object_counts_tell_a_seeded_copy_from_what_was_compiled(tmp_path: Path) -> None:
    """Objects are counted in all and by mtime: a copied one is old, a recompiled one new."""
    (tmp_path / "kernel").mkdir()
    for name in ("a.o", "b.o", "kernel/c.o"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "kernel" / ".c.o.cmd").write_text("")
    os.utime(tmp_path / "a.o", (1000, 1000))
    assert kbuild._objects(tmp_path) == 3
    assert kbuild._objects(tmp_path, since=2000) == 2


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_seeded_build_recompiles_changed_files_older_than_the_seed(tmp_path: Path) -> None:
    """A patched tree older than the seed build: make still remakes what the series wrote."""
    pristine, patched = tmp_path / "linux", tmp_path / "linux+series"
    for tree, text in ((pristine, "old"), (patched, "new")):
        tree.mkdir()
        (tree / "a.c").write_text(text)
        (tree / "b.c").write_text("same")
        os.utime(tree / "a.c", (1000, 1000))
        os.utime(tree / "b.c", (1000, 1000))
    seed = pristine / "build-0123456789"
    seed.mkdir()
    (seed / "Makefile").write_text("all: a.o b.o\n%.o: ../%.c\n\tcp $< $@\n")
    subprocess.run(["make", "-s", "-C", str(seed)], check=True)
    (seed / kbuild.BUILD_RECORD).write_text("{}")
    build = patched / seed.name
    kbuild.seed_build(seed, build, ["a.c", "missing.c"])
    assert not (build / kbuild.BUILD_RECORD).exists()
    made = subprocess.run(
        ["make", "--no-print-directory", "-C", str(build), "-n"], capture_output=True, text=True
    )
    assert made.stdout.splitlines() == ["cp ../a.c a.o"]
    assert (pristine / "a.c").stat().st_mtime == 1000


def _hypercalls(tree: Path) -> tuple[list[str], list[str], int]:
    """The host hypercalls in kvm_asm.h's enum and in hyp-main.c's host_hcall[], in order,
    and how many of them handle_host_hcall accepts outside protected mode: those before
    7.x's MARKER(__KVM_HOST_SMCCC_FUNC_PKVM_ONLY) (a marker takes no number), else all."""
    asm = (tree / "arch/arm64/include/asm/kvm_asm.h").read_text()
    enum = asm.split("enum __kvm_host_smccc_func {", 1)[1].split("};", 1)[0]
    enum = re.sub(r"/\*.*?\*/", "", enum, flags=re.S)
    ids = re.findall(r"^\s*__KVM_HOST_SMCCC_FUNC_(\w+)", enum, re.M)
    before_marker = enum.split("MARKER(__KVM_HOST_SMCCC_FUNC_PKVM_ONLY)", 1)
    accepted = len(re.findall(r"^\s*__KVM_HOST_SMCCC_FUNC_\w+", before_marker[0], re.M))
    main = (tree / "arch/arm64/kvm/hyp/nvhe/hyp-main.c").read_text()
    table = main.split("static const hcall_t host_hcall[] = {", 1)[1].split("};", 1)[0]
    return ids, re.findall(r"HANDLE_FUNC\((\w+)\)", table), accepted


@pytest.mark.kbuild
@BUILT
def test_series_hypercall_is_the_last_one_nvhe_accepts(suite: str) -> None:
    """host_hcall[] is indexed by the enum: in the patched tree both list the same calls in
    the same order, the pristine ones with __kvm_debug_maint added once, as the last call
    handle_host_hcall accepts outside protected mode: the enum's last on 6.1 and 6.12,
    the last before 7.2's PKVM_ONLY marker (from there on nVHE refuses every id). And
    after __pkvm_prot_finalize, so protected mode's finalisation does not refuse it by
    number: the handler refuses it itself."""
    tree = ksource.pristine_tree(suite, suite_version(suite), print)
    patched = ksource.patched_tree(tree, ksource.series_files(kcustom.series_dir(suite)), print)
    ids, handlers, accepted = _hypercalls(patched)
    pristine, _, pristine_accepted = _hypercalls(tree)
    assert ids == handlers
    assert ids.count("__kvm_debug_maint") == 1
    assert ids.index("__kvm_debug_maint") == accepted - 1 == pristine_accepted
    assert ids.index("__pkvm_prot_finalize") < ids.index("__kvm_debug_maint")
    assert [name for name in ids if name != "__kvm_debug_maint"] == pristine
    # Built only with the option (review S3): without it the id stays and its slot is
    # empty, which handle_host_hcall refuses as it does any unknown call.
    main = (patched / "arch/arm64/kvm/hyp/nvhe/hyp-main.c").read_text()
    guard = "#ifdef CONFIG_KVM_ARM_DEBUG_MAINT\n"
    assert f"{guard}\tHANDLE_FUNC(__kvm_debug_maint),\n#endif\n" in main
    assert f"{guard}static void handle___kvm_debug_maint(" in main
    for side in ("nvhe", "vhe"):
        tlb = (patched / f"arch/arm64/kvm/hyp/{side}/tlb.c").read_text()
        assert tlb.count(guard) == 1, side
        assert tlb.index(guard) < tlb.index("int __kvm_debug_maint(u64 op"), side
