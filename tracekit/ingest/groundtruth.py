"""The ground-truth plugin's log (reproducer/groundtruth/, docs/tables.md) as polars tables.

`read_header` and `read_log` read the file as the plugin wrote it; `decode` adds what
each instruction word names (operation, EL form, scope, shareability). `load_ground_truth`
reads a `vhost run --ground-truth` output directory into the final table: where each
record executed, the Linux CPU and the trace clock (tracekit.ingest.gtalign).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from tracekit.errors import TracekitError
from tracekit.ingest import gtalign
from tracekit.symbols.kallsyms import read_kallsyms
from tracekit.vhost import runner

if TYPE_CHECKING:
    from tracekit.bundle import RunRecord

# The files `vhost run --ground-truth` leaves in --out.
GT_LOG = runner.GROUND_TRUTH_LOG
GT_KALLSYMS = runner.KALLSYMS
GT_MARKERS = runner.MARKERS
GT_DMESG = runner.BOOT_DMESG
GT_RUN = runner.RUN_RECORD

MAGIC = b"TKGTLOG\0"
# 2: SSBB/PSSBB have kind 7 and DSB #8/#12 are flagged SY; a version-1 log's are
# corrected from the instruction word (decode), so both are read the same.
VERSIONS = (1, 2)
HEADER_SIZE = 64
RECORD_SIZE = 32
CLOCK_MONOTONIC = 1

_HEADER = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("record_size", "<u4"),
        ("capacity", "<u8"),
        ("reserved", "<u8"),
        ("complete", "<u4"),
        ("clock", "<u4"),
        ("vcpus", "<u4"),
        ("marker_capacity", "<u4"),
        ("untracked_sites", "<u8"),
        ("markers_reserved", "<u8"),
    ]
)
_RECORD = np.dtype(
    [
        ("ts_ns", "<u8"),
        ("vaddr", "<u8"),
        ("haddr", "<u8"),
        ("insn", "<u4"),
        ("vcpu", "<u2"),
        ("kind", "u1"),
        ("flags", "u1"),
    ]
)


@dataclass(frozen=True)
class LogHeader:
    """What the log's header says: its bounds, how much was reserved, whether it was closed.

    The last `marker_capacity` slots of the file are kept for markers, so a log full of
    other records still aligns its clock; at exit the plugin moves them up behind the
    others. A log QEMU did not close still has them at the end of its capacity.
    """

    capacity: int
    reserved: int
    complete: bool
    vcpus: int
    untracked_sites: int
    marker_capacity: int = 0
    markers_reserved: int = 0

    @property
    def regular_written(self) -> int:
        """Records other than markers the file holds."""
        return min(self.reserved, self.capacity - self.marker_capacity)

    @property
    def markers_written(self) -> int:
        """Markers the file holds."""
        return min(self.markers_reserved, self.marker_capacity)

    @property
    def written(self) -> int:
        """Records the file holds."""
        return self.regular_written + self.markers_written

    @property
    def not_written(self) -> int:
        """Records the plugin saw but could not store: the log (or its marker part) was full."""
        return self.reserved + self.markers_reserved - self.written

    def untracked_note(self) -> str | None:
        """The line saying executions were lost in unknown number, or None if none were."""
        if not self.untracked_sites:
            return None
        return (
            f"{self.untracked_sites} instruction sites NOT tracked (the plugin ran out of "
            "memory): none of their executions was logged, and how many there were is unknown"
        )


def _bad(path: Path, what: str) -> TracekitError:
    """One line naming the file and what is wrong with it."""
    return TracekitError(
        f"{path}: {what}; this is not a ground-truth log of this tracekit (docs/tables.md)"
    )


def read_header(path: str | os.PathLike[str]) -> LogHeader:
    """The log's header, checked: magic, version, record size, clock."""
    source = Path(path)
    try:
        raw = source.read_bytes()[:HEADER_SIZE]
    except OSError as exc:
        raise TracekitError(f"cannot read ground-truth log {source}: {exc.strerror}") from None
    if len(raw) < HEADER_SIZE or raw[:8] != MAGIC:
        raise _bad(source, "no TKGTLOG header")
    head = np.frombuffer(raw, _HEADER, count=1)[0]
    if int(head["version"]) not in VERSIONS:
        known = ", ".join(map(str, VERSIONS))
        raise _bad(source, f"format version {int(head['version'])}, this reader knows {known}")
    if int(head["record_size"]) != RECORD_SIZE or int(head["clock"]) != CLOCK_MONOTONIC:
        raise _bad(source, "unexpected record size or clock")
    return LogHeader(
        capacity=int(head["capacity"]),
        reserved=int(head["reserved"]),
        complete=bool(head["complete"]),
        vcpus=int(head["vcpus"]),
        untracked_sites=int(head["untracked_sites"]),
        marker_capacity=int(head["marker_capacity"]),
        markers_reserved=int(head["markers_reserved"]),
    )


# enum tkgt_kind of reproducer/groundtruth/tkgt.h.
KINDS = {1: "tlbi", 2: "tlbi-nxs", 3: "dsb", 4: "dsb-nxs", 5: "ic", 6: "marker", 7: "ssb"}
# SSBB and PSSBB (DSB encoding CRm 0 and 4): barriers naming no shareability domain.
SSB_WORDS = (0xD503309F, 0xD503349F)
# DSB #8 and #12 (CRm 8, 12): reserved options, which the Arm ARM has execute as DSB SY.
RESERVED_DSB_WORDS = (0xD503389F, 0xD5033C9F)
# flags bits 0-1 (enum tkgt_share): what the encoding names.
SHARES = ("non-shareable", "inner", "outer", "full-system")
RANGE_FLAG = 0x10

# TLBI (SYS, CRn=8; CRn=9 adds "nXS") by (op1, CRm, op2): name and what it invalidates.
# From the Arm ARM's TLBI list, checked entry by entry against QEMU 7.2's
# target/arm/helper.c reginfo (all 78 QEMU knows; QEMU 7.2 has no FEAT_XS).
_TLBI_SCOPES = {
    "VMALLE1": "vmid",  # stage 1 of the current VMID (EL1&0), or all of EL2&0 in a VHE host
    "ASIDE1": "asid",
    "VAE1": "va",
    "VAAE1": "va",
    "VALE1": "va",
    "VAALE1": "va",
    "RVAE1": "va-range",
    "RVAAE1": "va-range",
    "RVALE1": "va-range",
    "RVAALE1": "va-range",
    "IPAS2E1": "ipa",
    "IPAS2LE1": "ipa",
    "RIPAS2E1": "ipa-range",
    "RIPAS2LE1": "ipa-range",
    "ALLE1": "all-vmids",  # every VMID's stage 1 and 2 entries of EL1&0
    "VMALLS12E1": "vmid-s12",  # the current VMID's stage 1 and stage 2
    "ALLE2": "all-el2",
    "VAE2": "va",
    "VALE2": "va",
    "RVAE2": "va-range",
    "RVALE2": "va-range",
    "ALLE3": "all-el3",
    "VAE3": "va",
    "VALE3": "va",
    "RVAE3": "va-range",
    "RVALE3": "va-range",
}
# CRm -> shareability suffix for the regular (non-IPA) forms.
_CRM_SUFFIX = {1: "OS", 2: "IS", 3: "IS", 5: "OS", 6: "", 7: ""}
# op2 -> base name, per (op1, CRm group): group "main" is CRm 1/3/7, "range" is 2/5/6.
_MAIN = {
    0: {0: "VMALLE1", 1: "VAE1", 2: "ASIDE1", 3: "VAAE1", 5: "VALE1", 7: "VAALE1"},
    4: {0: "ALLE2", 1: "VAE2", 4: "ALLE1", 5: "VALE2", 6: "VMALLS12E1"},
    6: {0: "ALLE3", 1: "VAE3", 5: "VALE3"},
}
_RANGE = {
    0: {1: "RVAE1", 3: "RVAAE1", 5: "RVALE1", 7: "RVAALE1"},
    4: {1: "RVAE2", 5: "RVALE2"},
    6: {1: "RVAE3", 5: "RVALE3"},
}
# op1=4, CRm 0 (the IS forms) and CRm 4 (OS and local forms): the IPA invalidations.
_IPA = {
    (0, 1): "IPAS2E1IS",
    (0, 2): "RIPAS2E1IS",
    (0, 5): "IPAS2LE1IS",
    (0, 6): "RIPAS2LE1IS",
    (4, 0): "IPAS2E1OS",
    (4, 1): "IPAS2E1",
    (4, 2): "RIPAS2E1",
    (4, 3): "RIPAS2E1OS",
    (4, 4): "IPAS2LE1OS",
    (4, 5): "IPAS2LE1",
    (4, 6): "RIPAS2LE1",
    (4, 7): "RIPAS2LE1OS",
}
# The EL whose form an op1 is (TLBI only: 0 EL1, 4 EL2, 6 EL3).
EL_FORMS = {0: "EL1", 4: "EL2", 6: "EL3"}
# DSB CRm: binutils' and the Arm ARM's option names; 0 and 4 are SSBB and PSSBB.
_DSB_OPTIONS = {
    1: "OSHLD",
    2: "OSHST",
    3: "OSH",
    5: "NSHLD",
    6: "NSHST",
    7: "NSH",
    9: "ISHLD",
    10: "ISHST",
    11: "ISH",
    13: "LD",
    14: "ST",
    15: "SY",
}
_DSB_NXS = ("OSHnXS", "NSHnXS", "ISHnXS", "SYnXS")


def tlbi_base(op1: int, crm: int, op2: int) -> str | None:
    """The TLBI name without nXS (e.g. 'VMALLS12E1IS'), None if the encoding is unallocated."""
    if op1 == 4 and crm in (0, 4):
        return _IPA.get((crm, op2))
    group = _RANGE if crm in (2, 5, 6) else _MAIN if crm in (1, 3, 7) else None
    base = group.get(op1, {}).get(op2) if group else None
    return None if base is None else base + _CRM_SUFFIX[crm]


def tlbi_scope(name: str) -> str | None:
    """What a TLBI name invalidates: vmid, vmid-s12, all-vmids, asid, va, ipa, ..."""
    core = name.removesuffix("nXS")
    for suffix in ("IS", "OS"):
        core = core.removesuffix(suffix)
    return _TLBI_SCOPES.get(core)


def operation(insn: int) -> str:
    """The instruction's name as the Arm ARM writes it, e.g. 'TLBI ALLE1IS', 'DSB ISH'."""
    op1, crm, op2 = (insn >> 16) & 7, (insn >> 8) & 15, (insn >> 5) & 7
    if (insn & 0xFFF8E000) == 0xD5088000:  # TLBI, CRn 8 or 9
        base = tlbi_base(op1, crm, op2)
        nxs = "nXS" if insn & 0x1000 else ""
        return f"TLBI {base}{nxs}" if base else f"TLBI op1={op1} CRm={crm} op2={op2}{nxs}"
    if (insn & 0xFFFFF0FF) == 0xD503309F:
        return {0: "SSBB", 4: "PSSBB"}.get(crm) or f"DSB {_DSB_OPTIONS.get(crm, f'#{crm} (as SY)')}"
    if (insn & 0xFFFFF3FF) == 0xD503323F:
        return f"DSB {_DSB_NXS[crm >> 2]}"
    if (insn & 0xFFFFFFE0) == 0xD5087100:
        return "IC IALLUIS"
    if (insn & 0xFFFFFFE0) == 0xD5087500:
        return "IC IALLU"
    return "MARKER" if insn == 0xD5032EFF else f"unknown {insn:#010x}"


@dataclass(frozen=True)
class GroundTruthLog:
    """One log: its header, its records (file order), and slots reserved but never filled."""

    header: LogHeader
    records: pl.DataFrame
    unfilled: int


def read_log(path: str | os.PathLike[str]) -> GroundTruthLog:
    """The log's records as the plugin wrote them, with the encoding decoded (see decode)."""
    source = Path(path)
    header = read_header(source)
    body = source.read_bytes()[HEADER_SIZE:]
    raw = _record_slots(header, body)
    count = len(raw)
    # A slot with ts 0 was reserved by a vCPU that never got to fill it (QEMU killed).
    filled = raw[raw["ts_ns"] != 0]
    frame = pl.DataFrame(
        {
            "ts_host": filled["ts_ns"].astype(np.int64),
            "vcpu": filled["vcpu"].astype(np.int32),
            "insn": filled["insn"],
            "vaddr": filled["vaddr"],
            "haddr": filled["haddr"],
            "kind_code": filled["kind"],
            "flags": filled["flags"],
        }
    )
    unfilled = count - len(filled) + (header.written - count)
    return GroundTruthLog(header, decode(frame), unfilled)


def _record_slots(header: LogHeader, body: bytes) -> np.ndarray:
    """The written slots: all in a row once closed, else the two regions where they are."""
    slots = len(body) // RECORD_SIZE
    if header.complete:
        return np.frombuffer(body, _RECORD, count=min(header.written, slots))
    regular = np.frombuffer(body, _RECORD, count=min(header.regular_written, slots))
    start = header.capacity - header.marker_capacity
    count = max(0, min(header.markers_written, slots - start))
    markers = np.frombuffer(body, _RECORD, count=count, offset=start * RECORD_SIZE)
    return np.concatenate([regular, markers])


def decode(frame: pl.DataFrame) -> pl.DataFrame:
    """Add kind, operation, el_form, scope, shareability and range from the raw columns."""
    words = frame.select(pl.col("insn").unique()).to_series().to_list()
    names = {word: operation(word) for word in words}
    table = pl.DataFrame(
        {
            "insn": pl.Series(words, dtype=pl.UInt32),
            "operation": [names[w] for w in words],
            "el_form": [_el_form(w) for w in words],
            "scope": [_scope(w, names[w]) for w in words],
        }
    )
    # From the word, not the kind code: a version-1 log has SSBB/PSSBB as kind dsb.
    ssb = pl.col("insn").is_in(SSB_WORDS)
    encoded = (pl.col("flags") & 3).replace_strict(dict(enumerate(SHARES)), return_dtype=pl.String)
    return (
        frame.join(table, on="insn", how="left")
        .with_columns(
            kind=pl.when(ssb)
            .then(pl.lit("ssb"))
            .otherwise(pl.col("kind_code").replace_strict(KINDS, return_dtype=pl.String)),
            # Markers and SSBB/PSSBB name no shareability; every other kind's flags do.
            shareability=pl.when((pl.col("kind_code") == 6) | ssb)
            .then(None)
            .when(pl.col("insn").is_in(RESERVED_DSB_WORDS))
            .then(pl.lit("full-system"))
            .otherwise(encoded),
            range=(pl.col("flags") & RANGE_FLAG) != 0,
        )
        .drop("kind_code", "flags")
        .sort("ts_host", "vcpu", maintain_order=True)
    )


def _el_form(insn: int) -> str | None:
    """A TLBI's EL form from op1 (EL1, EL2, EL3); None for the other instructions."""
    if (insn & 0xFFF8E000) != 0xD5088000:
        return None
    return EL_FORMS.get((insn >> 16) & 7, f"op1={(insn >> 16) & 7}")


def _scope(insn: int, name: str) -> str | None:
    """What a TLBI invalidates, 'icache' for IC IALLU(IS); None for barriers and markers."""
    if name.startswith("TLBI "):
        return tlbi_scope(name.removeprefix("TLBI "))
    return "icache" if name.startswith("IC ") else None


_GTMARK_LINE = re.compile(r"^gtmark seq=(\d+) cpu=(\d+) slot=(\d+) t0=(\d+) t1=(\d+)$")


def parse_gtmark(text: str, source: str = "gtmark output") -> pl.DataFrame:
    """gtmark's lines (reproducer/gtmark.c) as seq, cpu, slot, t0, t1 (CLOCK_BOOTTIME ns)
    and round.

    gtmark numbers each run's markers from 0, and one boot runs it before and after the
    command: `seq` here counts every line of the file in order, `round` the gtmark runs
    (0 before the command, 1 after), each starting where gtmark's own seq is 0 again.
    """
    rows: list[tuple[int, ...]] = []
    for number, line in enumerate(text.splitlines(), 1):
        match = _GTMARK_LINE.match(line.strip())
        if not match:
            if line.strip():
                raise TracekitError(f"{source}:{number}: not a gtmark line: {line.strip()!r}")
            continue
        own, cpu, slot, t0, t1 = (int(group) for group in match.groups())
        run = rows[-1][5] + (own == 0) if rows else 0
        rows.append((len(rows), cpu, slot, t0, t1, run))
    schema = {
        "seq": pl.Int64,
        "cpu": pl.Int64,
        "slot": pl.Int64,
        "t0": pl.Int64,
        "t1": pl.Int64,
        "round": pl.Int64,
    }
    return pl.DataFrame(rows, schema=schema, orient="row")


@dataclass(frozen=True)
class GroundTruth:
    """One boot's ground truth: the table, the clock fit, the vCPU map, and the log's losses."""

    table: pl.DataFrame
    fit: gtalign.ClockFit
    vcpu_to_cpu: dict[int, int]
    header: LogHeader
    unfilled: int
    kvm_mode: str
    # The host kernel ran at EL2 with E2H: from the boot log (gtalign.host_vhe), not KVM.
    vhe: bool = False

    def notes(self) -> list[str]:
        """What every output of this table must say: emulated, losses, clock residual."""
        notes = [
            "ground truth from a QEMU TCG plugin on an emulated host: what the emulated CPUs "
            "executed, not hardware"
        ]
        if self.header.not_written:
            notes.append(
                f"{self.header.not_written} records NOT written: the log's bound of "
                f"{self.header.capacity} records was reached"
            )
        if self.unfilled:
            notes.append(f"{self.unfilled} records reserved but never filled (QEMU stopped)")
        untracked = self.header.untracked_note()
        if untracked:
            notes.append(untracked)
        notes.append(self.fit.summary())
        return notes


def load_ground_truth(
    directory: str | os.PathLike[str],
    kvm_mode: str | None = None,
    vhe: bool | None = None,
    sync: pl.DataFrame | None = None,
) -> GroundTruth:
    """A `vhost run --ground-truth` output directory as one table on the trace clock.

    The KVM mode the kernel initialised comes from vhost-run.json unless given; whether the
    host kernel ran with VHE from the boot log, or `vhe` where the log cannot say. `sync`:
    the VMM's and the probe's sync lines (gtalign.SYNC_SCHEMA, e.g. bundle_sync_lines),
    fitted beside gtmark's markers.
    """
    out = Path(directory)
    need = [GT_LOG, GT_KALLSYMS, GT_MARKERS, GT_DMESG] + ([] if kvm_mode else [GT_RUN])
    missing = [name for name in need if not (out / name).is_file()]
    if missing:
        raise TracekitError(
            f"{out}: no {', '.join(missing)}; give the --out directory of a "
            "`tracekit vhost run --ground-truth` run"
        )
    log = read_log(out / GT_LOG)
    if kvm_mode is None:
        kvm_mode = json.loads((out / GT_RUN).read_text()).get("kvm_mode", "unknown")
    dmesg = (out / GT_DMESG).read_text(errors="replace")
    host_vhe = gtalign.host_vhe(dmesg, vhe)
    table, fit, mapping = gtalign.ground_truth_table(
        log.records,
        gtalign.kernel_layout(read_kallsyms(out / GT_KALLSYMS)),
        parse_gtmark((out / GT_MARKERS).read_text(), str(out / GT_MARKERS)),
        dmesg,
        log.header.vcpus,
        host_vhe,
        sync,
    )
    return GroundTruth(table, fit, mapping, log.header, log.unfilled, kvm_mode, host_vhe)


def bundle_sync_lines(bundle: Path, runs: Iterable[RunRecord]) -> pl.DataFrame:
    """The sync markers the bundle's VMM runs (vmm.txt `sync` records) and probe slots
    (probe.json `sync`) printed, as gtalign.SYNC_SCHEMA rows (trace clock: CLOCK_BOOTTIME)."""
    from tracekit.bundle import RunFile, run_path
    from tracekit.ingest.vmm import read_vmm_output

    rows: list[tuple[str, int, int, int]] = []
    for run in runs:
        vmm = run_path(bundle, run.run_id, RunFile.VMM)
        if vmm.is_file():
            for line in read_vmm_output(vmm).syncs:
                source = f"vmm {run.run_id} vm={line.get('vm')} {line.get('event')}"
                rows.append(_sync_row(source, line, vmm))
        probe = run_path(bundle, run.run_id, RunFile.PROBE_SUMMARY)
        if probe.is_file():
            for line in _probe_syncs(probe, stopped=run.stopped):
                rows.append(_sync_row(f"probe {run.run_id} {line.get('event')}", line, probe))
    return pl.DataFrame(rows, schema=gtalign.SYNC_SCHEMA, orient="row")


def sync_lines_of(bundles: Iterable[Path]) -> pl.DataFrame | None:
    """Every bundle's sync lines together (one boot's bundles), None without a bundle."""
    from tracekit.bundle import read_manifest

    found = [bundle_sync_lines(root, read_manifest(root).runs) for root in bundles]
    return pl.concat(found) if found else None


def _probe_syncs(path: Path, stopped: bool = False) -> list[dict[str, object]]:
    """The `sync` list of a probe summary (none in summaries from before it). A stopped
    run's summary may be empty or cut (RunData says so as one of its problems): its
    markers are then not known, and the fit rests on the other runs' markers."""
    try:
        summary = json.loads(path.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError) as err:
        if stopped:
            return []
        raise TracekitError(f"{path}: not the probe's JSON summary ({err})") from None
    return list(summary.get("sync", []))


def _sync_row(source: str, line: dict, path: Path) -> tuple[str, int, int, int]:
    """One sync line as (source, cpu, t0, t1); one error line if a field is missing."""
    try:
        return source, int(line["cpu"]), int(line["t0"]), int(line["t1"])
    except (KeyError, ValueError, TypeError):
        raise TracekitError(
            f"{path}: a sync marker line without integer cpu, t0 and t1 ({line}); give the "
            "tool's output unchanged"
        ) from None


def has_ground_truth(root: str | os.PathLike[str]) -> bool:
    """Whether a bundle holds ground truth (BUNDLE/groundtruth/)."""
    return (Path(root) / runner.GT_BUNDLE_DIR).is_dir()


def bundle_ground_truth(root: str | os.PathLike[str]) -> tuple[GroundTruth, pl.DataFrame]:
    """A bundle's ground truth (BUNDLE/groundtruth/) and its rows given to the bundle's
    runs: run_id and phase of the run whose [start_ns, end_ns] holds each row's ts (rows
    outside every run are left out of the second table, kept in the first)."""
    from tracekit.bundle import read_manifest

    bundle = Path(root)
    where = bundle / runner.GT_BUNDLE_DIR
    if not where.is_dir():
        raise TracekitError(
            f"{bundle}: no ground truth ({runner.GT_BUNDLE_DIR}/): only bundles collected in "
            "`tracekit vhost run --ground-truth` have one; a board has none"
        )
    manifest = read_manifest(bundle)
    truth = load_ground_truth(where, sync=bundle_sync_lines(bundle, manifest.runs))
    runs = [
        (run.run_id, run.phase, run.start_ns, run.end_ns)
        for run in manifest.runs
        if run.start_ns is not None and run.end_ns is not None
    ]
    windows = pl.DataFrame(
        runs,
        schema={"run_id": pl.String, "phase": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    ).sort("start_ns")
    given = truth.table.sort("ts").join_asof(windows, left_on="ts", right_on="start_ns")
    inside = given.filter(pl.col("ts") <= pl.col("end_ns")).drop("start_ns", "end_ns")
    return truth, inside
