"""The reproducer cross-builds, its guests carry their variant note, and its tools behave.

The build is real (make with CROSS_COMPILE=aarch64-linux-gnu-, -Werror) into a temporary
directory. The VMM's argument and guest-file checks and the whole probe run under
qemu-aarch64 user mode, which executes the real arm64 binaries (cntvct included);
the VMM's KVM part is exercised in the emulated host, not here.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import VhostBoot, register_vhost_check
from elftools.elf.elffile import ELFFile

from tracekit.errors import TracekitError
from tracekit.guests import RAM_BASE, GuestVariant, list_guests, read_variant

REPRODUCER = Path(__file__).resolve().parent.parent / "reproducer"
CROSS = "aarch64-linux-gnu-"
QEMU_USER = shutil.which("qemu-aarch64")
needs_qemu_user = pytest.mark.skipif(
    QEMU_USER is None, reason="qemu-aarch64 (Debian package qemu-user) is not installed"
)

# What each variant's note must say: (stage1, caches, asid, tlbi, setway, touch).
EXPECTED = {
    "mmu-off": ("off", "off", 0, "none", False, False),
    "mmu-on": ("on", "on", 0, "none", False, False),
    "mmu-on-nocache": ("on", "off", 0, "none", False, False),
    "mmu-on-off": ("on-then-off", "on", 0, "none", False, False),
    "mmu-on-asid": ("on", "on", 42, "none", False, False),
    "mmu-on-vmalle1": ("on", "on", 0, "vmalle1", False, False),
    "mmu-on-vmalle1is": ("on", "on", 0, "vmalle1is", False, False),
    "tlbi-loop": ("off", "off", 0, "loop-vmalle1is", False, False),
    "cache-toggle": ("on", "on", 0, "none", True, True),
    "setway-after-on": ("on", "on", 0, "none", True, True),
}

PROBE_HEADER = struct.Struct("<8sIIIIII QQ II Q")
PROBE_RECORD = struct.Struct("<QQII")  # timestamp, duration, direction, reserved


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cross-build the reproducer into a temporary directory and return it."""
    if shutil.which(CROSS + "gcc") is None:
        pytest.skip("aarch64-linux-gnu-gcc is missing (Debian package gcc-aarch64-linux-gnu)")
    out = tmp_path_factory.mktemp("reproducer-build")
    result = subprocess.run(
        ["make", "-C", str(REPRODUCER), f"CROSS_COMPILE={CROSS}", f"O={out}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def run_arm64(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run an arm64 binary under qemu-aarch64 user mode."""
    assert QEMU_USER is not None
    return subprocess.run(
        [QEMU_USER, str(binary), *args], capture_output=True, text=True, check=False
    )


def test_build_has_every_variant(build: Path) -> None:
    names = sorted(path.stem for path in (build / "guests").glob("*.elf"))
    assert names == sorted(EXPECTED)


@pytest.mark.parametrize("tool", ["vmm", "tlbiprobe"])
def test_tools_are_static_aarch64(build: Path, tool: str) -> None:
    with (build / tool).open("rb") as stream:
        elf = ELFFile(stream)
        assert elf["e_machine"] == "EM_AARCH64"
        kinds = {segment["p_type"] for segment in elf.iter_segments()}
    assert "PT_INTERP" not in kinds and "PT_DYNAMIC" not in kinds


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_guest_note_reads_back(build: Path, name: str) -> None:
    guest = read_variant(build / "guests" / f"{name}.elf")
    stage1, caches, asid, tlbi, setway, touch = EXPECTED[name]
    assert (guest.variant, guest.stage1, guest.caches, guest.asid) == (name, stage1, caches, asid)
    assert (guest.tlbi, guest.setway, guest.touch) == (tlbi, setway, touch)
    assert guest.entry == RAM_BASE
    assert guest.segments[0][0] == RAM_BASE
    assert guest.registers[0] == "x0:vcpu" and len(guest.registers) == 5
    assert guest.description


def test_markers_are_distinct_per_variant(build: Path) -> None:
    guests = list_guests(build / "guests")
    assert [guest.variant for guest in guests] == sorted(EXPECTED)
    assert len({guest.marker for guest in guests}) == len(guests)


def test_marker_constant_is_in_the_code(build: Path) -> None:
    """The marker the note announces is the value the guest code stores."""
    guest = read_variant(build / "guests" / "mmu-on.elf")
    with guest.path.open("rb") as stream:
        text = ELFFile(stream).get_section_by_name(".text").data()
    assert struct.pack("<Q", guest.marker) in text


def patched_copy(source: Path, target: Path, edit: Callable[[bytearray], None]) -> Path:
    """Copy an ELF, apply EDIT to its bytes, return the copy."""
    data = bytearray(source.read_bytes())
    edit(data)
    target.write_bytes(bytes(data))
    return target


def replace_once(data: bytearray, old: bytes, new: bytes) -> None:
    """Replace the single occurrence of OLD (same length) in DATA."""
    assert len(old) == len(new) and data.count(old) == 1
    at = data.index(old)
    data[at : at + len(old)] = new


BAD_EDITS: dict[str, tuple[Callable[[bytearray], None], str]] = {
    "wrong-machine": (lambda d: d.__setitem__(slice(18, 20), struct.pack("<H", 62)), "AArch64"),
    "no-note": (
        lambda d: replace_once(d, struct.pack("<I", 0x544B0001), struct.pack("<I", 0x1234)),
        "no tracekit variant note",
    ),
    "bad-value": (lambda d: replace_once(d, b"stage1=on\n", b"stage1=zz\n"), "stage1='zz'"),
    "malformed-line": (lambda d: replace_once(d, b"\nasid=0\n", b"\nasid 0\n"), "malformed"),
    "future-format": (lambda d: replace_once(d, b"format=1", b"format=9"), "format '9'"),
    "entry-outside": (
        lambda d: d.__setitem__(slice(24, 32), struct.pack("<Q", 0x50000000)),
        "entry 0x50000000",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_EDITS))
def test_read_variant_rejects_bad_guests(build: Path, tmp_path: Path, case: str) -> None:
    edit, message = BAD_EDITS[case]
    bad = patched_copy(build / "guests" / "mmu-on.elf", tmp_path / "mmu-on.elf", edit)
    with pytest.raises(TracekitError, match=message.replace("(", r"\(")):
        read_variant(bad)


def test_read_variant_rejects_non_elf_and_truncated(build: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.elf"
    text.write_text("not an ELF\n")
    with pytest.raises(TracekitError, match="not a valid ELF"):
        read_variant(text)
    short = tmp_path / "short.elf"
    short.write_bytes((build / "guests" / "mmu-on.elf").read_bytes()[:40])
    with pytest.raises(TracekitError, match="not a valid ELF"):
        read_variant(short)
    with pytest.raises(TracekitError, match="cannot read guest"):
        read_variant(tmp_path / "missing.elf")


def test_list_guests_rejects_renamed_and_empty(build: Path, tmp_path: Path) -> None:
    with pytest.raises(TracekitError, match="no guest ELF"):
        list_guests(tmp_path)
    shutil.copy(build / "guests" / "mmu-off.elf", tmp_path / "mmu-on.elf")
    with pytest.raises(TracekitError, match="named after their variant"):
        list_guests(tmp_path)
    with pytest.raises(TracekitError, match="does not exist"):
        list_guests(tmp_path / "nowhere")


def test_guests_module_does_not_import_polars() -> None:
    code = "import sys, tracekit.guests; sys.exit('polars' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def assert_one_error_line(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    """The tool failed with CODE and exactly one 'error:' line containing TEXT."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert len(lines) == 1 and "error:" in lines[0] and text in lines[0], result.stderr


@needs_qemu_user
@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["TEXTFILE"], 4, "not an ELF file"),
        (["--vcpus", "0", "GUEST"], 2, "--vcpus '0'"),
        (["--clock", "tai", "GUEST"], 2, "--clock 'tai'"),
        (["--cpus", "3-1", "GUEST"], 2, "backwards"),
        (["GUEST"], 3, "KVM is not available"),
    ],
)
def test_vmm_errors(build: Path, args: list[str], code: int, text: str) -> None:
    """Bad input gives one line and a distinct code; under qemu-user there is no usable KVM."""
    guest = str(build / "guests" / "mmu-on.elf")
    names = {"GUEST": guest, "TEXTFILE": str(REPRODUCER / "Makefile")}
    argv = [names.get(arg, arg) for arg in args]
    assert_one_error_line(run_arm64(build / "vmm", *argv), code, text)


@needs_qemu_user
def test_vmm_rejects_guest_without_note(build: Path, tmp_path: Path) -> None:
    edit = BAD_EDITS["no-note"][0]
    bad = patched_copy(build / "guests" / "mmu-on.elf", tmp_path / "bad.elf", edit)
    assert_one_error_line(run_arm64(build / "vmm", str(bad)), 4, "no tracekit variant note")


def read_probe_file(path: Path) -> tuple[dict[str, int], list[tuple[int, int, int, int]]]:
    """Parse the probe's sample file as reproducer/README.md documents it."""
    data = path.read_bytes()
    fields = PROBE_HEADER.unpack_from(data)
    names = ("magic", "version", "header_size", "record_size", "cpu", "mode", "pages")
    header = dict(zip(names, fields[:7], strict=True))
    header.update(counter_hz=fields[7], count=fields[8], clock_id=fields[9], helpers=fields[10])
    start, size = header["header_size"], header["record_size"]
    assert len(data) == start + size * header["count"]
    records = [PROBE_RECORD.unpack_from(data, start + i * size) for i in range(header["count"])]
    return header, records


@needs_qemu_user
@pytest.mark.parametrize(("mode", "mode_id", "pages"), [("page", 1, 1), ("munmap", 3, 4)])
def test_probe_samples_match_summary(
    build: Path, tmp_path: Path, mode: str, mode_id: int, pages: int
) -> None:
    out = tmp_path / "samples.bin"
    helpers = ["--helpers", "1"] if (os.cpu_count() or 1) > 1 else []
    args = ["--mode", mode, "--samples", "301", "--out", str(out), *helpers]
    if mode == "munmap":
        args += ["--pages", str(pages)]
    result = run_arm64(build / "tlbiprobe", *args)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    header, records = read_probe_file(out)

    assert header["magic"] == b"TKPROBE\0" and header["version"] == 2
    assert (header["mode"], header["pages"], header["cpu"]) == (mode_id, pages, 0)
    assert header["clock_id"] == 7 and header["counter_hz"] == summary["counter_hz"] > 0
    assert header["count"] == summary["count"] == 301 == len(records)
    assert header["record_size"] == PROBE_RECORD.size == 24
    # mprotect rounds alternate RW->RO (1) and RO->RW (2); every munmap sample is 3.
    directions = [d for _, _, d, _ in records]
    assert directions == ([1, 2] * 151)[:301] if mode == "page" else directions == [3] * 301
    assert {r for *_, r in records} == {0}
    durations = sorted(duration for _, duration, *_ in records)
    assert (durations[0], durations[-1]) == (summary["min_ns"], summary["max_ns"])
    assert summary["p50_ns"] == durations[150]
    assert summary["min_ns"] <= summary["p90_ns"] <= summary["p99_ns"] <= summary["max_ns"]
    timestamps = [timestamp for timestamp, *_ in records]
    assert timestamps == sorted(timestamps) and timestamps[0] > 0
    histogram = summary["histogram"]
    assert sum(bucket["count"] for bucket in histogram) == 301
    assert all(b["hi_ns"] == 2 * b["lo_ns"] for b in histogram if b["lo_ns"])


@needs_qemu_user
@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--mode", "tlb"], "--mode 'tlb'"),
        (["--helpers", "0"], "probe's own CPU 0"),
        (["--mode", "page", "--pages", "8"], "page mode uses one page"),
        (["--samples", "0"], "--samples '0'"),
    ],
)
def test_probe_rejects_bad_options(build: Path, args: list[str], text: str) -> None:
    assert_one_error_line(run_arm64(build / "tlbiprobe", *args), 2, text)


def test_variant_is_frozen(build: Path) -> None:
    guest: GuestVariant = read_variant(build / "guests" / "mmu-off.elf")
    with pytest.raises(AttributeError):
        guest.variant = "other"  # type: ignore[misc]
    assert not guest.turns_mmu_on


# --- In the emulated host: each check below joins its configuration's single boot. ---
# The checks use the tree's own build (reproducer/build, made by scripts/test.sh), seen
# inside at /tracekit. A check that expects a failure prints the status and exits 0.

HOST_BUILD = REPRODUCER / "build"
INSIDE = "R=/tracekit/reproducer/build; G=$R/guests"
TRACE_SETUP = (
    "T=/sys/kernel/tracing/instances/tk-repro; mkdir -p $T; echo boot > $T/trace_clock; "
    "for e in kvm_entry kvm_exit kvm_toggle_cache; do echo 1 > $T/events/kvm/$e/enable; done"
)
NVHE = "nvhe-a76"
ALL_VARIANTS = " ".join(sorted(EXPECTED))

register_vhost_check(NVHE, "repro_mmu_on", f"{INSIDE}; $R/vmm $G/mmu-on.elf")
register_vhost_check(NVHE, "repro_mmu_off", f"{INSIDE}; $R/vmm $G/mmu-off.elf")
register_vhost_check(
    NVHE,
    "repro_trace",
    f"{INSIDE}; {TRACE_SETUP}; "
    "$R/vmm --trace-marker $T/trace_marker $G/mmu-off.elf && cat $T/trace > off.txt && "
    "echo > $T/trace && "
    "$R/vmm --trace-marker $T/trace_marker $G/mmu-on.elf && cat $T/trace > on.txt; "
    "status=$?; rmdir $T; exit $status",
)
register_vhost_check(NVHE, "repro_repeat", f"{INSIDE}; $R/vmm --repeat 20 $G/mmu-on.elf")
register_vhost_check(
    NVHE,
    "repro_variants",
    f"{INSIDE}; for v in {ALL_VARIANTS}; do "
    "$R/vmm --vcpus 2 --cpus 0-2 --tlbi-count 100 --touch-kb 16 $G/$v.elf | grep record=vm "
    '|| { echo "$v failed"; exit 1; }; done',
)
register_vhost_check(
    NVHE,
    "repro_probe",
    "/tracekit/reproducer/build/tlbiprobe --cpu 0 --helpers 1-2 --samples 2000 --out probe.bin",
)
register_vhost_check(
    NVHE,
    "repro_errors",
    f"{INSIDE}; $R/vmm --timeout 1 --spin-us 5000000 $G/mmu-on.elf; echo status=$?; "
    "$R/vmm /tracekit/reproducer/README.md; echo status=$?",
)
# SIGTERM to a VMM whose guest would loop for hours: it must tear the VM down itself.
register_vhost_check(
    NVHE,
    "repro_sigterm",
    f"{INSIDE}; {TRACE_SETUP}; "
    "$R/vmm --timeout 0 --tlbi-count 1000000000 --trace-marker $T/trace_marker "
    "$G/tlbi-loop.elf > vmm.txt & pid=$!; "
    "for i in $(seq 600); do [ $(ls /proc/$pid/task | wc -l) -gt 1 ] && break; sleep 0.1; done; "
    "sleep 1; kill -TERM $pid; wait $pid; echo status=$?; cat vmm.txt; "
    "cat $T/trace > term.txt; rmdir $T",
)
# SIGTERM at 30 points of a --repeat series: a stop that lands in a creation ioctl
# (KVM_CREATE_VM returns EINTR) must end that VM as stopped, never as an error.
register_vhost_check(
    NVHE,
    "repro_sigterm_series",
    f"{INSIDE}; for i in $(seq 30); do "
    "$R/vmm --repeat 100000 --timeout 0 --ipa-bits 40 $G/mmu-off.elf > s.txt 2>&1 & pid=$!; "
    'sleep "0.$((i % 7 + 3))$((i * 7 % 10))"; kill -TERM $pid; wait $pid; echo "status=$?"; '
    "cat s.txt; done",
)
register_vhost_check(
    "vhe-max", "repro_vhe", f"{INSIDE}; $R/vmm --repeat 2 --ipa-bits 40,48 $G/mmu-on.elf"
)
register_vhost_check("protected-a76", "repro_protected", f"{INSIDE}; $R/vmm $G/mmu-on.elf")
register_vhost_check("rt-a76", "repro_no_kvm", f"{INSIDE}; $R/vmm $G/mmu-on.elf; echo status=$?")


def vhost_check(boot: VhostBoot, name: str) -> str:
    """Stdout of a reproducer check that must have exited 0 (stderr shown otherwise)."""
    if not (HOST_BUILD / "vmm").is_file():
        pytest.skip("reproducer/build is missing: make -C reproducer CROSS_COMPILE=aarch64-...")
    check = boot.checks[name]
    assert check.status == 0, f"{name}: status {check.status}\n{check.stdout}\n{check.stderr}"
    return check.stdout


def vm_records(stdout: str) -> list[dict[str, str]]:
    """The key=value pairs of every record=vm line of the VMM's output."""
    return [
        dict(pair.split("=", 1) for pair in line.split())
        for line in stdout.splitlines()
        if line.startswith("record=vm ")
    ]


@pytest.mark.vhost
def test_vhost_guests_run_and_markers_check(vhost_boot) -> None:
    """nVHE, cortex-a76: the MMU-on and MMU-off guests power off and their markers match."""
    boot = vhost_boot(NVHE)
    for name, variant in (("repro_mmu_on", "mmu-on"), ("repro_mmu_off", "mmu-off")):
        out = vhost_check(boot, name)
        assert f"variant={variant} " in out.splitlines()[0]
        assert [vm["result"] for vm in vm_records(out)] == ["ok"]


@pytest.mark.vhost
def test_vhost_trace_shows_lifecycle_and_cache_toggle(vhost_boot) -> None:
    """The trace has kvm_entry/kvm_exit and the VMM's markers; only MMU-on toggles caches."""
    boot = vhost_boot(NVHE)
    vhost_check(boot, "repro_trace")
    folder = boot.result.out_dir / "checks" / "repro_trace"
    off, on = (folder / "off.txt").read_text(), (folder / "on.txt").read_text()
    for trace in (off, on):
        assert "kvm_entry:" in trace and "kvm_exit:" in trace
        events = [
            line.split("event=")[1].split()[0] for line in trace.splitlines() if "event=" in line
        ]
        assert events == ["create", "enter", "poweroff", "teardown-start", "teardown-end"]
    assert "kvm_toggle_cache:" not in off
    toggles = [line for line in on.splitlines() if "kvm_toggle_cache:" in line]
    assert toggles and toggles[-1].endswith("(cache was off, now on)")


@pytest.mark.vhost
def test_vhost_repeat_prints_every_vm(vhost_boot) -> None:
    """--repeat 20 prints 20 VM lines with positive phase times, then the summary."""
    out = vhost_check(vhost_boot(NVHE), "repro_repeat")
    vms = vm_records(out)
    assert [int(vm["vm"]) for vm in vms] == list(range(20))
    assert all(int(vm[key]) > 0 for vm in vms for key in ("create_ns", "run_ns", "teardown_ns"))
    starts = [int(vm["create_start_ns"]) for vm in vms]
    assert starts == sorted(starts)
    assert out.splitlines()[-1].startswith("record=summary vms=20 ok=20 ")


@pytest.mark.vhost
def test_vhost_every_variant_on_two_vcpus(vhost_boot) -> None:
    """Every guest variant runs on 2 vCPUs and both markers check out."""
    out = vhost_check(vhost_boot(NVHE), "repro_variants")
    assert [vm["result"] for vm in vm_records(out)] == ["ok"] * len(EXPECTED)


@pytest.mark.vhost
def test_vhost_probe_prints_histogram(vhost_boot) -> None:
    """The probe runs with helpers on other CPUs; its file agrees with its summary."""
    boot = vhost_boot(NVHE)
    summary = json.loads(vhost_check(boot, "repro_probe"))
    header, records = read_probe_file(boot.result.out_dir / "checks" / "repro_probe" / "probe.bin")
    assert summary["count"] == header["count"] == len(records) == 2000
    assert sum(bucket["count"] for bucket in summary["histogram"]) == 2000
    assert header["helpers"] == 2 and summary["helpers"] == "1-2"


@pytest.mark.vhost
def test_vhost_vmm_errors_are_one_line(vhost_boot) -> None:
    """A timeout and a bad guest file give their exit codes and one clear line each."""
    boot = vhost_boot(NVHE)
    out = vhost_check(boot, "repro_errors")
    assert [line for line in out.splitlines() if line.startswith("status=")] == [
        "status=8",
        "status=4",
    ]
    errors = boot.checks["repro_errors"].stderr.strip().splitlines()
    assert len(errors) == 2
    assert "timeout" in errors[0] and "not an ELF file" in errors[1]


@pytest.mark.vhost
def test_vhost_vmm_tears_down_on_sigterm(vhost_boot) -> None:
    """SIGTERM mid-run: the VM is torn down with its markers, recorded, then the VMM ends by it."""
    boot = vhost_boot(NVHE)
    out = vhost_check(boot, "repro_sigterm")
    assert "status=143" in out.splitlines()  # 128 + SIGTERM: ended by the signal itself
    assert [vm["result"] for vm in vm_records(out)] == ["stopped"]
    assert " stopped=1 " in next(line for line in out.splitlines() if "record=summary" in line)
    trace = (boot.result.out_dir / "checks" / "repro_sigterm" / "term.txt").read_text()
    events = [line.split("event=")[1].split()[0] for line in trace.splitlines() if "event=" in line]
    assert events == ["create", "enter", "stop", "teardown-start", "teardown-end"]
    assert "event=stop signal=15" in trace


@pytest.mark.vhost
def test_vhost_vmm_stopped_anywhere_in_a_series(vhost_boot) -> None:
    """SIGTERM anywhere in a series: every VM before is ok, the last ok or stopped, no error."""
    out = vhost_check(vhost_boot(NVHE), "repro_sigterm_series")
    series = out.split("status=")[1:]
    assert len(series) == 30
    for text in series:
        status, _, rest = text.partition("\n")
        results = [vm["result"] for vm in vm_records(rest)]
        assert status == "143" and "error" not in rest, text
        assert results and results[:-1] == ["ok"] * (len(results) - 1), text
        assert results[-1] in ("ok", "stopped") and " stopped=1 " in rest, text


@pytest.mark.vhost
def test_vhost_vhe_and_protected_run_mmu_on(vhost_boot) -> None:
    """VHE (on max, with a 48-bit IPA VM) and protected mode run the MMU-on guest."""
    vhe = vm_records(vhost_check(vhost_boot("vhe-max"), "repro_vhe"))
    assert [(vm["ipa_bits"], vm["result"]) for vm in vhe] == [("40", "ok"), ("48", "ok")]
    protected = vm_records(vhost_check(vhost_boot("protected-a76"), "repro_protected"))
    assert [vm["result"] for vm in protected] == ["ok"]


@pytest.mark.vhost
def test_vhost_rt_kernel_says_kvm_is_missing(vhost_boot) -> None:
    """On the rt flavour (no KVM) the VMM exits 3 and explains why."""
    boot = vhost_boot("rt-a76")
    assert "status=3" in vhost_check(boot, "repro_no_kvm")
    assert "KVM is not available" in boot.checks["repro_no_kvm"].stderr
