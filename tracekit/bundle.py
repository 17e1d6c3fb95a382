"""The bundle: the on-disk contract between the arm64 host and everything else.

A bundle is a directory holding `manifest.json` and the raw files a collection recorded.
The manifest is written when collection starts (marked incomplete) and rewritten as runs
finish, so an interrupted collection leaves a bundle that says it is incomplete, never
one that looks complete. Standard library only: this runs on the host.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracekit import __version__
from tracekit.errors import TracekitError

MANIFEST = "manifest.json"
SCHEMA = "tracekit-bundle"
SCHEMA_VERSION = 1


# The first line of everything said about a bundle whose host.emulated is set.
EMULATED_LINE = "EMULATED HOST (QEMU): timings are not hardware timings."


@dataclass
class RunRecord:
    """One run of a phase: quiet (headline numbers) or traced (attribution)."""

    run_id: str
    phase: str
    kind: str  # quiet, traced, probe, guest, after-guest, vms, guest-start, guest-stop
    index: int
    start_ns: int | None = None  # trace clock (CLOCK_BOOTTIME), ns
    end_ns: int | None = None
    files: list[str] = field(default_factory=list)
    lost_events: dict[str, int] = field(default_factory=dict)  # per CPU: overrun + dropped
    status: str = "running"  # running, ok, failed, interrupted, over-budget
    note: str = ""
    # What the run varied (a sweep point's ipa_bits/vcpus/touch_kb, a probe's cpu).
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Manifest:
    """What a bundle holds; serialised as manifest.json."""

    host: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    scenario: dict[str, Any] = field(default_factory=dict)
    runs: list[RunRecord] = field(default_factory=list)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    complete: bool = False
    incomplete_reason: str = "collection still running"
    created: str = ""
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION
    tracekit_version: str = __version__

    def to_json(self) -> dict[str, Any]:
        """The manifest as plain JSON data."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """Rebuild a manifest from manifest.json data."""
        known = RunRecord.__dataclass_fields__
        runs = [
            RunRecord(**{k: v for k, v in run.items() if k in known})
            for run in data.get("runs", [])
        ]
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["runs"] = runs
        return cls(**fields)


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class BundleWriter:
    """Writes a bundle directory; the manifest on disk is always a consistent snapshot."""

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = root
        self.manifest = manifest
        if not manifest.created:
            manifest.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    @classmethod
    def create(cls, root: Path, manifest: Manifest) -> BundleWriter:
        """Create a new bundle directory; refuse to overwrite a non-empty one."""
        if root.exists() and any(root.iterdir()):
            raise TracekitError(
                f"bundle directory {root} exists and is not empty; "
                "choose a new -o path or remove the old bundle"
            )
        root.mkdir(parents=True, exist_ok=True)
        writer = cls(root, manifest)
        writer.save()
        return writer

    def path(self, relative: str) -> Path:
        """Absolute path of a file inside the bundle, creating its directory."""
        target = self.root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def start_run(self, run: RunRecord) -> RunRecord:
        """Record a run as started and save the manifest."""
        self.manifest.runs.append(run)
        self.save()
        return run

    def end_run(self, run: RunRecord, status: str = "ok", note: str = "") -> None:
        """Record a run's end (status ok, failed or interrupted) and save the manifest."""
        run.status = status
        run.note = note
        self.save()

    def finish(self) -> None:
        """Checksum every file and mark the bundle complete."""
        self._checksum_all()
        self.manifest.complete = True
        self.manifest.incomplete_reason = ""
        self.save()

    def mark_incomplete(self, reason: str) -> None:
        """Mark the bundle incomplete with a reason, checksumming what was recorded."""
        for run in self.manifest.runs:
            if run.status == "running":
                run.status = "interrupted"
        self._checksum_all()
        self.manifest.complete = False
        self.manifest.incomplete_reason = reason
        self.save()

    def save(self) -> None:
        """Write manifest.json atomically (write a temporary file, then rename)."""
        tmp = self.root / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest.to_json(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.root / MANIFEST)

    def _checksum_all(self) -> None:
        """Record size and sha256 of every file in the bundle except the manifest."""
        files: dict[str, dict[str, Any]] = {}
        for path in sorted(self.root.rglob("*")):
            if path.is_file() and path.name not in (MANIFEST, MANIFEST + ".tmp"):
                rel = path.relative_to(self.root).as_posix()
                files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
        self.manifest.files = files


def read_manifest(root: str | Path) -> Manifest:
    """Read a bundle's manifest, with one clear error for anything that is not one."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise TracekitError(f"{root} is not a tracekit bundle: it has no {MANIFEST}")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TracekitError(f"{path}: unreadable manifest ({err}); the bundle is damaged") from None
    if data.get("schema") != SCHEMA:
        raise TracekitError(
            f"{path}: not a tracekit bundle manifest (schema {data.get('schema')!r})"
        )
    if data.get("schema_version", 0) > SCHEMA_VERSION:
        raise TracekitError(
            f"{path}: bundle schema version {data['schema_version']} is newer than this "
            f"tracekit understands ({SCHEMA_VERSION}); upgrade tracekit"
        )
    return Manifest.from_json(data)


def verify_files(root: Path, manifest: Manifest) -> list[str]:
    """Names of files whose size or checksum no longer match the manifest."""
    bad: list[str] = []
    for rel, meta in manifest.files.items():
        path = root / rel
        if not path.is_file():
            bad.append(f"{rel}: missing")
        elif path.stat().st_size != meta["size"] or sha256_file(path) != meta["sha256"]:
            bad.append(f"{rel}: changed since collection")
    return bad
