"""The emulated host's pure parts: no boot, no network."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.vhost import apt
from tracekit.vhost.console import ConsoleStream
from tracekit.vhost.cpio import CpioWriter, add_tree
from tracekit.vhost.kernels import is_kernel_package, parse_kernel_spec
from tracekit.vhost.kvmmode import kernel_args_for, kvm_mode_from_log
from tracekit.vhost.modules import dependencies, load_order, modinfo, module_name
from tracekit.vhost.qemu import Share, qemu_argv, smp_option
from tracekit.vhost.runner import VhostConfig, run

FIXTURES = Path(__file__).parent / "fixtures" / "vhost"


@pytest.mark.parametrize(
    ("log", "mode"),
    [
        ("dmesg-bookworm-cortex-a76-nvhe.txt", "nvhe"),
        ("dmesg-bookworm-max-vhe.txt", "vhe"),
        ("dmesg-bookworm-cortex-a76-protected.txt", "protected"),
        ("dmesg-bookworm-rt-cortex-a76.txt", "none"),
    ],
)
def test_kvm_mode_from_real_boot_logs(log: str, mode: str) -> None:
    """Each saved boot log yields the mode its kernel initialised."""
    assert kvm_mode_from_log((FIXTURES / log).read_text()) == mode


def test_kvm_mode_kernel_args() -> None:
    """nVHE and protected are asked for; VHE is the kernel's default where it exists."""
    assert kernel_args_for("nvhe") == ["kvm-arm.mode=nvhe"]
    assert kernel_args_for("protected") == ["kvm-arm.mode=protected"]
    assert kernel_args_for("vhe") == []


def test_kernel_spec_parsing() -> None:
    """SUITE[:FLAVOUR] maps to packages; rt has no KVM; unknown values name the choices."""
    plain, rt = parse_kernel_spec("bookworm"), parse_kernel_spec("bookworm:rt")
    assert plain.packages()[0] == "linux-image-arm64" and plain.has_kvm
    assert rt.packages()[0] == "linux-image-rt-arm64" and not rt.has_kvm
    assert rt.name == "bookworm:rt"
    with pytest.raises(TracekitError, match="bookworm, bookworm:rt"):
        parse_kernel_spec("jessie")
    with pytest.raises(TracekitError, match="unknown kernel flavour 'cloud'"):
        parse_kernel_spec("bookworm:cloud")


def test_kernel_packages_are_told_apart() -> None:
    """Kernel image and module packages (sid's split ones too) stay out of the rootfs."""
    assert is_kernel_package("linux-image-6.1.0-50-arm64_6.1.176-1_arm64.deb")
    assert is_kernel_package("linux-modules-7.2.0-1-arm64_7.2.1-1_arm64.deb")
    assert not is_kernel_package("linux-perf_6.1.176-1_arm64.deb")
    assert not is_kernel_package("linux-base_4.12.1_all.deb")


def test_apt_options_confine_apt(tmp_path: Path) -> None:
    """Every path apt would touch is redirected under the private root; dpkg status is empty."""
    state = apt.AptState(tmp_path, "bookworm", "http://mirror.example/debian")
    options = apt.apt_options(state)
    settings = dict(value.split("=", 1) for value in options[1::2])
    assert set(options[0::2]) == {"-o"}
    assert settings["Dir::State::status"] == "/dev/null"
    assert settings["APT::Architectures"] == "arm64"
    for key in ("Dir::State::Lists", "Dir::Etc::SourceList", "Dir::Etc::SourceParts", "Dir::Cache"):
        assert settings[key].startswith(str(tmp_path)), key
    assert apt.sources_list(state) == (
        f"deb [signed-by={apt.KEYRING}] http://mirror.example/debian bookworm main\n"
    )


def test_apt_mirror_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """$TRACEKIT_DEBIAN_MIRROR overrides deb.debian.org."""
    monkeypatch.setenv(apt.MIRROR_ENV, "http://local/debian/")
    assert apt.mirror_from_env() == "http://local/debian"


def test_apt_simulation_parsing() -> None:
    """`apt-get -s install` lines give name, version (with epoch) and arch."""
    output = (
        "NOTE: This is only a simulation!\n"
        "Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [arm64]) []\n"
        "Inst busybox-static (1:1.35.0-4+deb12u1+b1 Debian:12.15/oldstable [arm64])\n"
        "Inst libaudit-common (1:3.0.9-1 Debian:12.15/oldstable [all])\n"
        "Conf libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [arm64])\n"
    )
    closure = apt.parse_simulation(output)
    assert [p.name for p in closure] == ["busybox-static", "libaudit-common", "libc6"]
    assert closure[0].deb_filename == "busybox-static_1%3a1.35.0-4+deb12u1+b1_arm64.deb"
    assert closure[1].arch == "all"
    assert apt.unknown_package("E: Unable to locate package linux-image-foo\n") == (
        "linux-image-foo"
    )


def test_missing_keyring_names_the_package(tmp_path: Path) -> None:
    """A missing keyring is one line naming debian-archive-keyring."""
    state = apt.AptState(tmp_path, "bookworm", keyring=tmp_path / "absent.gpg")
    with pytest.raises(TracekitError, match="apt-get install debian-archive-keyring"):
        apt.check_tools(state)


def test_cpio_round_trip_with_cpio_tool(tmp_path: Path) -> None:
    """GNU cpio reads back what the writer wrote: files, modes, symlinks, device nodes."""
    if shutil.which("cpio") is None:
        pytest.skip("cpio(1) missing: apt-get install cpio")
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "tool").write_bytes(b"#!/bin/sh\necho odd-length\n")
    (tree / "bin" / "tool").chmod(0o755)
    (tree / "empty").write_bytes(b"")
    (tree / "link").symlink_to("bin/tool")
    stream = io.BytesIO()
    writer = CpioWriter(stream)
    assert add_tree(writer, tree) == 4
    writer.add_char_device("console", 5, 1)
    writer.close()
    assert len(stream.getvalue()) % 4 == 0
    listing = subprocess.run(
        ["cpio", "-itv", "--quiet"], input=stream.getvalue(), capture_output=True, check=True
    ).stdout.decode()
    lines = {
        line.split()[-1] if "->" not in line else line.split()[-3]: line
        for line in listing.splitlines()
    }
    assert set(lines) == {"bin", "bin/tool", "empty", "link", "console"}
    assert lines["bin/tool"].startswith("-rwxr-xr-x")
    assert lines["console"].startswith("crw-------")
    assert lines["link"].endswith("-> bin/tool")
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(
        ["cpio", "-id", "--quiet", "--no-absolute-filenames", "bin/tool"],
        input=stream.getvalue(),
        cwd=out,
        check=True,
    )
    assert (out / "bin" / "tool").read_bytes() == (tree / "bin" / "tool").read_bytes()


def test_module_names_and_load_order() -> None:
    """Names drop .ko[.xz] and read '-' as '_'; dependencies load first, each once."""
    assert module_name(Path("a/virtio_pci.ko")) == "virtio_pci"
    assert module_name(Path("a/9pnet-virtio.ko.xz")) == "9pnet_virtio"
    depends = {
        "9p": ["9pnet", "netfs", "fscache"],
        "fscache": ["netfs"],
        "9pnet_virtio": ["9pnet"],
        "virtio_pci": ["virtio_pci_modern_dev"],
    }
    order = load_order(["virtio_pci", "9pnet_virtio", "9p"], depends)
    assert order == [
        "virtio_pci_modern_dev",
        "virtio_pci",
        "9pnet",
        "9pnet_virtio",
        "netfs",
        "fscache",
        "9p",
    ]


def test_modinfo_from_a_real_elf(tmp_path: Path) -> None:
    """`depends=` is read from the .modinfo section of an object gcc built here."""
    gcc = shutil.which("gcc") or shutil.which("aarch64-linux-gnu-gcc")
    if gcc is None:
        pytest.skip("no C compiler to build a test ELF: apt-get install gcc")
    source = tmp_path / "mod.c"
    source.write_text(
        '__attribute__((section(".modinfo"), used)) static const char info[] =\n'
        '    "license=GPL\\0depends=9pnet,netfs\\0name=9p";\n'
    )
    subprocess.run([gcc, "-c", str(source), "-o", str(tmp_path / "mod.o")], check=True)
    image = (tmp_path / "mod.o").read_bytes()
    assert modinfo(image)["name"] == ["9p"]
    assert dependencies(image) == ["9pnet", "netfs"]


def test_qemu_command_line(tmp_path: Path) -> None:
    """virt with EL2 and GICv3, multi-threaded TCG, clusters, quiet console, 9p shares."""
    argv = qemu_argv(
        tmp_path / "vmlinuz",
        tmp_path / "initramfs.cpio",
        cpu_model="max",
        cpus=4,
        clusters=2,
        memory_mb=2048,
        kernel_args=["kvm-arm.mode=nvhe"],
        shares=[Share("tkproject", tmp_path, readonly=True)],
    )
    joined = " ".join(argv)
    assert "-M virt,virtualization=on,gic-version=3" in joined
    assert "-cpu max,pauth-impdef=on" in joined
    assert "-accel tcg,thread=multi" in joined
    assert "-smp 4,sockets=1,clusters=2,cores=2,threads=1" in joined
    assert argv[argv.index("-append") + 1].endswith("quiet loglevel=3 kvm-arm.mode=nvhe")
    assert f"local,path={tmp_path},mount_tag=tkproject,security_model=none,readonly=on" in argv
    assert smp_option(3, 1) == "3"
    with pytest.raises(TracekitError, match="multiple of --clusters"):
        smp_option(3, 2)


def test_console_stream_between_markers() -> None:
    """Only the command's lines are streamed, whatever the chunking; the status is read."""
    text = (
        b"[    1.0] boot noise\r\n@@tracekit-vhost:begin:abc@@\r\nhello\r\n"
        b"partial@@tracekit-vhost:end:abc:3@@\r\n[    9.0] reboot: Power down\r\n"
    )
    streamed: list[str] = []
    log = io.BytesIO()
    console = ConsoleStream("abc", streamed.append, log)
    for start in range(0, len(text), 7):
        console.feed(text[start : start + 7])
    console.finish()
    assert streamed == ["hello", "partial"]
    assert console.status == 3
    assert log.getvalue() == text


def test_console_ignores_other_tokens() -> None:
    """A marker with another token (e.g. printed by the command) does not end the run."""
    streamed: list[str] = []
    console = ConsoleStream("abc", streamed.append, io.BytesIO())
    console.feed(b"@@tracekit-vhost:begin:abc@@\n@@tracekit-vhost:end:zzz:0@@\n")
    assert console.status is None
    assert streamed == ["@@tracekit-vhost:end:zzz:0@@"]


def test_run_without_qemu_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No qemu-system-aarch64 on PATH: the error names the Debian package to install."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TracekitError, match="apt-get install qemu-system-arm"):
        run(VhostConfig(out=tmp_path), ["true"])


def test_cli_bad_kernel_is_one_line() -> None:
    """`vhost run --kernel nonsense` prints one error line naming the valid kernels."""
    result = CliRunner().invoke(main, ["vhost", "run", "--kernel", "sid:weird", "--", "true"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "tracekit: error: unknown kernel flavour 'weird' for suite 'sid'; use one of: "
        "bookworm, bookworm:rt, bookworm:tk, bookworm:kpatch, bookworm:tk-ci, bookworm:kpatch-ci, "
        "trixie, trixie:tk, trixie:kpatch, trixie:tk-ci, trixie:kpatch-ci, sid, sid:16k, sid:tk, "
        "sid:kpatch, sid:tk-ci, sid:kpatch-ci"
    ]


def test_notes_say_emulated_mode_mismatch_and_no_kvm() -> None:
    """Every run says it is emulated; a mode the kernel did not take, and no KVM, are said."""
    from tracekit.vhost.runner import _notes

    a53 = VhostConfig(kvm_mode="vhe", cpu_model="cortex-a53")
    notes = _notes(a53, parse_kernel_spec("bookworm"), "nvhe", dev_kvm=True)
    assert "not hardware timings" in notes[0]
    assert notes[1] == "KVM initialised in nvhe mode, not the vhe asked for (CPU model cortex-a53)"
    rt_notes = _notes(VhostConfig(), parse_kernel_spec("bookworm:rt"), "none", dev_kvm=False)
    assert rt_notes[1].startswith(
        "kernel bookworm:rt: Debian builds the PREEMPT_RT flavour "
        "without KVM; guests cannot run there"
    )


def test_qemu_dies_with_a_killed_parent(tmp_path: Path) -> None:
    """A parent killed with SIGKILL cannot stop its child: the kernel must (PDEATHSIG)."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from tracekit.vhost.process import run_pumping; "
            "run_pumping(['sh', '-c', 'echo $$; exec sleep 60'], "
            "lambda b: (sys.stdout.buffer.write(b), sys.stdout.flush()), 120)",
        ],
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert Path(f"/proc/{child}").exists()
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(50):
        if not Path(f"/proc/{child}").exists() or "Z" in _state(child):
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its killed parent")


def _state(pid: int) -> str:
    """A process's state letter (Z: a zombie, already dead), '' once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def test_the_batch_script_keeps_each_checks_times_and_says_its_duration(tmp_path: Path) -> None:
    """conftest's batch script, run by sh here with /out moved: each check's start and end
    are kept in its directory, its line says its status and seconds, failures are counted."""
    from conftest import _batch_script

    checks = {"sleeps": "sleep 1; echo out", "fails": "exit 3"}
    for name, script in checks.items():
        (tmp_path / "checks" / name).mkdir(parents=True)
        (tmp_path / "checks" / name / "check.sh").write_text(script + "\n")
    batch = _batch_script(checks).replace("/out/", f"{tmp_path}/")
    done = subprocess.run(["sh", "-c", batch], capture_output=True, text=True, check=False)
    assert done.returncode == 1  # one check failed
    lines = done.stdout.splitlines()
    assert lines[1] == "check fails: status 3 in 0s"
    here = tmp_path / "checks" / "sleeps"
    start, end = (int((here / name).read_text()) for name in ("start", "end"))
    assert lines[0] == f"check sleeps: status 0 in {end - start}s" and end - start >= 1
    assert (here / "stdout").read_text() == "out\n" and (here / "status").read_text() == "0\n"


def test_the_cli_starts_without_the_image_builder() -> None:
    """`tracekit` (every `collect` in the emulated host or on a board) imports neither the
    image builder nor pyelftools just for `vhost`'s option choices; the package's entry
    point is still there on first use."""
    script = (
        "import sys, tracekit.cli; print([m for m in ('tracekit.vhost.runner', 'elftools') "
        "if m in sys.modules]); import tracekit.vhost as v; print(v.run.__module__)"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout == "[]\ntracekit.vhost.runner\n", result.stderr
