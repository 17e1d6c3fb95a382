"""The emulated ground truth's invalidations: counted, and set against what KVM should run.

The one owner of these facts (report/ and perfetto/ draw them). Input: the ground-truth
table (tracekit.ingest.groundtruth; with run_id and phase when given to a bundle's
runs) and the steps of a run: each VM's create, run and teardown windows from the VMM's
output, each after-guest action's run window. The expected signatures are data
(gtsignatures.toml, parsed by tracekit.analysis.gtsignatures); a step whose watched
invalidations differ from its signature is a finding. VMIDs are never read (QEMU 7.2's
plugin API reads no registers): tracekit.analysis.gtvmid attributes them from the host
trace, and the summary counts them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analysis import gtrepeat, gtvmid
from tracekit.analysis.conditions import Unknown
from tracekit.analysis.gtsignatures import Expect, Signature, Signatures
from tracekit.cpus import format_cpu_list as format_cpus

INVALIDATION_KINDS = ("tlbi", "tlbi-nxs", "ic")
HYP_PREFIX = "__kvm_nvhe_"
VM_STEPS = ("create", "run", "teardown")
COUNT_KEYS = ("cpu", "operation", "function", "where", "regime", "reach")
STEP_SCHEMA = {
    "run_id": pl.String,
    "vm": pl.Int64,
    "step": pl.String,
    "start": pl.Int64,
    "end": pl.Int64,
    "vcpus": pl.Int64,  # the VM's vCPUs (null for an action step, or not recorded)
    "backing": pl.String,  # the VMM's guest RAM backing (null: action step, not recorded)
}


# The per-phase counts' reach of the workaround's repeat TLBIs (broadcast too, but not
# the kernel's own request: counted apart so no broadcast count mixes them in).
REPEAT_REACH = "broadcast (REPEAT_TLBI)"


def invalidations(table: pl.DataFrame) -> pl.DataFrame:
    """The executed TLBI and IC IALLU(IS) rows, with function (the kallsyms name without
    its offset and nVHE prefix), reach (broadcast when the effective shareability is
    inner, outer or full-system, else local) and instruction (the operation, with the
    REPEAT_TLBI workaround's TLBIs labelled apart: gtrepeat.instruction)."""
    function = pl.col("symbol").str.split("+").list.first()
    return table.filter(pl.col("kind").is_in(INVALIDATION_KINDS)).with_columns(
        instruction=gtrepeat.instruction(),
        function=pl.when(pl.col("where") == "hyp")
        .then(function.str.strip_prefix(HYP_PREFIX))
        .otherwise(function),
        reach=pl.when(pl.col("effective_shareability") == "non-shareable")
        .then(pl.lit("local"))
        .otherwise(pl.lit("broadcast")),
    )


def by_instruction(table: pl.DataFrame) -> pl.DataFrame:
    """invalidations() with operation as tables count and signatures name it: the
    REPEAT_TLBI workaround's TLBIs apart from the rest (the instruction column)."""
    return invalidations(table).with_columns(operation=pl.col("instruction"))


def counted_reach() -> pl.Expr:
    """reach, with the REPEAT_TLBI workaround's repeats as REPEAT_REACH: a per-CPU
    broadcast count then holds the kernel's own TLBIs only (A55/A76 repeat, A53 not)."""
    return pl.when(gtrepeat.is_repeat_label()).then(pl.lit(REPEAT_REACH)).otherwise(pl.col("reach"))


def counts(rows: pl.DataFrame, by: Iterable[str]) -> pl.DataFrame:
    """How many invalidations per group of `by` (e.g. run_id, phase, cpu, operation)."""
    keys = list(by)
    return rows.group_by(keys).agg(pl.len().alias("count")).sort(keys, nulls_last=True)


def vm_steps(vms: pl.DataFrame, run_id: str) -> pl.DataFrame:
    """Each VM's create, run and teardown windows (STEP_SCHEMA) from the VMM's `vm` rows
    (tracekit.ingest.vmm; its clock is the trace's). A missing time leaves the step out."""
    rows = []
    for index, vm in enumerate(vms.iter_rows(named=True)):
        create, run = vm["create_start_ns"], vm["create_ns"]
        created = create + run if create is not None and run is not None else None
        windows = {
            "create": (create, created),
            "run": (created, created + vm["run_ns"] if created and vm["run_ns"] else None),
            "teardown": (
                vm["teardown_end_ns"] - vm["teardown_ns"] if vm["teardown_ns"] else None,
                vm["teardown_end_ns"],
            ),
        }
        for step, (start, end) in windows.items():
            if start is not None and end is not None:
                rows.append((run_id, index, step, start, end, vm.get("vcpus"), vm.get("backing")))
    return pl.DataFrame(rows, schema=STEP_SCHEMA, orient="row")


def action_step(run_id: str, action: str, start: int, end: int) -> pl.DataFrame:
    """An after-guest action's run window as one step (vm null)."""
    return pl.DataFrame(
        [(run_id, None, action, start, end, None, None)], schema=STEP_SCHEMA, orient="row"
    )


def in_step(rows: pl.DataFrame, step: dict[str, object]) -> pl.DataFrame:
    """The rows inside one step's [start, end]."""
    return rows.filter(pl.col("ts").is_between(step["start"], step["end"]))


def watched(rows: pl.DataFrame, watch: str, host_functions: tuple[str, ...]) -> pl.DataFrame:
    """The rows a signature watches: the hyp text, or it and the host's KVM functions."""
    hyp = pl.col("where") == "hyp"
    if watch == "kvm":
        hyp = hyp | pl.col("function").is_in(host_functions)
    return rows.filter(hyp)


@dataclass(frozen=True)
class StepContext:
    """What a signature's CPU roles mean in one run: online CPUs, guest CPUs, targets."""

    online: tuple[int, ...]
    guest: tuple[int, ...]
    target: tuple[int, ...] = ()


def _expected(expect: Expect, context: StepContext) -> list[tuple[int | None, int]]:
    """(cpu or None for 'any', count) pairs an expectation stands for."""
    cpus = {"online": context.online, "guest": context.guest, "target": context.target}
    if expect.cpus == "any":
        return [(None, expect.count)]
    return [(cpu, expect.count) for cpu in cpus[expect.cpus]]


CHECK_SCHEMA = {
    "run_id": pl.String,
    "vm": pl.Int64,
    "step": pl.String,
    "operation": pl.String,
    "function": pl.String,
    "cpu": pl.Int64,
    "expected": pl.Int64,
    "seen": pl.Int64,
    "ok": pl.Boolean,
}


def check_step(
    rows: pl.DataFrame,
    step: dict[str, object],
    signature: Signature,
    context: StepContext,
    host_functions: tuple[str, ...],
) -> pl.DataFrame:
    """Expected against seen for one step (CHECK_SCHEMA): one row per expected (operation,
    function, cpu), and, for an exact signature, one per unexpected watched group."""
    seen = counts(
        watched(in_step(rows, step), signature.watch, host_functions),
        ("operation", "function", "cpu"),
    )
    index = {
        (r["operation"], r["function"], r["cpu"]): r["count"] for r in seen.iter_rows(named=True)
    }
    out = []
    claimed: set[tuple[str, str, int]] = set()
    for expect in signature.expect:
        for cpu, count in _expected(expect, context):
            keys = [k for k in index if k[:2] == (expect.operation, expect.function)]
            mine = [k for k in keys if cpu is None or k[2] == cpu]
            claimed.update(mine)
            got = sum(index[k] for k in mine)
            out.append((expect.operation, expect.function, cpu, count, got))
    if signature.exact:
        for key, count in index.items():
            if key not in claimed:
                out.append((key[0], key[1], key[2], 0, count))
    head = (step["run_id"], step["vm"], step["step"])
    return pl.DataFrame(
        [(*head, *row, row[3] == row[4]) for row in out], schema=CHECK_SCHEMA, orient="row"
    )


def check_steps(
    rows: pl.DataFrame,
    steps: pl.DataFrame,
    signatures: Signatures,
    series: str,
    kvm_mode: str,
    cpu_model: str,
    context: StepContext,
    facts: dict[str, str] | None = None,
) -> tuple[pl.DataFrame, list[str]]:
    """Every step with a signature checked (CHECK_SCHEMA rows), and the steps no signature
    covers for this kernel series, KVM mode and CPU model, or whose bundle is outside the
    signature's conditions (`facts`: the bundle's condition fields; named, never
    silently passed, never a contradiction)."""
    frames = [pl.DataFrame(schema=CHECK_SCHEMA)]
    uncovered: set[str] = set()
    setup = (series, kvm_mode, cpu_model)
    owned = _action_owned(steps, signatures, setup, facts or {})
    by_run = answerable(rows, steps, owned)
    for step in steps.iter_rows(named=True):
        signature, outside = choose(signatures, setup, step, facts or {})
        if signature is None:
            uncovered.add(f"{step['step']} ({outside})" if outside else step["step"])
            continue
        unknown = [e.cpus for e in signature.expect if not _expected(e, context)]
        if unknown:
            uncovered.add(f"{step['step']} (the bundle does not say its {unknown[0]} CPUs)")
            continue
        mine = by_run[(step["run_id"], step["step"] not in VM_STEPS)]
        frames.append(check_step(mine, step, signature, context, signatures.host_functions))
    return pl.concat(frames), sorted(uncovered)


def choose(
    signatures: Signatures,
    setup: tuple[str, str, str],
    step: dict[str, object],
    facts: dict[str, str],
) -> tuple[Signature | None, str | None]:
    """The first signature of the step whose conditions the step and bundle meet, or
    None and why the first one is not met (None: no signature at all)."""
    found = signatures.candidates(*setup, str(step["step"]))
    reasons = [unmet(s, step, facts) for s in found]
    for signature, reason in zip(found, reasons, strict=True):
        if reason is None:
            return signature, None
    return None, reasons[0] if reasons else None


def unmet(signature: Signature, step: dict[str, object], facts: dict[str, str]) -> str | None:
    """Why a step is outside its signature's conditions (`requires`), or None: a step's
    own field (its VM's vcpus and backing, from the VMM) first, else the bundle's; an
    unrecorded one is not met either."""
    for name, allowed in signature.requires:
        value = step.get(name)
        value = facts.get(name) if value is None else value
        if value is None or isinstance(value, Unknown):
            return f"condition not checked: the bundle does not record its {name}"
        if str(value) not in allowed:
            return (
                f"condition not met: {name} {value}, the signature holds for {' or '.join(allowed)}"
            )
    return None


def answerable(
    rows: pl.DataFrame, steps: pl.DataFrame, owned: dict[str, list[str]]
) -> dict[tuple[str, bool], pl.DataFrame]:
    """Per (run_id, is an action step), the rows such a step is answerable for (before
    its window is applied). An action's run may create and run VMs (a rollover's): what
    runs inside their steps is theirs, except the invalidations of the functions the
    action's own signature expects (`owned`: its __kvm_flush_vm_context runs inside some
    VM's run step), which are the action's."""
    out = {}
    for run_id in steps["run_id"].unique().to_list():
        mine = rows.filter(pl.col("run_id") == run_id) if "run_id" in rows.columns else rows
        is_owned = pl.col("function").is_in(owned.get(run_id, []))
        out[(run_id, False)] = mine.filter(~is_owned)
        vm = steps.filter(pl.col("run_id") == run_id, pl.col("step").is_in(VM_STEPS))
        inside = pl.Series(_inside(mine["ts"].to_numpy(), vm))
        out[(run_id, True)] = mine.filter(is_owned | ~inside)
    return out


def _inside(ts: np.ndarray, steps: pl.DataFrame) -> np.ndarray:
    """Whether each ts is inside one of the steps (a run's VM steps do not overlap)."""
    ordered = steps.sort("start")
    starts, ends = ordered["start"].to_numpy(), ordered["end"].to_numpy()
    index = np.searchsorted(starts, ts, side="right") - 1
    found = index >= 0
    return found & (ts <= ends[np.maximum(index, 0)]) if len(starts) else np.zeros(len(ts), bool)


def _action_owned(
    steps: pl.DataFrame,
    signatures: Signatures,
    setup: tuple[str, str, str],
    facts: dict[str, str] | None = None,
) -> dict[str, list[str]]:
    """Per run, the functions its after-guest action owns: every invalidation of a
    function its signature expects, not only the expected operations (a rollover's
    __kvm_flush_vm_context also runs the REPEAT_TLBI erratum's VALE2IS)."""
    owned: dict[str, list[str]] = {}
    for step in steps.filter(~pl.col("step").is_in(VM_STEPS)).iter_rows(named=True):
        signature, _ = choose(signatures, setup, step, facts or {})
        # Outside every candidate's conditions the action still runs its flushes: they
        # stay its own (unchecked), never a contradiction of the VM step they fall in.
        found = [signature] if signature else signatures.candidates(*setup, step["step"])
        functions = {e.function for s in found for e in s.expect}
        if functions:
            owned.setdefault(step["run_id"], []).extend(sorted(functions))
    return owned


def checks_per_step_kind(checked: pl.DataFrame) -> pl.DataFrame:
    """Expected against executed per (run, step kind, operation, function, CPU, expected,
    ok), summed over the step's instances: steps, seen_total (the report's table)."""
    keys = ["run_id", "step", "operation", "function", "cpu", "expected", "ok"]
    return (
        checked.group_by(keys)
        .agg(pl.len().alias("steps"), pl.col("seen").sum().alias("seen_total"))
        .sort("run_id", "step", "operation", "cpu", nulls_last=True)
    )


def signature_model(cpus: list[dict[str, object]], guest: tuple[int, ...]) -> str:
    """The core model signatures are looked up by: the guest CPU's (big.LITTLE hosts
    differ per CPU; review of 15/17 #15), else the first CPU's; lower case."""
    by_cpu = {c.get("cpu"): c for c in cpus}
    chosen = by_cpu.get(guest[0]) if guest else None
    first = cpus[0] if cpus else {}
    return str((chosen or first).get("name", "?")).lower()


def findings(checked: pl.DataFrame, series: str, kvm_mode: str) -> list[str]:
    """One sentence per (run, step, operation, function, expected, executed) that differs
    from its signature, naming the CPUs and how many of the step's instances differ."""
    bad = checked.filter(~pl.col("ok"))
    if bad.is_empty():
        return []
    keys = ["run_id", "step", "operation", "function", "expected", "seen"]
    grouped = (
        bad.group_by(keys)
        .agg(pl.col("cpu").unique().sort(), pl.col("vm").n_unique().alias("instances"))
        .sort(keys, nulls_last=True)
    )
    lines = []
    for g in grouped.iter_rows(named=True):
        cpus = [c for c in g["cpu"] if c is not None]
        where = f"CPU {format_cpus(cpus)}" if cpus else "any CPU"
        lines.append(
            f"ground truth contradicts the {series} {kvm_mode} signature: {g['run_id']} "
            f"{g['step']}: {g['operation']} ({g['function']}) on {where}: expected "
            f"{g['expected']}, executed {g['seen']} (in {g['instances']} {g['step']} step(s))"
        )
    return lines


PROBE_SCHEMA = {
    "probe": pl.String,
    "path": pl.String,
    "fired": pl.Int64,
    "calls_closed": pl.Int64,  # entry-to-return windows (a return probe recorded)
    "inside": pl.Int64,  # the path's invalidations inside those windows, same CPU
    "not_attributable": pl.Int64,  # the path's invalidations outside every window
    # Hits the entry kprobe and returns its kretprobe missed (kprobe_profile), summed over
    # the traced runs; null where a run did not record them.
    "entries_missed": pl.Int64,
    "returns_missed": pl.Int64,
    "verdict": pl.String,
}
# A probe's calls: the CPU each started on and its entry and return times (CALL_SCHEMA's
# cpu, start_ts, end_ts; end_ts null without a return).
WINDOW_COLUMNS = ("cpu", "start_ts", "end_ts")


def probe_checks(
    rows: pl.DataFrame,
    probes: dict[str, int],
    paths: dict[str, tuple[str, ...]],
    calls: dict[str, pl.DataFrame] | None = None,
    misses: dict[str, tuple[int | None, int | None]] | None = None,
) -> pl.DataFrame:
    """For each placed kprobe named after a path (`paths`: probe -> functions): its hits
    (`probes`) against the path's invalidations, counted for the probe only inside one of
    its calls' entry-to-return windows on the same CPU (`calls`: probe -> WINDOW_COLUMNS).
    An EL2 call is a synchronous HVC on the calling CPU, so that is where its flushes run;
    one outside every window is someone else's (not attributable), never the probe's.
    `misses`: probe -> (entries, returns) its probes missed (calls.misses_over_runs)."""
    out = []
    for probe, hits in sorted(probes.items()):
        functions = paths.get(probe)
        if functions is None:
            continue
        path = rows.filter(pl.col("function").is_in(functions))
        windows = _closed((calls or {}).get(probe))
        inside = int(_in_windows(path, windows).sum())
        own = path.filter(pl.col("function") == probe).height
        missed = (misses or {}).get(probe, (None, None))
        counts = (hits, windows.height, inside, path.height - inside)
        verdict = _probe_verdict(*counts, own, missed)
        out.append((probe, ", ".join(functions), *counts, *missed, verdict))
    return pl.DataFrame(out, schema=PROBE_SCHEMA, orient="row")


def _closed(calls: pl.DataFrame | None) -> pl.DataFrame:
    """The calls with a return, as cpu, start_ts, end_ts."""
    if calls is None:
        return pl.DataFrame(schema={"cpu": pl.Int64, "start_ts": pl.Int64, "end_ts": pl.Int64})
    found = calls.select(*WINDOW_COLUMNS).filter(pl.col("end_ts").is_not_null())
    return found.cast({"cpu": pl.Int64, "start_ts": pl.Int64, "end_ts": pl.Int64})


def _in_windows(rows: pl.DataFrame, windows: pl.DataFrame) -> np.ndarray:
    """Whether each row's ts is inside a window of its own CPU (windows of one CPU nest
    or follow one another, so the latest start before ts is the one to test)."""
    found = np.zeros(rows.height, bool)
    if windows.is_empty() or rows.is_empty():
        return found
    cpus, ts = rows["cpu"].to_numpy(), rows["ts"].to_numpy()
    for cpu in np.unique(cpus):
        mine = windows.filter(pl.col("cpu") == int(cpu))
        at = cpus == cpu
        if mine.height:
            found[at] = _inside(ts[at], mine.rename({"start_ts": "start", "end_ts": "end"}))
    return found


def _probe_verdict(
    hits: int,
    closed: int,
    inside: int,
    outside: int,
    own: int,
    missed: tuple[int | None, int | None] = (None, None),
) -> str:
    """What a probe's hits and windows mean beside the path's executed invalidations."""
    returns_missed = missed[1]
    if hits == 0:
        return _unrecorded_verdict(outside, own, missed)
    if not closed:
        return (
            "fired, with no return recorded: the path's invalidations cannot be attributed "
            f"to its calls{_missed_returns(hits, returns_missed)}"
        )
    if inside:
        said = f"fired, and its calls executed {inside} invalidation(s) of its path"
    else:
        said = "fired, no invalidation of its path inside its calls"
    if outside and hits > closed and returns_missed:
        said += (
            f"; the {outside} outside them may be inside a call whose return was missed"
            f"{_missed_returns(hits - closed, returns_missed)}"
        )
    return said


def _unrecorded_verdict(outside: int, own: int, missed: tuple[int | None, int | None]) -> str:
    """A probe with no hit recorded: a hit or return its probes missed (kprobe_profile)
    still means the function ran; only without any is it "never fired"."""
    entries_missed, returns_missed = missed
    if entries_missed or returns_missed:
        return (
            f"fired, though no hit was recorded: its probes missed {entries_missed or 0} "
            f"hit(s) and {returns_missed or 0} return(s) (kprobe_profile), so its path's "
            "invalidations cannot be attributed to its calls"
        )
    if own:
        return "blind: its own function executed invalidations, the probe never fired"
    if outside:
        return (
            f"never fired; {outside} invalidation(s) of its path ran outside any call of "
            "it (not attributable to it)"
        )
    return "never fired, its path executed none"


def _missed_returns(unclosed: int, returns_missed: int | None) -> str:
    """' (up to N of its calls without a return were missed by its kretprobe)', or ''."""
    if not returns_missed:
        return ""
    return (
        f" (up to {min(unclosed, returns_missed)} of its {unclosed} call(s) without a return"
        " were missed by its kretprobe, kprobe_profile)"
    )


def entry_probes(definitions: Iterable[str]) -> list[str]:
    """The functions of the entry kprobes in a bundle's definition lines
    ('p:tracekit/NAME SYMBOL ...'; return probes and uprobes left out)."""
    found = []
    for line in definitions:
        head, _, rest = line.partition(" ")
        if head.startswith("p:") and rest:
            found.append(rest.split()[0].split("+")[0])
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class GroundTruthSummary:
    """What one bundle's ground truth says: counts, the steps checked, findings, probes."""

    by_phase: pl.DataFrame  # phase, run_id, cpu, where, reach (REPEAT_REACH apart), count
    by_instruction: pl.DataFrame  # where, regime, reach, operation, function, count
    by_step: pl.DataFrame  # run_id, step, cpu, operation, function, where, steps, count
    checks: pl.DataFrame  # CHECK_SCHEMA
    findings: list[str]
    uncovered: list[str]  # steps no signature covers here
    probes: pl.DataFrame  # PROBE_SCHEMA
    signature_lines: list[str]
    # EL2 invalidations per run, function, operation, VMID and basis (gtvmid.vmid_counts):
    # the VMID attributed from the host trace, never read.
    vmids: pl.DataFrame | None = None
    # The EL2 invalidations themselves with vmid, vmid_basis and vmid_how (gtvmid).
    vmid_rows: pl.DataFrame | None = None
    # The REPEAT_TLBI workaround's check over the rows (gtrepeat.completion_line; None:
    # not active or not exercised there).
    repeat_line: str | None = None


def summarise(
    given: pl.DataFrame,
    steps: pl.DataFrame,
    signatures: Signatures,
    setup: tuple[str, str, str],
    context: StepContext,
    probe_hits: dict[str, int],
    traced_runs: Iterable[str],
    probe_calls: dict[str, pl.DataFrame] | None = None,
    facts: dict[str, str] | None = None,
    vmid_inputs: gtvmid.VmidInputs | None = None,
    probe_misses: dict[str, tuple[int | None, int | None]] | None = None,
) -> GroundTruthSummary:
    """A bundle's ground truth (rows given to its runs) against its steps and signatures.

    `setup`: the kernel series, KVM mode and CPU model the signatures are looked up by;
    `probe_calls`: each probe's calls in the traced runs (probe_checks); `facts`: the
    bundle's condition fields a signature's `requires` names (unmet); `vmid_inputs`: the
    traced runs' vCPU spans and VMID readings the EL2 invalidations' VMIDs come from;
    `probe_misses`: each probe's misses over the traced runs (calls.misses_over_runs).
    """
    series, mode, model = setup
    # Counted and checked by instruction: the workaround's repeats apart from the rest
    # (a signature names them by that label too).
    rows = with_action_phase(by_instruction(given), steps)
    attributed = attributed_vmids(rows, steps, vmid_inputs or gtvmid.VmidInputs(), mode)
    checked, uncovered = check_steps(rows, steps, signatures, series, mode, model, context, facts)
    traced = rows.filter(pl.col("run_id").is_in(list(traced_runs)))
    repeats = rows.filter(gtrepeat.is_repeat_label()).height
    done = gtrepeat.completions(given)
    placed = {p: probe_hits.get(p, 0) for p in probe_hits}
    lines = []
    for step in steps.unique("step", keep="first").sort("step").iter_rows(named=True):
        chosen, _ = choose(signatures, setup, step, facts or {})
        if chosen is not None:
            lines.append(f"{series} {mode} {chosen.summary()} [{chosen.when}]")
    return GroundTruthSummary(
        by_phase=counts(
            rows.with_columns(reach=counted_reach()), ("phase", "run_id", "cpu", "where", "reach")
        ),
        by_instruction=counts(rows, ("where", "regime", "reach", "operation", "function")),
        by_step=step_counts(rows, steps, _action_owned(steps, signatures, setup, facts)),
        checks=checked,
        findings=findings(checked, series, mode) + _missing(done),
        uncovered=uncovered,
        probes=probe_checks(traced, placed, signatures.probe_paths, probe_calls, probe_misses),
        signature_lines=lines,
        vmids=gtvmid.vmid_counts(attributed),
        vmid_rows=attributed,
        repeat_line=gtrepeat.completion_line(done, repeats),
    )


def _missing(done: pl.DataFrame) -> list[str]:
    """The REPEAT_TLBI contradiction, if any (gtrepeat.missing_line), as a finding."""
    line = gtrepeat.missing_line(done)
    return [] if line is None else [line]


def attributed_vmids(
    rows: pl.DataFrame, steps: pl.DataFrame, inputs: gtvmid.VmidInputs, kvm_mode: str
) -> pl.DataFrame:
    """The EL2 invalidations with their attributed VMID (gtvmid)."""
    return gtvmid.attribute_vmids(
        rows,
        inputs.spans,
        inputs.readings,
        steps,
        inputs.vmid_bits,
        kvm_mode,
        inputs.margin_ns,
        inputs.unmarked,
        inputs.requests,
    )


def with_action_phase(rows: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Rows of an after-guest action's run get the phase 'after-guest ACTION' (the
    collector runs it in the guest phase), so counts per phase keep it apart."""
    actions = steps.filter(~pl.col("step").is_in(VM_STEPS)).select("run_id", "step").unique()
    named = dict(zip(actions["run_id"].to_list(), actions["step"].to_list(), strict=True))
    action = pl.col("run_id").replace_strict(named, default=None, return_dtype=pl.String)
    return rows.with_columns(
        phase=pl.when(action.is_not_null())
        .then(pl.concat_str(pl.lit("after-guest "), action))
        .otherwise(pl.col("phase"))
    )


def step_counts(
    rows: pl.DataFrame, steps: pl.DataFrame, owned: dict[str, list[str]] | None = None
) -> pl.DataFrame:
    """Invalidations inside each kind of step, summed over its instances: run_id, step,
    cpu, operation, function, where, steps (instances of the step), count. Each row is
    the step's that answerable gives it to (an action's own VMs keep theirs)."""
    frames = []
    by_run = answerable(rows, steps, owned or {})
    for step in steps.iter_rows(named=True):
        mine = by_run[(step["run_id"], step["step"] not in VM_STEPS)]
        inside = in_step(mine, step).select("cpu", "operation", "function", "where")
        frames.append(inside.with_columns(run_id=pl.lit(step["run_id"]), step=pl.lit(step["step"])))
    instances = steps.group_by("run_id", "step").agg(pl.len().alias("steps"))
    if not frames:
        return pl.DataFrame(
            schema={
                "run_id": pl.String,
                "step": pl.String,
                "cpu": pl.Int32,
                "operation": pl.String,
                "function": pl.String,
                "where": pl.String,
                "steps": pl.UInt32,
                "count": pl.UInt32,
            }
        )
    keys = ["run_id", "step", "cpu", "operation", "function", "where"]
    summed = counts(pl.concat(frames), keys)
    return summed.join(instances, on=["run_id", "step"]).select(*keys, "steps", "count")


def drawn(rows: pl.DataFrame, host_functions: tuple[str, ...]) -> pl.DataFrame:
    """The invalidations a timeline shows beside the ftrace data: those of the hyp text
    (EL2 in nVHE, which ftrace cannot see), of KVM's host functions, and every broadcast."""
    kvm = (pl.col("where") == "hyp") | pl.col("function").is_in(host_functions)
    return rows.filter(kvm | (pl.col("reach") == "broadcast")).sort("ts")


# The host kernel's stage-1 invalidations a probe syscall makes, by what they name: one
# page (VALE1IS/VAE1IS, and the REPEAT_TLBI erratum's extra VALE1IS per completion), a
# range of pages (FEAT_TLBIRANGE) or the whole address space (ASIDE1IS).
PROBE_TLBI_SCOPES = {"va": "by_va", "va-range": "by_range", "asid": "whole_asid"}


def probe_slot_tlbis(rows: pl.DataFrame, slots: pl.DataFrame) -> pl.DataFrame:
    """What the kernel executed on each probe slot's own CPU, per sample (one syscall).

    `rows`: invalidations() given to the bundle's runs; `slots`: run_id, cpu, mode, pages
    and count (samples) per probe slot (BundleData.probes). Returns those columns with
    by_va, by_range and whole_asid: the slot CPU's host-kernel TLBIs of each kind inside
    the slot's run, divided by its samples (the process's own setup is inside too, so
    these are upper bounds on one syscall's, by a few over the whole slot).
    """
    mine = rows.filter(pl.col("where") == "kernel", pl.col("scope").is_in(list(PROBE_TLBI_SCOPES)))
    per_slot = (
        mine.join(slots.select("run_id", "cpu"), on=["run_id", "cpu"])
        .with_columns(kind=pl.col("scope").replace_strict(PROBE_TLBI_SCOPES))
        .group_by("run_id", "kind")
        .len()
        .pivot(on="kind", index="run_id", values="len")
    )
    joined = slots.select("run_id", "cpu", "mode", "pages", "count").join(
        per_slot, on="run_id", how="left"
    )
    kinds = list(PROBE_TLBI_SCOPES.values())
    return joined.with_columns(
        (pl.col(k).fill_null(0) / pl.col("count") if k in joined.columns else pl.lit(0.0)).alias(k)
        for k in kinds
    ).select("run_id", "cpu", "mode", "pages", "count", *kinds)
