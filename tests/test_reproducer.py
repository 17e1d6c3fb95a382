"""The reproducer cross-builds, its guests carry their variant note, and its tools behave.

The build is real (make with CROSS_COMPILE=aarch64-linux-gnu-, -Werror) into a temporary
directory. The VMM's argument and guest-file checks and the whole probe run under
qemu-aarch64 user mode, which executes the real arm64 binaries (cntvct included);
the VMM's KVM part is exercised in the emulated host, not here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from conftest import VhostBoot, register_vhost_check
from elftools.elf.elffile import ELFFile

from tracekit.errors import TracekitError
from tracekit.guests import (
    KNOB_DEFAULTS,
    KNOB_LAYOUT,
    KNOB_MAGIC,
    KNOB_WORD,
    KNOBS,
    PRE_TLBI_EXECUTES,
    PRESETS,
    RAM_BASE,
    TLBI_CHOICES,
    TLBI_EXECUTES,
    WORD_MARKER,
    GuestVariant,
    format_knob,
    list_guests,
    pack_knob_block,
    parse_knob,
    read_knob_block,
    read_variant,
    vmm_guest_argv,
)
from tracekit.ingest.groundtruth import operation

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
    # Corrected (issue 17 point 2): MMU on, pages read, MMU off, then the TLBI.
    "mmu-on-vmalle1": ("on-then-off", "on", 0, "vmalle1", False, False),
    "mmu-on-vmalle1is": ("on-then-off", "on", 0, "vmalle1is", False, False),
    "tlbi-loop": ("off", "off", 0, "loop-vmalle1is", False, False),
    "cache-toggle": ("on", "on", 0, "none", True, True),
    "setway-after-on": ("on", "on", 0, "none", True, True),
    "mmu-on-report": ("on", "on", 0, "none", False, False),
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
    assert guest.registers == ("x0:vcpu", "x4:vcpus")
    assert guest.description
    assert (guest.preset, guest.revision, guest.knob_layout) == (name, "3", KNOB_LAYOUT)


def test_markers_are_distinct_per_variant(build: Path) -> None:
    guests = list_guests(build / "guests")
    assert [guest.variant for guest in guests] == sorted(EXPECTED)
    assert len({guest.marker for guest in guests}) == len(guests)


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


def test_a_guest_cut_anywhere_is_one_clear_error(build: Path, tmp_path: Path) -> None:
    """Cut at every 61st byte (headers, program headers, the note, the code): the ELF
    reader says what is wrong in a TracekitError, never a struct or index error."""
    whole = (build / "guests" / "mmu-on.elf").read_bytes()
    cut = tmp_path / "mmu-on.elf"
    for size in range(0, len(whole), 61):
        cut.write_bytes(whole[:size])
        try:
            read_variant(cut)
        except TracekitError as err:
            assert "\n" not in str(err) and str(cut) in str(err)


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


def test_collect_reads_guests_without_pyelftools(build: Path) -> None:
    """The collector reads a guest's note by struct (tracekit/guestelf.py): importing
    pyelftools took ~10 s of every collect start in the emulated host."""
    code = (
        "import sys; from tracekit.host import collect; from tracekit.guests import read_variant"
        f"; read_variant({str(build / 'guests' / 'mmu-on.elf')!r})"
        "; sys.exit('elftools' in sys.modules)"
    )
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
    # The regions opt out of THP before the first touch (review of 17, point 5).
    assert summary["thp"] == "nohugepage"
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


def _plugin(tmp_path: Path) -> Path | None:
    """The ground-truth plugin built here from the cached header, None without it."""
    from tracekit.vhost import groundtruth

    try:
        header = groundtruth.header_dir(groundtruth.installed_qemu()) / groundtruth.HEADER
    except TracekitError:
        return None
    if not header.is_file():
        return None
    make = ["make", "-s", "-C", str(groundtruth.plugin_source_dir())]
    subprocess.run([*make, f"QEMU_PLUGIN_INCLUDE={header.parent}", f"O={tmp_path}"], check=True)
    return tmp_path / groundtruth.PLUGIN


@needs_qemu_user
def test_probe_runs_the_sync_marker_around_its_samples(build: Path, tmp_path: Path) -> None:
    """The probe executes the ground-truth marker from the sync slot (63) just before its
    first sample and after its last, and prints both in its summary; under QEMU's
    user-mode emulator the real plugin logs exactly those two, at slot 63, as far apart
    in the host's clock as the probe's own brackets say (CLOCK_BOOTTIME and the host's
    CLOCK_MONOTONIC advance together here)."""
    from tracekit.ingest.groundtruth import read_log
    from tracekit.ingest.gtalign import SYNC_SLOT, marker_slot

    plugin = _plugin(tmp_path)
    if plugin is None:
        pytest.skip("run `tracekit vhost build --ground-truth` (the plugin header)")
    log = tmp_path / "probe.tkgt"
    argv = [QEMU_USER, "-plugin", f"file={plugin},out={log},limit=4096"]
    done = subprocess.run(
        [*argv, str(build / "tlbiprobe"), "--samples", "50"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    sync = json.loads(done.stdout.splitlines()[0])["sync"]
    assert [(s["event"], s["cpu"]) for s in sync] == [("start", 0), ("stop", 0)]
    assert all(s["t0"] <= s["t1"] for s in sync) and sync[0]["t1"] <= sync[1]["t0"]
    markers = read_log(log).records.filter(pl.col("kind") == "marker")
    assert markers.select(marker_slot())["vaddr"].to_list() == [SYNC_SLOT] * 2
    logged_gap = markers["ts_host"][1] - markers["ts_host"][0]
    outer = sync[1]["t1"] - sync[0]["t0"]
    inner = sync[1]["t0"] - sync[0]["t1"]
    assert inner <= logged_gap <= outer


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


def test_build_is_one_elf_per_preset(build: Path) -> None:
    """The build makes the presets tracekit.guests lists, and the old variants are among them."""
    names = sorted(path.stem for path in (build / "guests").glob("*.elf"))
    assert names == sorted(PRESETS) == sorted(EXPECTED)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_block_matches_its_note(build: Path, name: str) -> None:
    """The block an ELF links at KNOB_BASE holds the knobs and marker its note states."""
    path = build / "guests" / f"{name}.elf"
    guest, words = read_variant(path), read_knob_block(path)
    assert words[:3] == [KNOB_MAGIC, KNOB_LAYOUT, 256] and words[WORD_MARKER] == guest.marker
    assert {knob: format_knob(knob, words[KNOB_WORD[knob]]) for knob in KNOBS} == dict(
        guest.knob_values
    )
    assert words[24:] == [0] * 8  # the derived words are the VMM's to fill


def test_the_knob_table_names_every_tlbi_the_guest_code_holds(build: Path) -> None:
    """Every TLBI and DSB NSH/ISH word in the guest's code, named as the ground-truth log
    names it, is one guests.guest_invalidations can expect, and each it expects is there:
    the table and guest.S cannot drift apart (the vhost test checks the counts)."""
    with (build / "guests" / "mmu-on.elf").open("rb") as stream:
        text = ELFFile(stream).get_section_by_name(".text").data()
    words = struct.unpack(f"<{len(text) // 4}I", text[: len(text) // 4 * 4])
    names = {operation(w) for w in words}
    in_code = {n for n in names if n.startswith("TLBI ") or n in ("DSB NSH", "DSB ISH")}
    expected = set(PRE_TLBI_EXECUTES).union(*TLBI_EXECUTES.values())
    assert in_code == expected
    assert set(TLBI_EXECUTES) == set(TLBI_CHOICES) - {"none"}


# What a guest name means, by GUEST_REVISION: a digest of guest.S, knobs.h and knobset.c's
# value tables, knob definitions and presets (guest_meaning_digest). A change to any of
# them fails test_a_change_of_what_a_guest_does_needs_a_revision until it gets an entry:
# bump GUEST_REVISION in knobs.h when what any guest executes changed (so new bundles
# never pool with old ones of the same name), then add the new revision's digest here;
# only a change that leaves every guest's execution as it was (a comment, a description)
# may replace the current revision's digest instead.
GUEST_MEANINGS = {"3": "63f2d9ab6beb7784"}


def guest_meaning_digest(reproducer: Path) -> str:
    """The first 16 hex digits of a SHA-256 over what defines each guest's execution."""
    knobset = (reproducer / "knobset.c").read_text()
    start = knobset.index("static const struct knob_value")
    tables = knobset[start : knobset.index("};", knobset.index("presets[] = {")) + 2]
    digest = hashlib.sha256()
    for part in (
        (reproducer / "guests/guest.S").read_bytes(),
        (reproducer / "guests/knobs.h").read_bytes(),
        tables.encode(),
    ):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def test_a_change_of_what_a_guest_does_needs_a_revision(tmp_path: Path) -> None:
    """Review of 17, Versions: a preset's meaning (guest.S, knobs.h, the preset table)
    cannot change silently under the same GUEST_REVISION."""
    copy = tmp_path / "reproducer"
    for name in ("knobset.c", "guests/guest.S", "guests/knobs.h"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPRODUCER / name, copy / name)
    knobset = copy / "knobset.c"
    knobset.write_text(knobset.read_text().replace('"pre_tlbi=1 mmu=1 caches=1"', '"mmu=1"'))
    assert guest_meaning_digest(copy) != guest_meaning_digest(REPRODUCER)  # mmu-on-report
    header = (REPRODUCER / "guests/knobs.h").read_text()
    match = re.search(r"#define GUEST_REVISION\s+(\d+)", header)
    assert match is not None
    revision, digest = match[1], guest_meaning_digest(REPRODUCER)
    assert GUEST_MEANINGS.get(revision) == digest, (
        f"guest.S, knobs.h or knobset.c's tables changed (digest {digest}) under "
        f"GUEST_REVISION {revision}: if what a guest executes changed, bump GUEST_REVISION "
        f"and add its digest to GUEST_MEANINGS; if not, update revision {revision}'s entry"
    )
    assert revision == max(GUEST_MEANINGS, key=int)  # no going back to an old revision


def test_old_guest_reads_revision_unknown(build: Path, tmp_path: Path) -> None:
    """A guest whose note has no revision and no knob layout reads as an old guest."""

    def edit(data: bytearray) -> None:
        replace_once(data, b"\nrevision=3\n", b"\nxevision=3\n")
        replace_once(data, b"\nknobs=1\n", b"\nxnobs=1\n")

    old = read_variant(patched_copy(build / "guests" / "mmu-on.elf", tmp_path / "mmu-on.elf", edit))
    assert (old.revision, old.knob_layout, old.variant) == ("unknown", 0, "mmu-on")


# (preset, knobs over it, --ram-mb): the VMM's block must be what Python packs.
DUMP_CASES = [
    ("mmu-on", {}, 16),
    ("mmu-on-vmalle1", {"leaf": "4k", "pages": "100"}, 16),
    (
        "mmu-off",
        {
            "mmu": "1",
            "leaf": "2m",
            "irgn": "nc",
            "orgn": "wt",
            "sh": "outer",
            "ng": "1",
            "asid": "200",
            "tlbi": "aside1is",
            "tlbi_count": "7",
            "on_us": "1500",
            "spin_us": "30",
        },
        64,
    ),
    ("cache-toggle", {"touch_kb": "64", "caches": "0"}, 16),
    ("mmu-on-report", {"leaf": "4k"}, 100),
]


def run_fields(stdout: str) -> dict[str, str]:
    """The key=value pairs of the VMM's record=run line."""
    line = next(line for line in stdout.splitlines() if line.startswith("record=run "))
    return dict(pair.split("=", 1) for pair in line.split())


@needs_qemu_user
@pytest.mark.parametrize(("preset", "knobs", "ram_mb"), DUMP_CASES)
def test_vmm_writes_the_block_python_packs(
    build: Path, tmp_path: Path, preset: str, knobs: dict[str, str], ram_mb: int
) -> None:
    """--dump-knobs: the C block equals pack_knob_block, and the run line names every knob."""
    out = tmp_path / "knobs.bin"
    argv = [*vmm_guest_argv(preset, knobs), "--ram-mb", str(ram_mb), "--dump-knobs", str(out)]
    # Any guest ELF will do: --preset replaces its block.
    result = run_arm64(build / "vmm", *argv, str(build / "guests" / "mmu-off.elf"))
    assert result.returncode == 0, result.stderr
    run = run_fields(result.stdout)
    base = read_variant(build / "guests" / f"{preset}.elf")
    values = {name: parse_knob(name, text) for name, text in base.knob_values.items()}
    values |= {name: parse_knob(name, text) for name, text in knobs.items()}
    assert out.read_bytes() == pack_knob_block(values, base.marker, ram_mb, int(run["cntfrq_hz"]))
    assert {name: run[name] for name in KNOBS} == {n: format_knob(n, v) for n, v in values.items()}
    assert (run["preset"], run["revision"], run["knobs"]) == (preset, "3", "1")
    assert run["knobs_set"] == (",".join(knobs) or "none")
    assert run["marker"] == f"{base.marker:#018x}" and run["backing"] == "default"


@needs_qemu_user
def test_vmm_knob_options_and_order(build: Path, tmp_path: Path) -> None:
    """--tlbi-count/--touch-kb/--spin-us set their knobs; a later --knob wins over them."""
    out = tmp_path / "knobs.bin"
    guest = str(build / "guests" / "tlbi-loop.elf")
    args = ["--tlbi-count", "5", "--spin-us", "9", "--knob", "spin_us=11", "--dump-knobs"]
    result = run_arm64(build / "vmm", *args, str(out), guest)
    assert result.returncode == 0, result.stderr
    run = run_fields(result.stdout)
    assert (run["tlbi_count"], run["spin_us"], run["tlbi"], run["mmu"]) == (
        "5",
        "11",
        "vmalle1is",
        "0",
    )
    values = KNOB_DEFAULTS | {"tlbi": 2, "tlbi_count": 5, "spin_us": 11}
    tlbi_loop = read_variant(guest)
    assert out.read_bytes() == pack_knob_block(values, tlbi_loop.marker, 16, int(run["cntfrq_hz"]))


@needs_qemu_user
@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--knob", "leaf=8k"], "--knob leaf='8k': expected one of 4k|2m|1g"),
        (["--knob", "colour=red"], "--knob 'colour=red': expected NAME=VALUE"),
        (["--knob", "asid=256"], "asid='256': expected a number from 0 to 255"),
        (["--preset", "mmu-sideways"], "--preset 'mmu-sideways': expected one of mmu-off,"),
        (["--knob", "pages=4000"], "--ram-mb 16 is too small for 4000 dose pages"),
        (["--backing", "huge"], "--backing 'huge'"),
        (["--backing", "hugetlb", "--ram-mb", "5"], "multiple of 2"),
    ],
)
def test_vmm_rejects_bad_knobs(build: Path, args: list[str], text: str) -> None:
    guest = str(build / "guests" / "mmu-on.elf")
    assert_one_error_line(run_arm64(build / "vmm", *args, guest), 2, text)


@needs_qemu_user
def test_vmm_refuses_knobs_for_an_old_guest(build: Path, tmp_path: Path) -> None:
    """An ELF without a knob block cannot take knobs: one line says to rebuild it."""
    edit = lambda data: replace_once(data, b"\nknobs=1\n", b"\nxnobs=1\n")  # noqa: E731
    old = patched_copy(build / "guests" / "mmu-on.elf", tmp_path / "mmu-on.elf", edit)
    result = run_arm64(build / "vmm", "--knob", "mmu=1", str(old))
    assert_one_error_line(result, 2, "has no knob block")


def test_guest_argv_checks_every_value() -> None:
    """vmm_guest_argv spells knobs as the VMM takes them and rejects bad input in one line."""
    argv = vmm_guest_argv("mmu-on", {"leaf": "4k", "pages": 16, "mmu_off": 1}, "thp")
    assert argv == [
        *("--preset", "mmu-on", "--knob", "leaf=4k", "--knob", "pages=16"),
        *("--knob", "mmu_off=1", "--backing", "thp"),
    ]
    assert vmm_guest_argv() == []
    for call, text in [
        (lambda: vmm_guest_argv("mmu-upside-down"), "unknown guest preset"),
        (lambda: vmm_guest_argv(knobs={"colour": 1}), "unknown guest knob 'colour'"),
        (lambda: vmm_guest_argv(knobs={"leaf": "8k"}), "expected one of 4k|2m|1g"),
        (lambda: vmm_guest_argv(knobs={"asid": 300}), "from 0 to 255"),
        (lambda: vmm_guest_argv(backing="1g"), "expected one of default, 4k, thp, hugetlb"),
    ]:
        with pytest.raises(TracekitError, match=text):
            call()


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
# Each knob changes what the guest does: one VMM run per knob setting, each with its
# kvm_exit/kvm_toggle_cache counts (the traps KVM took) after its output.
KNOB_TRACE = "T=/sys/kernel/tracing/instances/tk-knobs; mkdir -p $T; echo boot > $T/trace_clock"
KNOB_RUN = (
    'run() { name=$1; shift; echo > $T/trace; $R/vmm "$@" $G/mmu-off.elf > $name.txt; '
    'echo "status=$?" >> $name.txt; '
    "echo \"exits=$(grep -c 'kvm_exit:' $T/trace) dabt=$(grep -c DABT_LOW $T/trace) "
    "sys64=$(grep -c SYS64 $T/trace) toggles=$(grep -c 'kvm_toggle_cache:' $T/trace) "
    "cache_on=$(grep -c 'now on' $T/trace)\" >> $name.txt; }"
)
KNOB_RUNS = {
    "off": "--preset mmu-off",
    "on": "--preset mmu-on",
    "nocache": "--preset mmu-on-nocache",
    "report": "--preset mmu-on-report",
    "vmalle1": "--preset mmu-on-vmalle1",
    "leaf4k": "--preset mmu-on --knob leaf=4k --knob pages=64",
    "leaf2m": "--preset mmu-on --knob leaf=2m --knob pages=64",
    "walk": "--preset mmu-on --knob irgn=nc --knob orgn=wt --knob sh=outer",
    "asid": "--preset mmu-on --knob ng=1 --knob asid=7 --knob tlbi=aside1is --knob tlbi_count=5",
    "dose4k": "--preset mmu-on --knob pages=256 --backing 4k",
    "dosethp": "--preset mmu-on --knob pages=256 --backing thp",
    "hugetlb_none": "--preset mmu-on --backing hugetlb",
}
register_vhost_check(
    NVHE,
    "repro_knobs",
    "\n".join(
        [
            INSIDE,
            KNOB_TRACE,
            "for e in kvm_exit kvm_toggle_cache; do echo 1 > $T/events/kvm/$e/enable; done",
            KNOB_RUN,
            *(f"run {name} {args}" for name, args in KNOB_RUNS.items()),
            "echo 8 > /proc/sys/vm/nr_hugepages",
            "run hugetlb --preset mmu-on --knob pages=256 --backing hugetlb",
            "echo 0 > /proc/sys/vm/nr_hugepages; rmdir $T",
        ]
    ),
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
        if not results:  # stopped before its first VM was created: none ran, it says so
            assert " vms=0 " in rest and " stopped=1 " in rest, text
            continue
        assert results[:-1] == ["ok"] * (len(results) - 1), text
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


def knob_run(boot: VhostBoot, name: str) -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
    """One run of repro_knobs: its run record, its vm record, and its trap counts."""
    text = (boot.result.out_dir / "checks" / "repro_knobs" / f"{name}.txt").read_text()
    lines = text.splitlines()
    assert "status=0" in lines, f"{name}:\n{text}"
    vms = vm_records(text)
    assert [vm["result"] for vm in vms] == ["ok"], text
    traps = dict(pair.split("=", 1) for pair in lines[-1].split())
    return run_fields(text), vms[0], {key: int(value) for key, value in traps.items()}


@pytest.mark.vhost
def test_vhost_knobs_change_what_the_guest_does(vhost_boot) -> None:
    """Each knob, set on the MMU-off ELF, shows in the guest's own report of what it did."""
    boot = vhost_boot(NVHE)
    vhost_check(boot, "repro_knobs")
    runs = {name: knob_run(boot, name) for name in KNOB_RUNS if name != "hugetlb_none"}
    sctlr_m, sctlr_c = 1, 1 << 2
    _, off, _ = runs["off"]
    assert int(off["sctlr_on"], 16) == 0 and int(off["sctlr_end"], 16) & sctlr_m == 0
    _, on, _ = runs["on"]
    assert int(on["sctlr_on"], 16) & (sctlr_m | sctlr_c) == sctlr_m | sctlr_c
    _, nocache, _ = runs["nocache"]
    assert int(nocache["sctlr_on"], 16) & (sctlr_m | sctlr_c) == sctlr_m
    # The report's pre-enable TLBI is the only TLBI mmu-on-report issues; mmu-on has none.
    assert (runs["report"][1]["tlbis"], on["tlbis"]) == ("1", "0")
    # mmu-on-vmalle1: pages read with the MMU on, then off before its one TLBI.
    _, vmalle1, _ = runs["vmalle1"]
    assert (vmalle1["pages_read"], vmalle1["tlbis"]) == ("16", "1")
    assert int(vmalle1["sctlr_on"], 16) & sctlr_m and not int(vmalle1["sctlr_end"], 16) & sctlr_m
    # Leaf sizes: the guest walked the VMM's tables (its TTBR0) and read every dose page.
    for name, leaf in (("leaf4k", "4k"), ("leaf2m", "2m"), ("on", "1g")):
        run, vm, _ = runs[name]
        assert run["leaf"] == leaf and vm["guest_ttbr0"] == run["ttbr0"]
    assert runs["leaf4k"][1]["pages_read"] == runs["leaf2m"][1]["pages_read"] == "64"
    ttbr = {name: int(runs[name][1]["guest_ttbr0"], 16) for name in ("leaf4k", "leaf2m", "on")}
    assert ttbr["leaf4k"] < ttbr["leaf2m"] < ttbr["on"]  # more table levels, more pages
    # Walk attributes and ASID reach TCR_EL1 and TTBR0_EL1; aside1is issued 5 times.
    tcr = int(runs["walk"][1]["guest_tcr"], 16)
    assert ((tcr >> 8) & 3, (tcr >> 10) & 3, (tcr >> 12) & 3) == (0, 2, 2)
    _, asid, _ = runs["asid"]
    assert int(asid["guest_ttbr0"], 16) >> 48 == 7 and asid["tlbis"] == "5"


@pytest.mark.vhost
def test_vhost_knobs_show_in_kvm_traps(vhost_boot) -> None:
    """The traps KVM takes follow the knobs: VM-register writes, cache toggles, stage-2 faults."""
    boot = vhost_boot(NVHE)
    vhost_check(boot, "repro_knobs")
    traps = {name: knob_run(boot, name)[2] for name in ("off", "on", "nocache", "dose4k")}
    # cortex-a76 has no FWB: KVM traps MAIR/TCR/TTBR0/SCTLR writes (TVM) until M and C.
    assert traps["off"]["sys64"] == 0 and traps["off"]["toggles"] == 0
    assert traps["on"]["sys64"] >= 4 and traps["on"]["cache_on"] >= 1
    assert traps["nocache"]["sys64"] >= 4 and traps["nocache"]["cache_on"] == 0
    # 256 dose pages on 4 KiB backing: a stage-2 fault each, at least.
    assert traps["dose4k"]["dabt"] >= 256 > traps["on"]["dabt"]


@pytest.mark.vhost
def test_vhost_backing_is_applied_and_printed(vhost_boot) -> None:
    """--backing is printed; hugetlb without reserved pages fails in one line, with them runs."""
    boot = vhost_boot(NVHE)
    vhost_check(boot, "repro_knobs")
    faults = {}
    for name, backing in (("dose4k", "4k"), ("dosethp", "thp"), ("hugetlb", "hugetlb")):
        run, vm, traps = knob_run(boot, name)
        assert run["backing"] == backing and vm["pages_read"] == "256"
        faults[backing] = traps["dabt"]
    # Stage 2 follows the backing: a fault per 4 KiB page, or 2 MiB blocks (seen: 259, 1, 1).
    assert faults["4k"] >= 256 and faults["thp"] < 32 and faults["hugetlb"] < 32
    folder = boot.result.out_dir / "checks" / "repro_knobs"
    assert "status=10" in (folder / "hugetlb_none.txt").read_text().splitlines()
    assert "reserve them first" in boot.checks["repro_knobs"].stderr
