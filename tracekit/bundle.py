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
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any

from tracekit import __version__
from tracekit.errors import TracekitError

MANIFEST = "manifest.json"
SCHEMA = "tracekit-bundle"
SCHEMA_VERSION = 1


# The first line of everything said about a bundle whose host.emulated is set.
EMULATED_LINE = "EMULATED HOST (QEMU): timings are not hardware timings."

# The tracefs group of every kprobe/uprobe tracekit defines (its events are GROUP/NAME).
PROBE_GROUP = "tracekit"


class RunKind(StrEnum):
    """What a run does; the collector has one runner per kind (tracekit/host/runners.py)."""

    QUIET = "quiet"  # cyclictest + stress-ng, untraced: the headline numbers
    TRACED = "traced"  # the same, traced: the attribution
    PROBE = "probe"  # the broadcast-TLBI probe on one CPU
    GUEST = "guest"  # the guest, once
    AFTER_GUEST = "after-guest"  # what may clear the state: hotplug, VMID rollover
    VMS = "vms"  # one sweep point: VMs created, run and destroyed by the VMM
    GUEST_START = "guest-start"  # a during phase's background guest starts
    GUEST_STOP = "guest-stop"  # ... and stops
    VMID_PREP = "vmid-prep"  # throwaway MMU-off VMs, so the guest gets a chosen VMID
    CHURN = "churn"  # VMs created, run and destroyed in turn, cyclictest meanwhile (untraced)


# Runs that measure the rt CPU's wake-ups (cyclictest) under stress-ng.
MEASURE_KINDS = frozenset({RunKind.QUIET, RunKind.TRACED})
# Runs recorded into a trace of their own (raw capture or trace.dat).
# A churn run is untraced: its per-VM times are the fix's cost, which tracing would inflate.
TRACED_KINDS = frozenset(set(RunKind) - {RunKind.QUIET, RunKind.PROBE, RunKind.CHURN})


class RunFile(StrEnum):
    """The files (and the raw capture directory) a run may hold, inside runs/<run_id>/."""

    TRACE = "trace"  # raw capture directory (docs/raw-capture.md)
    TRACE_DAT = "trace.dat"  # --capture trace-cmd
    CYCLICTEST = "cyclictest.txt"  # cyclictest -v -N samples
    CYCLICTEST_JSON = "cyclictest.json"
    CYCLICTEST_HIST = "cyclictest-hist.txt"
    STRESS_YAML = "stress-ng.yaml"
    STRESS = "stress-ng.txt"
    PERF_STAT = "perf-stat.csv"
    PERF_STAT_LOG = "perf-stat.txt"
    PROBE = "probe.bin"  # per-sample probe file
    PROBE_SUMMARY = "probe.json"
    VMM = "vmm.txt"  # the VMM's stdout
    HOTPLUG = "hotplug.txt"
    MAINT = "el2-maint.txt"  # --after-guest tlbi:...: the request and when it ran
    ROLLOVER = "rollover.json"
    VMID_PREP = "vmid-prep.json"
    GUEST_STOP = "guest-stop.json"
    TEARDOWN_FLUSH = "teardown-flush.json"  # a churn's switch state and count, before/after
    VMM_STUCK = "vmm-stuck.txt"  # a VMM the churn's watch killed: its /proc, before any signal


RUNS_DIR = "runs"
# A run id is one path component: no separators, no "..", nothing hidden.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# How a run's trace is looked for, in order: the raw capture, then trace-cmd's file.
RUN_TRACE_FILES = (RunFile.TRACE, RunFile.TRACE_DAT)


def check_run_id(run_id: object) -> str:
    """A run id that is safe as one directory name, or one clear error."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise TracekitError(
            f"run id {run_id!r} is not a plain name (letters, digits, '.', '_', '-'); "
            "the manifest is damaged"
        )
    return run_id


def run_dir(run_id: str) -> str:
    """A run's directory, relative to the bundle: runs/<run_id>."""
    return f"{RUNS_DIR}/{check_run_id(run_id)}"


def run_file(run_id: str, name: str) -> str:
    """A run's file, relative to the bundle: runs/<run_id>/<name>."""
    return f"{run_dir(run_id)}/{name}"


def run_path(root: Path, run_id: str, name: str | None = None) -> Path:
    """A run's directory, or a file in it, under the bundle root."""
    return root / (run_dir(run_id) if name is None else run_file(run_id, name))


def run_trace_path(root: Path, run_id: str) -> Path | None:
    """Where a run's trace is (raw capture directory or trace.dat), or None without one."""
    # Found by name, whatever it holds: a damaged trace then says what is wrong with it
    # when read, where a check of its contents here would hide the run.
    return next((p for n in RUN_TRACE_FILES if (p := run_path(root, run_id, n)).exists()), None)


def is_bundle(path: Path) -> bool:
    """Whether a path is a bundle directory (it holds a manifest)."""
    return path.is_dir() and (path / MANIFEST).is_file()


def bundle_of(trace_path: Path) -> Path | None:
    """The bundle a run's trace sits in (BUNDLE/runs/RUN/trace[.dat]), or None."""
    root = trace_path.parent.parent.parent
    in_runs = trace_path.parent.parent.name == RUNS_DIR and trace_path.name in RUN_TRACE_FILES
    return root if in_runs and is_bundle(root) else None


@dataclass
class RunRecord:
    """One run of a phase: quiet (headline numbers) or traced (attribution)."""

    run_id: str
    phase: str
    kind: str  # a RunKind
    index: int
    start_ns: int | None = None  # trace clock (CLOCK_BOOTTIME), ns
    end_ns: int | None = None
    files: list[str] = field(default_factory=list)
    lost_events: dict[str, int] = field(default_factory=dict)  # per CPU: overrun + dropped
    status: str = "running"  # running, ok, failed, interrupted, over-budget
    note: str = ""
    # What the run varied (a sweep point's ipa_bits/vcpus/touch_kb, a probe's cpu).
    params: dict[str, Any] = field(default_factory=dict)
    # Per tracekit kprobe ("tracekit/EVENT"): hits the kernel missed during this traced run
    # (kprobe_profile's third column; a kretprobe's include returns lost to maxactive).
    # None: not read (an untraced run, or a bundle from before it was recorded).
    probe_misses: dict[str, int] | None = None
    # ns from the end of the last guest run (the guest, or a during phase's guest-stop) to
    # this run's start; None before any guest ended (and in bundles before it was recorded).
    since_guest_ns: int | None = None
    # The guest CPUs' cpuidle entries ("cpuN/STATE" -> count) from the end of the last guest
    # run to this run's start: a power-down state loses TLB contents too. {}: no cpuidle
    # states; None: before any guest ended, or a bundle from before it was recorded.
    idle_since_guest: dict[str, int] | None = None

    @property
    def stopped(self) -> bool:
        """Whether the run did not end normally (killed, interrupted, failed)."""
        return self.status != "ok"


# RunRecord.idle_since_guest's state name for a CPU with no power-down idle state (QEMU's
# virt machine has no cpuidle driver): an empty record reads "WFI only", not "0 entries".
NO_CPUIDLE = "no-cpuidle-WFI-only"
# The name arm64's cpuidle drivers give state 0 (6.1 cpuidle-psci.c, cpuidle-arm.c): WFI
# keeps the TLBs and gets no CPU_PM notification, so it says nothing of lost TLB state.
WFI_STATE = "WFI"


@dataclass
class Manifest:
    """What a bundle holds; serialised as manifest.json."""

    host: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    scenario: dict[str, Any] = field(default_factory=dict)
    runs: list[RunRecord] = field(default_factory=list)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    complete: bool = False
    # What a bundle says until collect marks it: read later, it was killed (SIGKILL, power cut).
    incomplete_reason: str = (
        "collection still running, or killed before it could say so (SIGKILL, power cut)"
    )
    created: str = ""
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION
    tracekit_version: str = __version__

    def to_json(self) -> dict[str, Any]:
        """The manifest as plain JSON data."""
        return asdict(self)

    def fields_for_json(self) -> dict[str, Any]:
        """to_json's data without copying it, for writing out only (never to be changed):
        asdict's deep copy of the host facts and run lists was most of each save's time
        (every run saves twice; ~0.3 s a save in the emulated host)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["runs"] = [{f.name: getattr(run, f.name) for f in fields(run)} for run in self.runs]
        return data

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
    return size_and_sha256(path)[1]


def size_and_sha256(path: Path) -> tuple[int, str]:
    """A file's size (the bytes read, no stat) and SHA-256, read in chunks."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def files_below(directory: Path) -> list[Path]:
    """Every regular file below a directory (none if it does not exist), in no set order,
    told by the directory entries' types.

    Not rglob and is_file: those list every directory twice and stat every file, and on
    a bundle over 9p or NFS each is a round trip (in the emulated host, 55 s of a short
    collection's listings and 70 s of its checksums, cProfile in session 11's boot).
    """
    return [Path(entry.path) for entry in _entries_below(directory) if entry.is_file()]


def _entries_below(directory: Path, skip: Path | None = None) -> list[os.DirEntry[str]]:
    """Every entry below a directory but the directories themselves (symlinks not followed),
    leaving out the directory `skip` and all below it."""
    if not directory.is_dir():
        return []
    found, pending = [], [directory]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if Path(entry.path) != skip:
                        pending.append(Path(entry.path))
                else:
                    found.append(entry)
    return found


@dataclass(frozen=True)
class Listing:
    """A bundle's plain files as one walk of its directories found them (bundle-relative).

    What the checks of a bundle (damaged_files, cut_files) look up instead of resolving
    each path: resolving stats every component of it, ~20 round trips a file over 9p
    (the kill matrix's check of one bundle took ~110 s in the emulated host). A file
    reached through no symlink is inside the bundle; anything else is resolved as before.
    """

    root: Path
    plain: dict[str, os.DirEntry[str]]
    has_links: bool

    @classmethod
    def of(cls, root: Path) -> Listing:
        """Walk the bundle once."""
        plain, has_links = {}, False
        for entry in _entries_below(root):
            if entry.is_symlink():
                has_links = True
            elif entry.is_file(follow_symlinks=False):
                plain[Path(entry.path).relative_to(root).as_posix()] = entry
        return cls(root, plain, has_links)

    def file(self, rel: str) -> Path | None:
        """root/rel if it is a file inside the bundle, None if it is none (confined's
        error if the path leaves the bundle)."""
        plain = PurePosixPath(rel)
        if plain.as_posix() in self.plain:
            return self.root / rel
        if not self.has_links and not plain.is_absolute() and ".." not in plain.parts:
            return None  # no symlink could make it one, and the walk saw no file there
        path = confined(self.root, rel)
        return path if path.is_file() else None

    def size(self, rel: str) -> int | None:
        """The size of root/rel if it is a file inside the bundle (one stat at most)."""
        entry = self.plain.get(PurePosixPath(rel).as_posix())
        if entry is not None:
            return entry.stat(follow_symlinks=False).st_size
        path = self.file(rel)
        return None if path is None else path.stat().st_size


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

    def finish(self, runs_listed: bool = False) -> None:
        """Checksum every file and mark the bundle complete.

        `runs_listed`: every file under runs/ is in its run's `files` (the collector lists
        them at each run's end, once the run's tools have exited), so runs/ is not walked
        again: a walk is ~60 ms a directory over 9p and a main bundle has ~430 of them
        (~25 s of its end in the emulated host). What is outside runs/ is walked always.
        """
        if runs_listed:
            runs = self.root / RUNS_DIR
            listed = [self.root / rel for run in self.manifest.runs for rel in run.files]
            others = [Path(e.path) for e in _entries_below(self.root, skip=runs) if e.is_file()]
            self._checksum_all([*dict.fromkeys(listed), *others])
        else:
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
        text = json.dumps(self.manifest.fields_for_json(), indent=2, sort_keys=True)
        tmp.write_text(text + "\n")
        os.replace(tmp, self.root / MANIFEST)

    def _checksum_all(self, paths: list[Path] | None = None) -> None:
        """Record size and sha256 of every file in the bundle (or of `paths`) except the
        manifest."""
        files: dict[str, dict[str, Any]] = {}
        for path in files_below(self.root) if paths is None else paths:
            if path.name not in (MANIFEST, MANIFEST + ".tmp"):
                size, sha256 = size_and_sha256(path)
                files[path.relative_to(self.root).as_posix()] = {"size": size, "sha256": sha256}
        self.manifest.files = files


def read_manifest(root: str | Path) -> Manifest:
    """Read a bundle's manifest, with one clear error for anything that is not one."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise TracekitError(f"{root} is not a tracekit bundle: it has no {MANIFEST}")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as err:
        raise TracekitError(f"{path}: unreadable manifest ({err}); the bundle is damaged") from None
    check_manifest_shape(data, path)
    if data["schema_version"] > SCHEMA_VERSION:
        raise TracekitError(
            f"{path}: bundle schema version {data['schema_version']} is newer than this "
            f"tracekit understands ({SCHEMA_VERSION}); upgrade tracekit"
        )
    return Manifest.from_json(data)


# Manifest keys and the JSON type each must have (absent ones take their default).
_MANIFEST_TYPES: dict[str, type | tuple[type, ...]] = {
    "host": dict, "options": dict, "scenario": dict, "runs": list, "files": dict,
    "complete": bool, "incomplete_reason": str, "created": str,
}  # fmt: skip
_RUN_TYPES: dict[str, type | tuple[type, ...]] = {
    "phase": str, "kind": str, "index": int, "files": list, "lost_events": dict,
    "status": str, "note": str, "params": dict, "start_ns": (int, type(None)),
    "end_ns": (int, type(None)), "probe_misses": (dict, type(None)),
    "since_guest_ns": (int, type(None)), "idle_since_guest": (dict, type(None)),
}  # fmt: skip


def check_manifest_shape(data: object, path: Path) -> None:
    """One clear error for a manifest of the wrong shape (a damaged or foreign file)."""

    def bad(what: str) -> TracekitError:
        """The error, naming the manifest and what is wrong in it."""
        return TracekitError(f"{path}: {what}; the bundle's manifest is damaged")

    if not isinstance(data, dict):
        raise bad(f"a JSON {type(data).__name__}, not an object")
    if data.get("schema") != SCHEMA:
        raise TracekitError(
            f"{path}: not a tracekit bundle manifest (schema {data.get('schema')!r})"
        )
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise bad(f"schema_version is {version!r}, not a positive whole number")
    _check_types(data, _MANIFEST_TYPES, "", bad)
    for n, run in enumerate(data.get("runs", [])):
        if not isinstance(run, dict):
            raise bad(f"runs[{n}] is a {type(run).__name__}, not an object")
        for key in ("run_id", "phase", "kind", "index"):
            if key not in run:
                raise bad(f"runs[{n}] has no {key}")
        check_run_id(run["run_id"])
        _check_types(run, _RUN_TYPES, f"runs[{n}].", bad)


def _check_types(
    data: dict[str, Any],
    types: dict[str, type | tuple[type, ...]],
    where: str,
    bad: Any,
) -> None:
    """Each present key has its JSON type (a bool is no int, here)."""
    for key, kind in types.items():
        if key not in data:
            continue
        value = data[key]
        wrong = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        if wrong:
            raise bad(f"{where}{key} is {value!r} ({type(value).__name__})")


def bundle_problems(
    root: Path,
    manifest: Manifest,
    full: bool = False,
    damaged: dict[str, str] | None = None,
    cut: dict[str, str] | None = None,
) -> list[str]:
    """What is missing, changed or cut in a bundle, one line each (sizes; with `full`, hashes).

    Sizes are cheap and checked on every open; the sha256 of every file is checked on
    request (`tracekit verify`, `report --verify`): mtimes do not survive a copy from a
    board, so a hash is the only proof that nothing changed. `damaged`, `cut`:
    damaged_files' and cut_files' answers, when the caller has them already.
    """
    problems = [] if manifest.complete else [f"INCOMPLETE: {manifest.incomplete_reason}"]
    if damaged is None:
        damaged = damaged_files(root, manifest, full)
    if cut is None:
        cut = cut_files(root, manifest)
    problems += [f"{rel}: {what}" for rel, what in damaged.items()]
    return problems + [f"{rel}: {what}" for rel, what in cut.items() if rel not in damaged]


def damaged_files(root: Path, manifest: Manifest, full: bool = False) -> dict[str, str]:
    """Bundle-relative path -> what is wrong with it: missing, resized, or (full) changed."""
    damaged: dict[str, str] = {}
    listing = Listing.of(root)
    for rel, meta in sorted(manifest.files.items()):
        size = listing.size(rel)
        if size is None:
            damaged[rel] = "missing (the manifest lists it)"
        elif size != meta.get("size"):
            damaged[rel] = f"{size} bytes, the manifest recorded {meta.get('size')}"
        elif full and sha256_file(root / rel) != meta.get("sha256"):
            damaged[rel] = "changed since collection (sha256 differs)"
    for run in manifest.runs:
        for rel in run.files:
            if rel not in manifest.files and listing.file(rel) is None:
                damaged[rel] = f"missing (run {run.run_id} lists it)"
    return damaged


# A run's line-oriented outputs, and what of each is read once it is cut. Every line
# their writers print ends in a newline, so a file that does not end in one was cut when
# its writer was stopped (SIGKILL, a power cut), and its last line may be any prefix of
# a line (a latency of "33" cut from "338400").
CUT_LINES = {
    RunFile.CYCLICTEST: "its last line is not read",
    RunFile.STRESS_YAML: "not read (its metrics may be partial): the run's throughput is not known",
    RunFile.STRESS: "its last line is cut",
    RunFile.VMM: "its last line is not read",
    RunFile.PROBE_SUMMARY: "not read: the probe slot's summary is not known",
}
CUT_LINE = "cut mid-line (its writer was stopped)"


def cut_files(root: Path, manifest: Manifest) -> dict[str, str]:
    """Files a stopped writer left cut: a line-oriented output ending mid-line, a CPU's
    ring-buffer pages ending mid-page. One byte or a size per file: checked on every open."""
    cut: dict[str, str] = {}
    listing = Listing.of(root)
    for run in manifest.runs:
        for name, read in CUT_LINES.items():
            rel = run_file(run.run_id, name)
            if _ends_mid_line(listing, rel):
                cut[rel] = f"{CUT_LINE}: {read}"
        cut |= _cut_pages(root, run.run_id)
    return cut


def _ends_mid_line(listing: Listing, rel: str) -> bool:
    """Whether a file has bytes after its last newline (False when absent or empty)."""
    if not listing.size(rel):
        return False
    with (listing.root / rel).open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _cut_pages(root: Path, run_id: str) -> dict[str, str]:
    """A raw capture's CPU files that end mid-page (the copy was stopped mid-write)."""
    capture = run_path(root, run_id, RunFile.TRACE)
    try:
        page = json.loads((capture / "capture.json").read_text()).get("page_size")
    except (OSError, ValueError, AttributeError):
        return {}  # no capture here, or one the reader names as damaged
    if type(page) is not int or page <= 0:
        return {}
    cut: dict[str, str] = {}
    for raw in sorted(capture.glob("per_cpu/cpu*/trace_pipe_raw")):
        if extra := raw.stat().st_size % page:
            cut[raw.relative_to(root).as_posix()] = (
                f"cut mid-page (its writer was stopped): the last {extra} bytes, part of a "
                "page, are not read; that page's events are lost, how many is not known"
            )
    return cut


def verify_files(root: Path, manifest: Manifest) -> list[str]:
    """Files whose presence, size or checksum no longer match the manifest (full check)."""
    problems = bundle_problems(root, manifest, full=True)
    return [p for p in problems if not p.startswith("INCOMPLETE")]


def add_file(root: Path, rel: str, source: Path, added_by: str, note: str = "") -> None:
    """Add a file to a finished bundle atomically, with its checksum and who added it.

    For what only the outside can record (e.g. the emulated host's ground truth, written
    by QEMU after the collection inside it ended). The file is copied under a temporary
    name and renamed, then the manifest is rewritten atomically: a crash leaves either
    the old bundle or the new one.
    """
    manifest = read_manifest(root)
    target = confined(root, rel)
    if target.exists():
        raise TracekitError(f"{root}: {rel} already exists in the bundle; it is not replaced")
    if not source.is_file():
        raise TracekitError(f"{source}: no such file to add to the bundle")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".adding")
    shutil.copyfile(source, tmp)
    with tmp.open("rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    manifest.files[rel] = {
        "size": target.stat().st_size,
        "sha256": sha256_file(target),
        "added_by": added_by,
        "note": note,
    }
    BundleWriter(root, manifest).save()


def confined(root: Path, rel: str) -> Path:
    """root/rel, refusing a relative path that leaves the bundle."""
    target = (root / rel).resolve()
    if not target.is_relative_to(root.resolve()) or Path(rel).is_absolute():
        raise TracekitError(f"{rel!r} is outside the bundle {root}; the manifest is damaged")
    return root / rel


def find_bundles(path: Path) -> list[Path]:
    """The bundle directories at or under `path` (a bundle's own runs are not searched):
    a bundle, or a directory of bundles such as a campaign's, in sorted path order."""
    if not path.exists():
        raise TracekitError(f"{path}: no such file or directory; name a bundle directory")
    if not path.is_dir():
        raise TracekitError(
            f"{path} is not a directory; name a bundle (a directory with {MANIFEST})"
        )
    if (path / MANIFEST).is_file():
        return [path]
    found = sorted(m.parent for m in path.rglob(MANIFEST))
    bundles = [b for b in found if not any(o in b.parents for o in found)]
    if not bundles:
        raise TracekitError(
            f"{path} holds no tracekit bundle (no {MANIFEST} in it or below it);"
            " name the directory `tracekit collect -o` wrote"
        )
    return bundles
