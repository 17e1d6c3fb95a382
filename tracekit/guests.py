"""Read the variant note of a reproducer guest ELF (reproducer/README.md, "The variant note").

Every guest ELF built from reproducer/guests/ carries an ELF note, name "tracekit",
type NT_TRACEKIT_VARIANT, whose description is UTF-8 ``key=value`` lines saying what the
guest does (stage 1 on or off, caches, TLBIs, set/way maintenance, its marker). The host
side reads it to label runs, so this module uses pyelftools only (never polars).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.construct import ConstructError
from elftools.elf.elffile import ELFFile

from tracekit.errors import TracekitError

NOTE_NAME = "tracekit"
NT_TRACEKIT_VARIANT = 0x544B0001
NOTE_FORMAT = 1
RAM_BASE = 0x40000000
# Guest images must end below the marker area at RAM + 1 MiB (the VMM checks the same).
LOAD_LIMIT = RAM_BASE + 0x100000

# Allowed values of the enumerated note keys.
CHOICES: dict[str, frozenset[str]] = {
    "stage1": frozenset({"off", "on", "on-then-off"}),
    "caches": frozenset({"on", "off"}),
    "tlbi": frozenset({"none", "vmalle1", "vmalle1is", "loop-vmalle1is"}),
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

    @property
    def turns_mmu_on(self) -> bool:
        """True when the guest enables its stage-1 MMU at some point (the main trigger)."""
        return self.stage1 != "off"


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


def _find_note(path: Path, elf: ELFFile) -> bytes:
    """Return the description of the tracekit note from the PT_NOTE segments."""
    for segment in elf.iter_segments():
        if segment["p_type"] != "PT_NOTE":
            continue
        for note in segment.iter_notes():
            if note["n_name"] == NOTE_NAME and note["n_type"] == NT_TRACEKIT_VARIANT:
                return bytes(note["n_descdata"])
    raise TracekitError(
        f"{path}: no tracekit variant note (name {NOTE_NAME!r}, type "
        f"{NT_TRACEKIT_VARIANT:#x}); is it a guest built from reproducer/guests?"
    )


def _load_segments(path: Path, elf: ELFFile) -> tuple[tuple[int, int], ...]:
    """List the PT_LOAD segments, checking they sit in guest RAM below the marker area."""
    segments = []
    for segment in elf.iter_segments():
        if segment["p_type"] != "PT_LOAD" or not segment["p_memsz"]:
            continue
        start, size = segment["p_paddr"], segment["p_memsz"]
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
    elf = ELFFile(stream)
    if elf["e_machine"] != "EM_AARCH64":
        raise TracekitError(
            f"{path}: ELF machine {elf['e_machine']} is not AArch64; guests are arm64 code"
        )
    segments = _load_segments(path, elf)
    entry = elf["e_entry"]
    if not any(start <= entry < start + size for start, size in segments):
        raise TracekitError(f"{path}: entry {entry:#x} is not inside a loaded segment")
    fields = _parse_desc(path, _find_note(path, elf))
    _check_fields(path, fields)
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
    )


def read_variant(path: str | os.PathLike[str]) -> GuestVariant:
    """Read a guest ELF's variant note; TracekitError if it is not a valid tracekit guest."""
    guest = Path(path)
    try:
        with guest.open("rb") as stream:
            return _read_elf(guest, stream)
    except OSError as exc:
        raise TracekitError(f"cannot read guest {guest}: {exc.strerror}") from None
    except (ELFError, ConstructError) as exc:
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
