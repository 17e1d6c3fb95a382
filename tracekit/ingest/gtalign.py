"""Ground truth of one emulated boot: where each logged instruction ran, on which Linux
CPU, at what time of the trace clock. Pure functions over the plugin's records (the
files are read by tracekit.ingest.groundtruth).

Where (no register reads in QEMU 7.2's plugin API, so the exception level is inferred):
- the plugin logs each instruction's VA and QEMU's host address of its bytes. Guest RAM
  is one host mapping, so for the kernel image `haddr - vaddr` is one constant; with it
  every record's host address gives the kernel-image address of the same bytes (the
  "physical side"), whatever VA they ran at;
- bytes inside [__hyp_idmap_text_start, __hyp_text_end) run at a low VA: the nVHE
  (or protected) hypervisor at EL2, which runs from TTBR0_EL2 (or its idmap with the MMU
  off); kallsyms names them `__kvm_nvhe_*`;
- other kernel-image bytes: the host kernel (also when run at their physical address
  by the early boot code and CPU bring-up, MMU off), except init text: free_initmem()
  gives [__init_begin, __init_end) back to the page allocator after boot, so those bytes
  may later hold guest RAM, page cache or module text. They are the kernel only when run
  at their image VA or at their physical address (the idmap: `haddr - vaddr` is that of
  the boot's other idmap records); run anywhere else, the VA rules below apply;
- a high VA outside the kernel image: the host kernel if a kallsyms span (a module)
  covers it, else "kernel" uncertain (JIT, fixmap; a Linux guest's kernel would look so);
- a low VA outside the kernel image: TLBI and IC IALLU(IS) are UNDEFINED at EL0, so a
  guest at EL1 executed them, but a record is an attempt (the exec callback runs as the
  instruction starts, so one that UNDEFs or traps is logged too): a user task trying one
  looks the same. They are the guest's, certain inside the reproducer's guest RAM window
  (IPA 0x40000000, 16 MB, identity-mapped), uncertain elsewhere; a DSB or marker there is
  a guest's if in that window, else user space; both uncertain.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.errors import TracekitError
from tracekit.symbols.table import SymbolTable
from tracekit.vhost.qemu import BOOTED_SECONDARY, BOOTING_LINUX, qemu_mpidr

KERNEL_HALF = 1 << 63
# The reproducer's guest RAM: IPA 0x40000000, 16 MB, run identity-mapped or MMU off.
GUEST_WINDOW = (0x4000_0000, 0x4100_0000)
# gtmark's table: 64 slots of 8 bytes (hint; ret), 512-byte aligned; gtmark uses slots
# 0-62 (CPU % 63), the VMM's and the probe's sync marker slot 63 (reproducer/gtmark.h).
MARKER_SLOTS = 64
MARKER_SLOT_BYTES = 8
SYNC_SLOT = 63
# A sync line pairs with the one sync marker on its CPU that the gtmark-only fit puts
# within this distance of its [t0, t1] (the residual target); none or several: unpaired.
SYNC_MATCH_NS = 100_000
SYNC_SCHEMA = {"source": pl.String, "cpu": pl.Int64, "t0": pl.Int64, "t1": pl.Int64}
# KVM's VHE TLB helpers that clear HCR_EL2.TGE and load the guest's VTTBR first
# (__tlb_switch_to_guest, 6.1.176 arch/arm64/kvm/hyp/vhe/tlb.c:19-61, in the helpers at
# :82-143; enter_vmid_context, 6.12.107's :20-68, which clears TGE on every path, in the
# helpers at :92-214; reproducer/kpatch's __kvm_debug_maint for its
# VMID operations): their EL1-form TLBIs act on the guest's EL1&0. Named one by one, not
# by the "__kvm_" prefix: 6.12's __kvm_tlbi_s1e2 (:232-245, nested virtualisation only)
# issues EL1-form TLBIs with TGE set when it has no guest MMU, on the host's EL2&0, so it
# is left out (with a guest MMU it would be the guest's: NV is in no tracekit boot).
VHE_GUEST_CONTEXT = (
    "__kvm_tlb_flush_vmid_ipa",
    "__kvm_tlb_flush_vmid_ipa_nsh",
    "__kvm_tlb_flush_vmid_range",
    "__kvm_tlb_flush_vmid",
    "__kvm_flush_cpu_context",
    "__kvm_debug_maint",
)
# KVM's VHE TLB functions at EL2 in kernel text: those and the VMID-less rollover flush.
VHE_KVM_TLB = (*VHE_GUEST_CONTEXT, "__kvm_flush_vm_context")
# A marker whose [t0, t1] is at most this wide measures the clock offset well.
TIGHT_BRACKET_NS = 20_000

# arch/arm64/kernel/cpufeature.c: ARM64_HAS_VIRT_HOST_EXTN (matches runs_at_el2, a boot
# CPU feature) is printed with this desc when the kernel runs at EL2 with E2H.
VHE_LINE = "CPU features: detected: Virtualization Host Extensions"
_FEATURE_LINE = "CPU features: detected: "


@dataclass(frozen=True)
class KernelLayout:
    """The boot's kernel image (executable part) and hypervisor text, from its kallsyms."""

    # _stext .. _einittext: text, the .rodata.text between (entry trampoline, idmap
    # text, kexec/hibernate; kallsyms names none of it) and init text.
    image: tuple[int, int]
    # _etext .. __init_begin: the unnamed .rodata.text part (no symbol is given there).
    unnamed: tuple[int, int]
    # __init_begin .. _einittext: the image's init text, freed after boot (free_initmem).
    init: tuple[int, int]
    hyp: tuple[int, int]
    symbols: SymbolTable


@dataclass(frozen=True)
class ClockFit:
    """trace ns = offset + slope * (host ns - host0); residuals over the markers, in ns."""

    host0: int
    offset: float
    slope: float
    markers: int
    max_residual_ns: float
    # Largest distance of the fit outside a marker's [t0, t1] bracket (0: inside all).
    max_outside_ns: float
    # Markers whose bracket is at most TIGHT_BRACKET_NS: those the residual is taken over.
    tight_markers: int = 0
    # The check the residual cannot give (it is over the fitted points): an offset fitted
    # on the markers before the command alone, slope 1, predicting the markers after it.
    heldout: HeldOut | None = None
    # The VMM's and the probe's sync markers (None: no sync line was given).
    sync: SyncCheck | None = None
    # Half the widest bracket among the tight markers of the fit (sync markers included
    # once refitted): a marker ran somewhere in [t0, t1], not at its midpoint.
    half_bracket_ns: float = 0.0

    @property
    def error_ns(self) -> float:
        """The largest clock error the fit's line prints: its residual, its distance
        outside a bracket, the held-out error and the sync markers' (each measured from
        a marker's bracket midpoint)."""
        found = [self.max_residual_ns, self.max_outside_ns]
        if self.heldout is not None:
            found += [self.heldout.max_error_ns, self.heldout.max_outside_ns]
        if self.sync is not None and self.sync.paired:
            found += [self.sync.max_error_ns, self.sync.max_residual_ns, self.sync.max_outside_ns]
        return max(found)

    @property
    def bound_ns(self) -> float:
        """How far a fitted time may be from the truth at the markers: the largest error
        from a midpoint (error_ns) plus half the widest tight bracket, since the marker's
        true instant is anywhere in its [t0, t1] (a bound at the markers, not between)."""
        return self.error_ns + self.half_bracket_ns

    @property
    def slope_ppm(self) -> float:
        """How far the fitted slope is from 1, in parts per million."""
        return (self.slope - 1.0) * 1e6

    def apply(self, host_ns: pl.Expr) -> pl.Expr:
        """The trace-clock time of host-clock timestamps."""
        return (
            (self.offset + self.slope * (host_ns - self.host0).cast(pl.Float64))
            .round(0)
            .cast(pl.Int64)
        )

    def summary(self) -> str:
        """One line for the user: markers, residual, bracket, slope, the held-out error."""
        held = self.heldout.summary() if self.heldout else HeldOut.NONE
        sync = self.sync.summary() if self.sync else SyncCheck.NONE
        return (
            f"clock fit over {self.markers} markers: trace = host x {self.slope:.9f} + offset "
            f"(slope {self.slope_ppm:+.4f} ppm from 1); max residual at the fitted markers "
            f"{self.max_residual_ns / 1000:.1f} us over the {self.tight_markers} with a "
            f"bracket <= {TIGHT_BRACKET_NS // 1000} us, max outside a marker's bracket "
            f"{self.max_outside_ns / 1000:.1f} us; {held}; {sync}; bound at the markers "
            f"{self.bound_ns / 1000:.1f} us (the largest of these errors plus half the "
            f"widest of those brackets, {self.half_bracket_ns / 1000:.1f} us); "
            f"{CLOCK_CONDITIONS}"
        )


# When a line maps the clocks at all (QEMU 7.2: the guest counter reads QEMU_CLOCK_VIRTUAL,
# host CLOCK_MONOTONIC plus an offset that vm_stop freezes; unverified in QEMU's source).
CLOCK_CONDITIONS = (
    "valid while QEMU's VM is never stopped and the emulated kernel never adjtimex'es"
)


@dataclass(frozen=True)
class HeldOut:
    """Error at markers left out of a fit: offset on the first round, slope 1."""

    NONE = "held-out error not measured (one round of markers)"

    fitted: int
    left_out: int
    max_error_ns: float
    max_outside_ns: float

    def summary(self) -> str:
        """One clause: what was fitted, what was left out, the error there."""
        return (
            f"held out: offset fitted on the {self.fitted} markers before the command "
            f"(slope 1), error at the {self.left_out} after it max "
            f"{self.max_error_ns / 1000:.1f} us ({self.max_outside_ns / 1000:.1f} us outside "
            "a bracket)"
        )


@dataclass(frozen=True)
class SyncCheck:
    """The VMM's and the probe's sync markers: how many paired, and the clock error there."""

    NONE = "no VMM or probe sync markers printed (tools from before them, or none ran)"

    lines: int  # sync lines the bundle's VMM and probe printed
    paired: int  # of them, paired with one logged sync marker (and fitted)
    logged: int  # sync markers in the log (other bundles' of the same boot included)
    # At the paired ones with a bracket <= TIGHT_BRACKET_NS (a process's first marker can
    # take milliseconds to translate): the gtmark-only fit's distance from their midpoints
    # (they were not in it: an independent check), and the final fit's, which includes
    # them; and, over all paired, the gtmark-only fit's largest distance outside a bracket.
    max_error_ns: float
    max_residual_ns: float
    tight: int = 0
    max_outside_ns: float = 0.0

    def summary(self) -> str:
        """One clause: paired of printed, the independent error, the residual."""
        if not self.paired:
            return (
                f"sync markers: none of {self.lines} printed paired with one of the "
                f"{self.logged} logged within {SYNC_MATCH_NS // 1000} us"
            )
        return (
            f"sync markers (VMM, probe): {self.paired} of {self.lines} printed paired "
            f"({self.logged} logged), gtmark-only fit's error at the {self.tight} with a "
            f"bracket <= {TIGHT_BRACKET_NS // 1000} us max {self.max_error_ns / 1000:.1f} us "
            f"({self.max_outside_ns / 1000:.1f} us outside a bracket), residual after "
            f"fitting them too max {self.max_residual_ns / 1000:.1f} us"
        )


def kernel_layout(symbols: SymbolTable) -> KernelLayout:
    """The image and hyp-text spans a boot's kallsyms names; one line if they are missing."""
    names = (
        "_stext",
        "_etext",
        "__init_begin",
        "_einittext",
        "__hyp_idmap_text_start",
        "__hyp_text_end",
    )
    found = {name: symbols.address_of(name) for name in names}
    missing = [name for name, address in found.items() if address is None]
    if missing:
        raise TracekitError(
            f"the kallsyms copy lacks {', '.join(missing)}: it must be this boot's "
            "/proc/kallsyms read as root (vhost run --ground-truth saves it)"
        )
    at = {name: int(address) for name, address in found.items() if address is not None}
    return KernelLayout(
        image=(at["_stext"], at["_einittext"]),
        unnamed=(at["_etext"], at["__init_begin"]),
        init=(at["__init_begin"], at["_einittext"]),
        hyp=(at["__hyp_idmap_text_start"], at["__hyp_text_end"]),
        symbols=symbols,
    )


def host_offset(sites: pl.DataFrame, layout: KernelLayout) -> int:
    """haddr - vaddr of the kernel image, checked to be one constant."""
    low, high = layout.image
    text = sites.filter(
        (pl.col("vaddr") >= low) & (pl.col("vaddr") < high) & (pl.col("haddr") != 0)
    )
    pairs = zip(text["vaddr"].to_list(), text["haddr"].to_list(), strict=True)
    deltas = Counter((h - v) % (1 << 64) for v, h in pairs)
    if not deltas:
        raise TracekitError(
            "no logged instruction ran at a kernel text address of this kallsyms: is the "
            "kallsyms copy from the same boot as the log?"
        )
    if len(deltas) > 1:
        raise TracekitError(
            f"kernel text appears at {len(deltas)} host offsets, not one: the log and the "
            "kallsyms copy are not from the same boot"
        )
    return next(iter(deltas))


def idmap_offset(sites: pl.DataFrame, layout: KernelLayout, offset: int) -> int | None:
    """haddr - vaddr of kernel text run at its physical address (low VA, outside hyp and
    init text: only the idmap runs kernel text there); None if no such record, or if
    they disagree (then no init-text record is taken for an idmap one)."""
    deltas = Counter()
    for vaddr, haddr in sites.select("vaddr", "haddr").iter_rows():
        image = (haddr - offset) % (1 << 64) if haddr else None
        if vaddr >= KERNEL_HALF or image is None or not _inside(image, layout.image):
            continue
        if not (_inside(image, layout.hyp) or _inside(image, layout.init)):
            deltas[(haddr - vaddr) % (1 << 64)] += 1
    return next(iter(deltas)) if len(deltas) == 1 else None


def _inside(address: int, span: tuple[int, int]) -> bool:
    """address in [span[0], span[1])."""
    return span[0] <= address < span[1]


def _where(
    vaddr: int, haddr: int, kind: str, offset: int, layout: KernelLayout, idmap: int | None
) -> tuple:
    """(where, certain, image address or None) of one instruction site."""
    image = (haddr - offset) % (1 << 64) if haddr else None
    in_image = image is not None and _inside(image, layout.image)
    if in_image and vaddr < KERNEL_HALF and _inside(image, layout.hyp):
        return "hyp", True, image
    if in_image and _inside(image, layout.init):
        # Freed after boot: the kernel's only at its image VA or its physical address.
        idmapped = vaddr < KERNEL_HALF and (haddr - vaddr) % (1 << 64) == idmap
        in_image = vaddr == image or idmapped
    if in_image:
        return "kernel", True, image
    if vaddr >= KERNEL_HALF:
        return "kernel", layout.symbols.covers(vaddr), vaddr
    in_guest = _inside(vaddr, GUEST_WINDOW)
    if kind in ("tlbi", "tlbi-nxs", "ic"):
        # UNDEFINED at EL0, but logged when attempted: outside the window, maybe a user's.
        return "guest", in_guest, None
    return ("guest" if in_guest else "user"), False, None


def locate(records: pl.DataFrame, layout: KernelLayout) -> pl.DataFrame:
    """Add where, where_certain and symbol (function+offset where kallsyms names it)."""
    sites = records.select("vaddr", "haddr", "kind").unique()
    offset = host_offset(sites, layout)
    idmap = idmap_offset(sites, layout, offset)
    rows = []
    for vaddr, haddr, kind in sites.iter_rows():
        where, certain, image = _where(vaddr, haddr, kind, offset, layout, idmap)
        named = image is not None and not layout.unnamed[0] <= image < layout.unnamed[1]
        found = layout.symbols.lookup(image) if named else None
        symbol = f"{found.symbol.name}+{found.offset:#x}" if found else None
        rows.append((vaddr, haddr, kind, where, certain, symbol))
    table = pl.DataFrame(
        rows,
        schema={
            "vaddr": pl.UInt64,
            "haddr": pl.UInt64,
            "kind": pl.String,
            "where": pl.String,
            "where_certain": pl.Boolean,
            "symbol": pl.String,
        },
        orient="row",
    )
    return records.join(table, on=["vaddr", "haddr", "kind"], how="left", maintain_order="left")


def mpidrs_from_dmesg(dmesg: str) -> dict[int, int]:
    """Linux CPU number -> MPIDR, from the boot log's bring-up lines."""
    found: dict[int, int] = {}
    boot = BOOTING_LINUX.search(dmesg)
    if boot:
        found[0] = int(boot.group(1), 16)
    for cpu, mpidr in BOOTED_SECONDARY.findall(dmesg):
        found[int(cpu)] = int(mpidr, 16)
    return found


def vcpu_to_cpu(vcpus: int, mpidrs: dict[int, int]) -> dict[int, int]:
    """QEMU vCPU index -> Linux CPU number, by MPIDR; one line if a vCPU has no CPU."""
    by_mpidr = {mpidr & 0xFF_00FF_FFFF: cpu for cpu, mpidr in mpidrs.items()}
    mapping = {}
    for vcpu in range(vcpus):
        cpu = by_mpidr.get(qemu_mpidr(vcpu))
        if cpu is None:
            raise TracekitError(
                f"vCPU {vcpu} (MPIDR {qemu_mpidr(vcpu):#x}) is in no 'Booted secondary "
                "processor' line of the boot log: is it this boot's dmesg?"
            )
        mapping[vcpu] = cpu
    return mapping


def marker_slot() -> pl.Expr:
    """The table slot a logged marker ran at: (VA >> 3) % 64."""
    return (pl.col("vaddr") // MARKER_SLOT_BYTES) % MARKER_SLOTS


def pair_markers(records: pl.DataFrame, gtmark: pl.DataFrame) -> pl.DataFrame:
    """The plugin's gtmark markers (every slot but the sync one) beside gtmark's lines,
    in order; checked by slot."""
    markers = records.filter(pl.col("kind") == "marker")
    seen = markers.filter(marker_slot() != SYNC_SLOT).sort("ts_host")
    lines = gtmark.sort("seq")
    if seen.height != lines.height:
        raise TracekitError(
            f"the log holds {seen.height} markers but gtmark printed {lines.height}: "
            "something else executed the marker, or a run was cut short; cannot pair them"
        )
    slots = (seen["vaddr"] // MARKER_SLOT_BYTES) % MARKER_SLOTS
    paired = lines.with_columns(
        ts_host=seen["ts_host"], vcpu=seen["vcpu"], seen_slot=slots.cast(pl.Int64)
    )
    wrong = paired.filter(pl.col("seen_slot") != pl.col("slot"))
    if wrong.height:
        raise TracekitError(
            f"{wrong.height} markers ran at another table slot than gtmark says "
            f"(first: seq {wrong['seq'][0]}): the pairing by order is wrong"
        )
    return paired


def check_cpu_map(paired: pl.DataFrame, mapping: dict[int, int]) -> list[int]:
    """The markers (seq) whose vCPU maps to another CPU than gtmark was pinned to."""
    mapped = paired["vcpu"].replace_strict(mapping, default=None)
    return paired.filter(mapped != paired["cpu"])["seq"].to_list()


def sync_markers(records: pl.DataFrame, mapping: dict[int, int]) -> pl.DataFrame:
    """The logged sync markers (slot 63): ts_host, vcpu and the Linux cpu, in time order."""
    seen = records.filter((pl.col("kind") == "marker") & (marker_slot() == SYNC_SLOT))
    cpu = pl.col("vcpu").replace_strict(mapping, default=None, return_dtype=pl.Int64)
    return seen.select("ts_host", "vcpu", cpu=cpu).sort("ts_host")


def pair_sync(seen: pl.DataFrame, fit: ClockFit, lines: pl.DataFrame) -> pl.DataFrame:
    """Each sync line (SYNC_SCHEMA) beside the one logged sync marker on its CPU that `fit`
    puts within SYNC_MATCH_NS of its [t0, t1]; lines with none or several, and markers
    two lines claim, are left out. Columns: ts_host, vcpu, t0, t1, source."""
    predicted = seen.select(trace=fit.apply(pl.col("ts_host")))["trace"].to_numpy()
    order = np.argsort(predicted, kind="stable")
    times = predicted[order]
    cpus = seen["cpu"].to_numpy()[order]
    claims: dict[int, list[int]] = {}
    for index, (cpu, t0, t1) in enumerate(lines.select("cpu", "t0", "t1").iter_rows()):
        low = np.searchsorted(times, t0 - SYNC_MATCH_NS, side="left")
        high = np.searchsorted(times, t1 + SYNC_MATCH_NS, side="right")
        # A line whose thread moved across the marker (cpu -1) matches on time alone.
        near = [k for k in range(low, high) if cpu < 0 or cpus[k] == cpu]
        if len(near) == 1:
            claims.setdefault(near[0], []).append(index)
    pairs = [(int(order[k]), owners[0]) for k, owners in claims.items() if len(owners) == 1]
    markers = seen.select(pl.col("ts_host", "vcpu").gather([marker for marker, _ in pairs]))
    printed = lines.select(pl.col("t0", "t1", "source").gather([line for _, line in pairs]))
    return pl.concat([markers, printed], how="horizontal").sort("ts_host")


def fit_clock(paired: pl.DataFrame, synced: pl.DataFrame | None = None) -> ClockFit:
    """The gtmark fit (fit_line) refitted with the paired sync markers too, if any."""
    first = fit_line(paired)
    if synced is None or synced.height == 0:
        return first
    points = pl.concat([paired.select("ts_host", "t0", "t1"), synced.select("ts_host", "t0", "t1")])
    final = fit_line(points.sort("ts_host"))
    return ClockFit(
        host0=final.host0,
        offset=final.offset,
        slope=final.slope,
        markers=final.markers,
        max_residual_ns=final.max_residual_ns,
        max_outside_ns=final.max_outside_ns,
        tight_markers=final.tight_markers,
        heldout=first.heldout,
        half_bracket_ns=final.half_bracket_ns,
    )


def sync_check(
    first: ClockFit, final: ClockFit, synced: pl.DataFrame, lines: int, logged: int
) -> SyncCheck:
    """How far the gtmark-only fit and the final fit are from the paired sync markers."""
    if synced.height == 0:
        return SyncCheck(lines, 0, logged, 0.0, 0.0)
    t0, t1 = synced["t0"].to_numpy(), synced["t1"].to_numpy()
    mid = (t0 + t1) / 2
    tight = (t1 - t0) <= TIGHT_BRACKET_NS
    chosen = tight if tight.any() else np.ones_like(tight)

    def at(fit: ClockFit) -> np.ndarray:
        """The markers' trace times by `fit`."""
        return synced.select(t=fit.apply(pl.col("ts_host")))["t"].to_numpy()

    seen = at(first)
    outside = np.maximum(np.maximum(t0 - seen, seen - t1), 0)
    return SyncCheck(
        lines,
        synced.height,
        logged,
        float(np.max(np.abs(seen - mid)[chosen])),
        float(np.max(np.abs(at(final) - mid)[chosen])),
        int(tight.sum()),
        float(np.max(outside)),
    )


def fit_line(paired: pl.DataFrame) -> ClockFit:
    """Weighted least-squares line from the plugin's host time to the midpoint of [t0, t1].

    A marker's bracket is its uncertainty: the first marker of a fresh gtmark process can
    take milliseconds between t0 and t1 (page faults, translation), the rest a few
    hundred ns. Weights 1/half-width (at least 0.5 us) keep the wide ones from pulling
    the line; the residual is reported over the tight markers (bracket <= 20 us), and
    the distance outside the bracket over all of them.
    """
    if paired.height < 2:
        raise TracekitError("fewer than 2 clock markers: cannot fit the host clock to the trace's")
    host = paired["ts_host"].to_numpy().astype(np.int64)
    host0 = int(host[0])
    x = (host - host0).astype(np.float64)
    t0 = paired["t0"].to_numpy().astype(np.float64)
    t1 = paired["t1"].to_numpy().astype(np.float64)
    mid = (t0 + t1) / 2
    half = np.maximum((t1 - t0) / 2, 500.0)
    slope, offset = np.polyfit(x, mid, 1, w=1 / half)
    fitted = offset + slope * x
    outside = np.maximum(np.maximum(t0 - fitted, fitted - t1), 0)
    tight = (t1 - t0) <= TIGHT_BRACKET_NS
    residual = np.abs(fitted - mid)[tight] if tight.any() else np.abs(fitted - mid)
    halves = ((t1 - t0) / 2)[tight] if tight.any() else (t1 - t0) / 2
    return ClockFit(
        host0=host0,
        offset=float(offset),
        slope=float(slope),
        markers=paired.height,
        max_residual_ns=float(np.max(residual)),
        max_outside_ns=float(np.max(outside)),
        tight_markers=int(tight.sum()),
        heldout=held_out(paired),
        half_bracket_ns=float(np.max(halves)),
    )


def held_out(paired: pl.DataFrame) -> HeldOut | None:
    """Fit the offset on round 0's markers (slope 1: one cluster of markers cannot give a
    slope), and measure it at the later rounds' markers; None with one round."""
    if "round" not in paired.columns or paired["round"].n_unique() < 2:
        return None
    host = paired["ts_host"].to_numpy().astype(np.float64)
    t0 = paired["t0"].to_numpy().astype(np.float64)
    t1 = paired["t1"].to_numpy().astype(np.float64)
    mid, half = (t0 + t1) / 2, np.maximum((t1 - t0) / 2, 500.0)
    first = paired["round"].to_numpy() == paired["round"].min()
    offset = np.average((mid - host)[first], weights=1 / half[first])
    later = ~first
    predicted = host[later] + offset
    tight = ((t1 - t0) <= TIGHT_BRACKET_NS)[later]
    error = np.abs(predicted - mid[later])
    outside = np.maximum(np.maximum(t0[later] - predicted, predicted - t1[later]), 0)
    return HeldOut(
        fitted=int(first.sum()),
        left_out=int(later.sum()),
        max_error_ns=float(np.max(error[tight] if tight.any() else error)),
        max_outside_ns=float(np.max(outside)),
    )


def host_vhe(dmesg: str, vhe: bool | None = None) -> bool:
    """Whether the host kernel ran at EL2 with E2H (VHE): from the boot log, else `vhe`.

    Not KVM's mode line: the kernel runs with VHE whenever the CPU has it and boot did not
    force nVHE, whether KVM initialised or not. The log decides when it starts at boot and
    has the boot CPU's feature lines; an explicit `vhe` contradicting it is refused.
    """
    complete = BOOTING_LINUX.search(dmesg) is not None and _FEATURE_LINE in dmesg
    from_log = True if VHE_LINE in dmesg else False if complete else None
    if vhe is not None and from_log is not None and vhe != from_log:
        raise TracekitError(
            f"VHE given as {vhe} but the boot log says {from_log} ('{VHE_LINE}' "
            f"{'present' if from_log else 'absent'}): is it this boot's log?"
        )
    decided = from_log if vhe is None else vhe
    if decided is None:
        raise TracekitError(
            "the boot log has no 'Booting Linux' and 'CPU features: detected' lines, so it "
            "cannot say whether the host kernel ran with VHE: give this boot's whole dmesg, "
            "or say vhe=True/False"
        )
    return decided


def symbol_function() -> pl.Expr:
    """The function of a row's symbol (its name before '+offset'; '' where none)."""
    return pl.col("symbol").fill_null("").str.split("+").list.first()


def effective(frame: pl.DataFrame, vhe: bool) -> pl.DataFrame:
    """Add regime and effective_shareability: what the instruction acted on, by context.

    regime: a TLBI's translation regime. EL2-form (op1=4) *E1 operations act on EL1&0
    (every VMID's or the current VMID's stage 1+2), *E2 on EL2 (EL2&0 in VHE); EL1-form
    ones act on EL1&0, except in a VHE host kernel, where E2H+TGE send them to EL2&0
    (not in KVM's VHE TLB helpers, which clear TGE and load the guest's VMID first).
    effective_shareability: a guest runs with KVM's HCR_EL2.FB and BSU=IS
    (HCR_GUEST_FLAGS, arch/arm64/include/asm/kvm_arm.h), so its local TLBI/IC are
    broadcast inner-shareable and its non-shareable DSB is upgraded to ISH. Both columns
    rest on `where`: they are as certain as where_certain.
    """
    op = pl.col("operation")
    tlbi = pl.col("kind").is_in(["tlbi", "tlbi-nxs"])
    e2 = op.str.contains(r"E2(IS|OS)?(nXS)?$")
    regime = (
        pl.when(~tlbi)
        .then(None)
        .when(pl.col("el_form") == "EL3")
        .then(pl.lit("EL3"))
        .when((pl.col("el_form") == "EL2") & e2)
        .then(pl.lit("EL2&0" if vhe else "EL2"))
        .when(
            (pl.col("el_form") == "EL1")
            & (pl.col("where") == "kernel")
            & vhe
            & ~symbol_function().is_in(VHE_GUEST_CONTEXT)
        )
        .then(pl.lit("EL2&0"))
        .otherwise(pl.lit("EL1&0"))
    )
    upgraded = (pl.col("where") == "guest") & (pl.col("shareability") == "non-shareable")
    share = (
        pl.when(upgraded & pl.col("kind").is_in(["tlbi", "tlbi-nxs", "ic", "dsb", "dsb-nxs"]))
        .then(pl.lit("inner"))
        .otherwise(pl.col("shareability"))
    )
    return frame.with_columns(regime=regime, effective_shareability=share)


def ground_truth_table(
    records: pl.DataFrame,
    layout: KernelLayout,
    gtmark: pl.DataFrame,
    dmesg: str,
    vcpus: int,
    vhe: bool,
    sync: pl.DataFrame | None = None,
) -> tuple[pl.DataFrame, ClockFit, dict[int, int]]:
    """Every record with ts on the trace clock, Linux cpu, where and regime; the fit; the map.

    `vhe`: whether the host kernel ran with VHE (host_vhe decides it from the boot log).
    `sync`: the VMM's and the probe's sync lines (SYNC_SCHEMA), paired with the logged
    sync markers under the gtmark fit and then fitted with gtmark's.
    """
    mapping = vcpu_to_cpu(vcpus, mpidrs_from_dmesg(dmesg))
    paired = pair_markers(records, gtmark)
    wrong = check_cpu_map(paired, mapping)
    if wrong:
        raise TracekitError(
            f"{len(wrong)} markers ran on another CPU than gtmark was pinned to (first seq "
            f"{wrong[0]}): the vCPU -> CPU mapping from dmesg does not hold"
        )
    fit = fit_clock(paired)
    if sync is not None and sync.height:  # no line at all: a VMM and probe without them
        logged = sync_markers(records, mapping)
        synced = pair_sync(logged, fit, sync)
        final = fit_clock(paired, synced)
        check = sync_check(fit, final, synced, sync.height, logged.height)
        fit = dataclasses.replace(final, sync=check)
    located = locate(records, layout)
    table = effective(located, vhe).with_columns(
        ts=fit.apply(pl.col("ts_host")),
        cpu=pl.col("vcpu").replace_strict(mapping, return_dtype=pl.Int32),
    )
    return table.select(COLUMNS), fit, mapping


COLUMNS = [
    "ts",
    "ts_host",
    "cpu",
    "vcpu",
    "operation",
    "kind",
    "el_form",
    "regime",
    "scope",
    "shareability",
    "effective_shareability",
    "range",
    "where",
    "where_certain",
    "symbol",
    "vaddr",
    "insn",
]
