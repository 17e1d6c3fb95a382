"""A campaign plan: matrix axes, CPU placements, collect options, repeats and a seed.

The plan is a small TOML (or JSON) file. Every mistake in it is reported as one line that
names the key and what is allowed, before anything is built or booted.

    seed = 7                 # optional: drawn and recorded when absent
    repeats = 2
    [matrix]                 # each axis: a list (or one value); absent axes take the default
    kernel = ["bookworm", "trixie"]
    guest = ["mmu-on", "mmu-off"]
    [placements.default]     # rt_cpu, stress_cpus, guest_cpu
    rt_cpu = 3
    stress_cpus = "0-2"
    guest_cpu = "1"
    [collect]                # `tracekit collect` options, by their long names
    runs = 4
    [vhost]                  # the emulated host: smp, clusters, memory, timeout, append,
                             # ground_truth (every cell's boot with the TCG plugin);
                             # [matrix] simulate = ["brief-literal", "null"]: per cell
    smp = 4
    [design]                 # factors over guest knobs and options (campaign/design.py)
    kind = "full"
    [design.factors]
    mmu = ["0", "1"]
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit.campaign.design import Design, parse_design
from tracekit.campaign.lavaplan import parse_lava
from tracekit.cpus import parse_cpu_list
from tracekit.errors import TracekitError

# The matrix axes, in the order cell names use, with the value an absent axis takes.
# A guest of None lets the scenario pick its own variant.
AXES: dict[str, Any] = {
    "kernel": "bookworm",
    "kvm_mode": "nvhe",
    "cpu_model": "cortex-a76",
    "guest": None,
    "after_guest": "none",
    "placement": "default",
    "scenario": "main",
    # A simulated mechanism (docs/simulate.md) per cell: a shipped model's name or a
    # .toml path; None runs the machine as it is. Emulated host only.
    "simulate": None,
}

AFTER_GUEST_ACTIONS = (  # as host/protocol.py
    "none",
    "hotplug",
    "hotplug-other",
    "rollover",
    "rollover-minus-one",
    "tlbi:alle1@guest-cpu",
    "tlbi:vmalls12e1is@vmid",
    "tlbi:alle1@other-cpu",
)

# `tracekit collect` options a plan may set; everything else in [collect] is a mistake.
# Placement, guest, after-guest, scenario and the output come from the cell itself.
COLLECT_OPTIONS: dict[str, type] = {
    "runs": int,
    "traced_runs": int,
    "duration": int,
    "interval": int,
    "rollover_max_vms": int,
    "events": list,
    "kprobe": list,
    "perf_counters": bool,
    "buffer_kb": int,
    "allow_dirty": bool,
    "dry_run": bool,
    "function_graph": bool,
    "probe_args": str,
    # The related cases' sweeps (scenarios teardown, cache-toggle, guest-broadcast).
    "ipa_bits": str,
    "vcpus": str,
    "touch_kb": str,
    "repeat": int,
    "tlbi_count": int,
    "vm_budget": int,
    "vmid": int,  # the guest's VMID, set by throwaway VMs first (a design factor too)
}

VHOST_OPTIONS: dict[str, type] = {
    "smp": int,
    "clusters": int,
    "memory": int,
    "timeout": float,
    "append": str,
    # Every cell's boot loads the ground-truth plugin; its log goes into the cell's bundle.
    "ground_truth": bool,
}

TOP_LEVEL = (
    "seed",
    "repeats",
    "shuffle",
    "matrix",
    "placements",
    "collect",
    "vhost",
    "design",
    "lava",
)


@dataclass(frozen=True)
class Placement:
    """Where the experiment's roles run: the isolated rt CPU, the stress CPUs, the guest."""

    rt_cpu: int
    stress_cpus: str
    guest_cpu: str

    def highest_cpu(self) -> int:
        """The highest CPU number the placement uses (the host needs more CPUs than that)."""
        return max(
            [self.rt_cpu, *parse_cpu_list(self.stress_cpus), *parse_cpu_list(self.guest_cpu)]
        )


DEFAULT_PLACEMENT = Placement(rt_cpu=3, stress_cpus="0-2", guest_cpu="1")


@dataclass(frozen=True)
class Plan:
    """A validated plan: the matrix and everything each cell shares."""

    matrix: dict[str, list[Any]]
    placements: dict[str, Placement]
    collect: dict[str, Any] = field(default_factory=dict)
    vhost: dict[str, Any] = field(default_factory=dict)
    repeats: int = 1
    seed: int | None = None
    shuffle: bool = True
    source: str = ""
    design: Design | None = None
    design_table: dict[str, Any] = field(default_factory=dict)  # as written, for the record
    lava: dict[str, Any] = field(default_factory=dict)  # [lava], campaign/lavaplan.py

    def to_json(self) -> dict[str, Any]:
        """The plan as plain JSON data (recorded in campaign.json, hashed for resume)."""
        # An unused simulate axis is left out: plans written before it hash as they did.
        matrix = {k: v for k, v in self.matrix.items() if k != "simulate" or v != [None]}
        return (
            {
                "matrix": matrix,
                "placements": {name: vars(p) for name, p in self.placements.items()},
                "collect": self.collect,
                "vhost": self.vhost,
                "repeats": self.repeats,
                "seed": self.seed,
                "shuffle": self.shuffle,
            }
            | ({"design": self.design_table} if self.design_table else {})
            | ({"lava": self.lava} if self.lava else {})
        )

    def fingerprint(self) -> str:
        """A short hash of the plan's content: a state file resumes only the plan it was for."""
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_plan(path: Path) -> Plan:
    """Read and validate a plan file (.toml, or .json); one clear line on any mistake."""
    try:
        text = path.read_text()
    except OSError as err:
        raise TracekitError(f"cannot read plan {path}: {err.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as err:
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise TracekitError(f"plan {path} is not valid {kind}: {err}") from None
    return parse_plan(data, source=str(path))


def _fail(source: str, message: str) -> TracekitError:
    """A plan error naming the file it is in."""
    return TracekitError(f"plan {source}: {message}")


def _check_keys(source: str, table: str, data: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Unknown keys are mistakes (a typo would otherwise be silently ignored)."""
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        where = f"[{table}]" if table else "the top level"
        raise _fail(source, f"unknown key {unknown[0]!r} in {where}; allowed: {', '.join(allowed)}")


def _table(source: str, data: dict[str, Any], key: str) -> dict[str, Any]:
    """A sub-table of the plan, empty when absent."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise _fail(source, f"[{key}] must be a table")
    return value


def _typed(source: str, table: str, key: str, value: Any, kind: type) -> Any:
    """Check one option's type (ints may stand for floats; bools are never ints)."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _fail(source, f"[{table}] {key} must be a {kind.__name__}, not {value!r}")
    return value


def _options(source: str, data: dict[str, Any], table: str, spec: dict[str, type]) -> dict:
    """A table of typed options, checked against its allowed keys."""
    values = _table(source, data, table)
    _check_keys(source, table, values, tuple(spec))
    return {key: _typed(source, table, key, value, spec[key]) for key, value in values.items()}


def _matrix(source: str, data: dict[str, Any]) -> dict[str, list[Any]]:
    """Every axis as a non-empty list of distinct values; absent axes take the default."""
    given = _table(source, data, "matrix")
    _check_keys(source, "matrix", given, tuple(AXES))
    matrix: dict[str, list[Any]] = {}
    for axis, default in AXES.items():
        values = given.get(axis, [default])
        values = values if isinstance(values, list) else [values]
        if not values:
            raise _fail(source, f"[matrix] {axis} is empty; give at least one value")
        if len(set(map(str, values))) != len(values):
            raise _fail(source, f"[matrix] {axis} repeats a value; use `repeats` to repeat cells")
        if any(not isinstance(value, str) for value in values if value is not None):
            raise _fail(source, f"[matrix] {axis} values must be strings")
        matrix[axis] = values
    return matrix


def _placements(source: str, data: dict[str, Any]) -> dict[str, Placement]:
    """Named CPU placements; `default` exists unless the plan redefines it."""
    placements = {"default": DEFAULT_PLACEMENT}
    for name, fields in _table(source, data, "placements").items():
        if not isinstance(fields, dict):
            raise _fail(source, f"[placements.{name}] must be a table")
        _check_keys(source, f"placements.{name}", fields, ("rt_cpu", "stress_cpus", "guest_cpu"))
        missing = [key for key in ("rt_cpu", "stress_cpus", "guest_cpu") if key not in fields]
        if missing:
            raise _fail(source, f"[placements.{name}] lacks {missing[0]}")
        try:
            placement = Placement(
                int(fields["rt_cpu"]), str(fields["stress_cpus"]), str(fields["guest_cpu"])
            )
            placement.highest_cpu()
        except (TracekitError, ValueError) as err:
            raise _fail(source, f"[placements.{name}]: {err}") from None
        placements[name] = placement
    return placements


def parse_plan(data: dict[str, Any], source: str = "<plan>") -> Plan:
    """Validate plan data (already parsed from TOML or JSON) into a Plan."""
    if not isinstance(data, dict):
        raise _fail(source, "must be a table of keys")
    _check_keys(source, "", data, TOP_LEVEL)
    repeats = _typed(source, "top level", "repeats", data.get("repeats", 1), int)
    if repeats < 1:
        raise _fail(source, "repeats must be at least 1")
    seed = data.get("seed")
    if seed is not None:
        seed = _typed(source, "top level", "seed", seed, int)
    collect = _options(source, data, "collect", COLLECT_OPTIONS)
    design = _design(source, data, collect)
    plan = Plan(
        matrix=_matrix(source, data),
        placements=_placements(source, data),
        collect=collect,
        vhost=_options(source, data, "vhost", VHOST_OPTIONS),
        repeats=repeats,
        seed=seed,
        shuffle=_typed(source, "top level", "shuffle", data.get("shuffle", True), bool),
        source=source,
        design=design,
        design_table=data.get("design", {}),
        lava=parse_lava(source, data.get("lava")),
    )
    _check_values(plan)
    return plan


def _design(source: str, data: dict[str, Any], collect: dict[str, Any]) -> Design | None:
    """The [design] table, if any; a factor set in [collect] too would be two values."""
    if "design" not in data:
        return None
    design = parse_design(source, data["design"], COLLECT_OPTIONS)
    both = [f.name for f in design.factors if f.name in collect]
    both += [name for name in design.fixed if name in collect]
    if both:
        raise _fail(source, f"{both[0]} is in [design] and in [collect]; keep one of them")
    return design


def _check_models(plan: Plan) -> None:
    """Every simulate value must be a model that loads (its mistakes, one line each)."""
    from tracekit.simulate.model import load_model

    for spec in plan.matrix["simulate"]:
        if spec is not None:
            try:
                load_model(spec)
            except TracekitError as err:
                raise _fail(plan.source, f"[matrix] simulate: {err}") from None


def _check_values(plan: Plan) -> None:
    """Axis values must name things that exist (kernels, modes, models, scenarios...)."""
    from tracekit.host.protocol import SCENARIOS
    from tracekit.vhost.kernels import parse_kernel_spec
    from tracekit.vhost.kvmmode import KVM_MODES
    from tracekit.vhost.qemu import CPU_MODELS

    choices = {
        "kvm_mode": KVM_MODES,
        "cpu_model": CPU_MODELS,
        "after_guest": AFTER_GUEST_ACTIONS,
        "placement": tuple(plan.placements),
        "scenario": tuple(SCENARIOS),
    }
    for axis, allowed in choices.items():
        for value in plan.matrix[axis]:
            if value not in allowed:
                raise _fail(
                    plan.source,
                    f"[matrix] {axis} {value!r} is unknown; use one of: {', '.join(allowed)}",
                )
    _check_models(plan)
    for kernel in plan.matrix["kernel"]:
        try:
            spec = parse_kernel_spec(kernel)
        except TracekitError as err:
            raise _fail(plan.source, f"[matrix] kernel: {err}") from None
        if not spec.has_kvm:
            raise _fail(
                plan.source,
                f"[matrix] kernel {kernel!r} has no KVM ({spec.info.note}); a campaign runs "
                "guests, so leave it out",
            )
