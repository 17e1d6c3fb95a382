"""Reproducer guests: their variant note, and the parametric guest's knob block.

Every guest ELF built from reproducer/guests/ carries an ELF note, name "tracekit",
type NT_TRACEKIT_VARIANT, whose description is UTF-8 ``key=value`` lines saying what the
guest does (stage 1 on or off, caches, TLBIs, set/way maintenance, its marker, and for
the parametric guest its preset, revision and knobs). The knob block the VMM writes at
KNOB_BASE is mirrored here from reproducer/guests/knobs.h and knobset.c
(reproducer/README.md, "The knob block"); tests check the mirror against the C. The host
side reads all this to label runs, so this module uses the standard library only (the
ELF64 headers are read by tracekit/guestelf.py; never polars).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tracekit.errors import TracekitError
from tracekit.guestelf import EM_AARCH64, PT_LOAD, GuestElf, NotAnElf, parse_elf

NOTE_NAME = "tracekit"
NT_TRACEKIT_VARIANT = 0x544B0001
NOTE_FORMAT = 1
RAM_BASE = 0x40000000
# Guest images must end below the marker area at RAM + 1 MiB (the VMM checks the same).
LOAD_LIMIT = RAM_BASE + 0x100000

UNKNOWN_REVISION = "unknown"  # a guest built before revisions (the old one-.S-per-variant)

# --- The knob block (reproducer/guests/knobs.h; layout 1) ---
KNOB_LAYOUT = 1
KNOB_BASE = 0x40010000
KNOB_MAGIC = 0x424F4E4B4B54  # "TKKNOB"
KNOB_WORDS = 32
KNOB_STRUCT = struct.Struct(f"<{KNOB_WORDS}Q")
WORD_MARKER = 3
# The knobs, in word order from word 4: name -> value names (None: a number, with its max).
BOOL = {"0": 0, "1": 1}
CACHEABILITY = {"nc": 0, "wbwa": 1, "wt": 2, "wb": 3}
TLBI_CHOICES = {"none": 0, "vmalle1": 1, "vmalle1is": 2, "aside1": 3, "aside1is": 4}
KNOBS: dict[str, dict[str, int] | int] = {
    "mmu": BOOL,
    "leaf": {"4k": 12, "2m": 21, "1g": 30},
    "pre_tlbi": BOOL,
    "pages": 1 << 18,
    "on_us": 3_600_000_000,
    "ng": BOOL,
    "asid": 255,
    "irgn": CACHEABILITY,
    "orgn": CACHEABILITY,
    "sh": {"non": 0, "outer": 2, "inner": 3},
    "mmu_off": BOOL,
    "tlbi": TLBI_CHOICES,
    "tlbi_count": 2**32 - 1,
    "caches": BOOL,
    "setway": {"none": 0, "before": 1, "after": 2},
    "touch": BOOL,
    "touch_kb": 1 << 20,
    "spin_us": 3_600_000_000,
}
KNOB_WORD = {name: 4 + i for i, name in enumerate(KNOBS)}
# Every preset starts from these (knobset.c, knobs_defaults).
KNOB_DEFAULTS = {name: 0 for name in KNOBS} | {"leaf": 30, "irgn": 1, "orgn": 1, "sh": 3}
# Derived words the VMM fills in (knobset.c, knobs_derive).
DERIVED_WORD = {
    "mair": 24,
    "tcr": 25,
    "ttbr0": 26,
    "sctlr_bits": 27,
    "on_ticks": 28,
    "spin_ticks": 29,
    "dose_base": 30,
    "tlbi_arg": 31,
}
# What the knobs make one vCPU of the parametric guest execute as invalidations
# (guest.S): per knob, the instructions it adds, as the ground-truth log names them
# (tracekit.ingest.groundtruth.operation). pre_tlbi acts only with mmu=1 (its step is
# inside the MMU-on branch); the tlbi step runs tlbi_count times, each TLBI completed by
# its DSB. The guest's other barrier (DSB SY before the marker, touch and set/way
# steps) is not listed: tests compare exactly the TLBIs and the DSB NSH/ISH.
# tests/test_campaign_vhost.py checks this against the plugin's log of real cells.
PRE_TLBI_EXECUTES = ("TLBI VMALLE1", "DSB ISH")
TLBI_EXECUTES = {
    "vmalle1": ("TLBI VMALLE1", "DSB NSH"),
    "vmalle1is": ("TLBI VMALLE1IS", "DSB ISH"),
    "aside1": ("TLBI ASIDE1", "DSB NSH"),
    "aside1is": ("TLBI ASIDE1IS", "DSB ISH"),
}
# The presets the build makes (knobset.c): one ELF each, named after it.
PRESETS = (
    "mmu-off",
    "mmu-on",
    "mmu-on-nocache",
    "mmu-on-off",
    "mmu-on-asid",
    "mmu-on-vmalle1",
    "mmu-on-vmalle1is",
    "tlbi-loop",
    "cache-toggle",
    "setway-after-on",
    "mmu-on-report",
)
BACKINGS = ("default", "4k", "thp", "hugetlb")
_DOSE_OFFSET = 0x200000
_GIB = 1 << 30

# Allowed values of the enumerated note keys.
CHOICES: dict[str, frozenset[str]] = {
    "stage1": frozenset({"off", "on", "on-then-off"}),
    "caches": frozenset({"on", "off"}),
    "tlbi": frozenset({"none", *TLBI_CHOICES, *(f"loop-{name}" for name in TLBI_CHOICES)}),
    "setway": frozenset({"yes", "no"}),
    "touch": frozenset({"yes", "no"}),
}
REQUIRED_KEYS = (
    "format",
    "variant",
    "description",
    "stage1",
    "caches",
    "asid",
    "tlbi",
    "setway",
    "touch",
    "marker",
    "registers",
)


@dataclass(frozen=True)
class GuestVariant:
    """What one guest ELF does, as its variant note says, plus where it loads."""

    path: Path
    variant: str
    description: str
    stage1: str
    caches: str
    asid: int
    tlbi: str
    setway: bool
    touch: bool
    marker: int
    registers: tuple[str, ...]
    entry: int
    segments: tuple[tuple[int, int], ...]  # (IPA, size in memory) of each PT_LOAD
    preset: str = "none"  # the parametric guest's preset; "none" for an old guest
    revision: str = UNKNOWN_REVISION  # guest revision (note key); old guests have none
    knob_layout: int = 0  # knob block layout; 0: an old guest without one
    knobs: tuple[tuple[str, str], ...] = ()  # the preset's knobs as the note writes them

    @property
    def turns_mmu_on(self) -> bool:
        """True when the guest enables its stage-1 MMU at some point (the main trigger)."""
        return self.stage1 != "off"

    @property
    def knob_values(self) -> dict[str, str]:
        """The preset's knobs by name, as the command line writes them ({} for old guests)."""
        return dict(self.knobs)


def _parse_desc(path: Path, desc: bytes) -> dict[str, str]:
    """Split the note description into its key=value lines."""
    try:
        text = desc.decode("utf-8")
    except UnicodeDecodeError:
        raise TracekitError(
            f"{path}: the tracekit note is not UTF-8 text; rebuild the guest from reproducer/guests"
        ) from None
    fields: dict[str, str] = {}
    for line in text.rstrip("\n").split("\n"):
        key, sep, value = line.partition("=")
        if not sep or not key:
            raise TracekitError(
                f"{path}: malformed note line {line!r} (expected key=value); rebuild the guest"
            )
        fields[key] = value
    return fields


def _check_fields(path: Path, fields: dict[str, str]) -> None:
    """Check the note has every key with an allowed value and a supported format."""
    missing = [key for key in REQUIRED_KEYS if key not in fields]
    if missing:
        raise TracekitError(
            f"{path}: the tracekit note lacks {', '.join(missing)}; rebuild the guest"
        )
    if fields["format"] != str(NOTE_FORMAT):
        raise TracekitError(
            f"{path}: note format {fields['format']!r} is not supported (this tracekit reads "
            f"format {NOTE_FORMAT}); use a matching tracekit or rebuild the guest"
        )
    for key, allowed in CHOICES.items():
        if fields[key] not in allowed:
            raise TracekitError(
                f"{path}: note {key}={fields[key]!r} is not one of {', '.join(sorted(allowed))}"
            )


def _parse_int(path: Path, key: str, text: str) -> int:
    """Parse a decimal or 0x-prefixed note value."""
    try:
        return int(text, 0)
    except ValueError:
        raise TracekitError(f"{path}: note {key}={text!r} is not a number") from None


def _find_note(path: Path, elf: GuestElf) -> bytes:
    """Return the description of the tracekit note from the PT_NOTE segments."""
    for name, kind, desc in elf.notes():
        if name == NOTE_NAME and kind == NT_TRACEKIT_VARIANT:
            return desc
    raise TracekitError(
        f"{path}: no tracekit variant note (name {NOTE_NAME!r}, type "
        f"{NT_TRACEKIT_VARIANT:#x}); is it a guest built from reproducer/guests?"
    )


def _load_segments(path: Path, elf: GuestElf) -> tuple[tuple[int, int], ...]:
    """List the PT_LOAD segments, checking they sit in guest RAM below the marker area."""
    segments = []
    for segment in elf.segments:
        if segment.type != PT_LOAD or not segment.memsz:
            continue
        start, size = segment.paddr, segment.memsz
        if start < RAM_BASE or start + size > LOAD_LIMIT:
            raise TracekitError(
                f"{path}: segment {start:#x}-{start + size:#x} is outside guest RAM below "
                f"the marker area ({RAM_BASE:#x}-{LOAD_LIMIT:#x}); link it with guest.ld"
            )
        segments.append((start, size))
    if not segments:
        raise TracekitError(f"{path}: no PT_LOAD segment: nothing for the VMM to load")
    return tuple(segments)


def _read_elf(path: Path, stream: BinaryIO) -> GuestVariant:
    """Read and check the ELF header, segments and note of an open guest file."""
    elf = parse_elf(stream.read())
    if elf.machine != EM_AARCH64:
        raise TracekitError(
            f"{path}: ELF machine {elf.machine} is not AArch64 ({EM_AARCH64}); guests are "
            "arm64 code"
        )
    segments = _load_segments(path, elf)
    entry = elf.entry
    if not any(start <= entry < start + size for start, size in segments):
        raise TracekitError(f"{path}: entry {entry:#x} is not inside a loaded segment")
    fields = _parse_desc(path, _find_note(path, elf))
    _check_fields(path, fields)
    knob_layout = _parse_int(path, "knobs", fields.get("knobs", "0"))
    if knob_layout not in (0, KNOB_LAYOUT):
        raise TracekitError(
            f"{path}: knob layout {knob_layout} is not supported (this tracekit reads layout "
            f"{KNOB_LAYOUT}); use a matching tracekit or rebuild the guest"
        )
    return GuestVariant(
        path=path,
        variant=fields["variant"],
        description=fields["description"],
        stage1=fields["stage1"],
        caches=fields["caches"],
        asid=_parse_int(path, "asid", fields["asid"]),
        tlbi=fields["tlbi"],
        setway=fields["setway"] == "yes",
        touch=fields["touch"] == "yes",
        marker=_parse_int(path, "marker", fields["marker"]),
        registers=tuple(fields["registers"].split(",")),
        entry=entry,
        segments=segments,
        preset=fields.get("preset", "none"),
        revision=fields.get("revision", UNKNOWN_REVISION),
        knob_layout=knob_layout,
        knobs=tuple(
            (k.removeprefix("knob."), v) for k, v in fields.items() if k.startswith("knob.")
        ),
    )


def read_variant(path: str | os.PathLike[str]) -> GuestVariant:
    """Read a guest ELF's variant note; TracekitError if it is not a valid tracekit guest."""
    guest = Path(path)
    try:
        with guest.open("rb") as stream:
            return _read_elf(guest, stream)
    except OSError as exc:
        raise TracekitError(f"cannot read guest {guest}: {exc.strerror}") from None
    except NotAnElf as exc:
        raise TracekitError(
            f"{guest}: not a valid ELF file ({exc}); give a guest built by make -C reproducer"
        ) from None


def list_guests(directory: str | os.PathLike[str]) -> list[GuestVariant]:
    """Read every *.elf guest of a build directory, sorted by variant name.

    A file whose name differs from the variant its note declares is an error: variant
    names are the file names, and a renamed guest would mislabel every run.
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise TracekitError(
            f"guest directory {folder} does not exist; build the guests with make -C reproducer"
        )
    guests = [read_variant(path) for path in sorted(folder.glob("*.elf"))]
    if not guests:
        raise TracekitError(f"no guest ELF (*.elf) in {folder}; build them with make -C reproducer")
    for guest in guests:
        if guest.path.stem != guest.variant:
            raise TracekitError(
                f"{guest.path}: its note names variant {guest.variant!r}; guest files must be "
                "named after their variant"
            )
    return sorted(guests, key=lambda guest: guest.variant)


def read_knob_block(path: str | os.PathLike[str]) -> list[int]:
    """The default knob block a parametric guest ELF links at KNOB_BASE, as 32 words."""
    guest = Path(path)
    try:
        for segment in parse_elf(guest.read_bytes()).segments:
            start = segment.paddr
            if segment.type == PT_LOAD and start <= KNOB_BASE < start + segment.filesz:
                data = segment.data[KNOB_BASE - start :][: KNOB_STRUCT.size]
                return list(KNOB_STRUCT.unpack(data))
    except OSError as exc:
        raise TracekitError(f"cannot read guest {guest}: {exc.strerror}") from None
    except (NotAnElf, struct.error) as exc:
        raise TracekitError(f"{guest}: no readable knob block ({exc}); rebuild it") from None
    raise TracekitError(
        f"{guest}: no knob block at {KNOB_BASE:#x}; it is an old guest, rebuild it with make"
    )


def parse_knob(name: str, value: object) -> int:
    """A knob's value as the block stores it; TracekitError naming what is allowed."""
    spec = KNOBS.get(name)
    if spec is None:
        raise TracekitError(f"unknown guest knob {name!r}; knobs are {', '.join(KNOBS)}")
    text = str(value)
    if isinstance(spec, dict):
        if text not in spec:
            raise TracekitError(f"guest knob {name}={text!r}: expected one of {'|'.join(spec)}")
        return spec[text]
    if not text.isdigit() or int(text) > spec:
        raise TracekitError(f"guest knob {name}={text!r}: expected a number from 0 to {spec}")
    return int(text)


def format_knob(name: str, word: int) -> str:
    """A knob's stored value as the command line and the VMM's output write it."""
    spec = KNOBS[name]
    if isinstance(spec, dict):
        for text, value in spec.items():
            if value == word:
                return text
    return str(word)


def _table_bytes(knobs: Mapping[str, int], ram_bytes: int) -> int:
    """Bytes of stage-1 tables the VMM puts at the top of RAM (knobset.c, table_bytes)."""
    if not knobs["mmu"]:
        return 0
    if knobs["leaf"] == 30:
        return 4096
    if knobs["leaf"] == 21:
        return 2 * 4096
    mapped = min(ram_bytes, _GIB)
    return (2 + -(-mapped // (2 << 20))) * 4096


def pack_knob_block(
    knobs: Mapping[str, int], marker: int, ram_mb: int = 16, cntfrq_hz: int = 62_500_000
) -> bytes:
    """The 256-byte block the VMM writes for these knob values (every knob given)."""
    words = [0] * KNOB_WORDS
    words[0:4] = [KNOB_MAGIC, KNOB_LAYOUT, KNOB_STRUCT.size, marker]
    for name, value in knobs.items():
        words[KNOB_WORD[name]] = value
    ram_bytes = ram_mb << 20
    tables = _table_bytes(knobs, ram_bytes)
    table_base = RAM_BASE + ((ram_bytes - tables) & ~4095)
    caches = (1 << 2 | 1 << 12) if knobs["caches"] else 0
    derived = {
        "mair": 0xFF00,
        "tcr": 25
        | knobs["irgn"] << 8
        | knobs["orgn"] << 10
        | knobs["sh"] << 12
        | 1 << 23
        | 2 << 32,
        "ttbr0": table_base | knobs["asid"] << 48 if tables else 0,
        "sctlr_bits": (1 | caches) if knobs["mmu"] else 0,
        "on_ticks": knobs["on_us"] * cntfrq_hz // 1_000_000,
        "spin_ticks": knobs["spin_us"] * cntfrq_hz // 1_000_000,
        "dose_base": RAM_BASE + _DOSE_OFFSET,
        "tlbi_arg": knobs["asid"] << 48,
    }
    for name, value in derived.items():
        words[DERIVED_WORD[name]] = value
    return KNOB_STRUCT.pack(*words)


def vmm_guest_argv(
    preset: str | None = None,
    knobs: Mapping[str, object] | None = None,
    backing: str | None = None,
) -> list[str]:
    """The VMM options that run the parametric guest as PRESET with KNOBS over it.

    Every value is checked here, so a bad plan fails before anything runs. Put the result
    before the guest ELF on the VMM's command line; with no preset the ELF's own applies.
    """
    argv: list[str] = []
    if preset is not None:
        if preset not in PRESETS:
            raise TracekitError(
                f"unknown guest preset {preset!r}; presets are {', '.join(PRESETS)}"
            )
        argv += ["--preset", preset]
    for name, value in (knobs or {}).items():
        argv += ["--knob", f"{name}={format_knob(name, parse_knob(name, value))}"]
    if backing is not None:
        if backing not in BACKINGS:
            raise TracekitError(
                f"guest RAM backing {backing!r}: expected one of {', '.join(BACKINGS)}"
            )
        argv += ["--backing", backing]
    return argv


def guest_invalidations(knobs: Mapping[str, str]) -> dict[str, int]:
    """TLBIs and DSB NSH/ISH one vCPU executes with these knob values (as the VMM prints)."""
    counts: dict[str, int] = {}
    steps: list[tuple[tuple[str, ...], int]] = []
    if knobs["mmu"] == "1" and knobs["pre_tlbi"] == "1":
        steps.append((PRE_TLBI_EXECUTES, 1))
    if knobs["tlbi"] != "none":
        steps.append((TLBI_EXECUTES[knobs["tlbi"]], int(knobs["tlbi_count"])))
    for instructions, times in steps:
        for name in instructions:
            if times:
                counts[name] = counts.get(name, 0) + times
    return counts


def vmm_unescape(value: str) -> str:
    """Undo the VMM's %XX escaping of whitespace, '=' and '%' in a key=value line's value
    (reproducer/common.c fprint_escaped: guest paths, variants, the stop sender's comm)."""
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), value)
