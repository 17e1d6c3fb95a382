"""Experimental designs over guest knobs and collect options (issue 19): which factor acts.

A plan's `[design]` table names factors, each over a guest knob (tracekit.guests.KNOBS),
the guest RAM backing, or a `tracekit collect` option, and one of three kinds:

- full        every combination of the factors' levels (any number of levels each)
- fractional  a two-level 2^(k-p) fraction: `generators` (e.g. "ng = mmu*leaf*pre_tlbi")
              or `fraction = p` (the textbook generators of largest resolution); the
              defining relation, resolution and alias structure are computed and shown
- dose        one factor swept over three or more levels (its dose-response)

`[design.fixed]` gives every cell the same knobs/options. The plan's `repeats` are the
replicates (each its own boot) and its seed draws the run order (cells.py).
Standard library only: this runs on the board.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from tracekit.errors import TracekitError
from tracekit.guests import BACKINGS, KNOBS, parse_knob

KINDS = ("full", "fractional", "dose")
# Factors that are neither knobs nor options of their own: collect's guest RAM backing.
SPECIAL_FACTORS = {"backing": "--backing"}
# Textbook 2^(k-p) generators of largest resolution (Box, Hunter & Hunter, table 6.22),
# keyed by (k, p); letters are the factors in plan order.
STANDARD_GENERATORS: dict[tuple[int, int], tuple[str, ...]] = {
    (3, 1): ("C=AB",),
    (4, 1): ("D=ABC",),
    (5, 1): ("E=ABCD",),
    (5, 2): ("D=AB", "E=AC"),
    (6, 1): ("F=ABCDE",),
    (6, 2): ("E=ABC", "F=BCD"),
    (6, 3): ("D=AB", "E=AC", "F=BC"),
    (7, 1): ("G=ABCDEF",),
    (7, 2): ("F=ABCD", "G=ABDE"),
    (7, 3): ("E=ABC", "F=BCD", "G=ACD"),
    (7, 4): ("D=AB", "E=AC", "F=BC", "G=ABC"),
    (8, 4): ("E=BCD", "F=ACD", "G=ABC", "H=ABD"),
}
LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"  # I is the identity of the defining relation
DESIGN_KEYS = ("kind", "factors", "fixed", "generators", "fraction", "dose", "timing")
TIMING_KEYS = ("boot_s", "setup_s", "board_boot_s", "board_setup_s")
# Assumed per-cell overheads (s) when the plan gives none. Emulated: a boot under TCG
# (10-15 s on the 2-core test machine) and collect's own setup, which made the two-cell
# test campaign take 3.5-5 min per cell for 2 s of measurement (docs/campaign.md).
DEFAULT_TIMING = {"boot_s": 15.0, "setup_s": 200.0, "board_boot_s": 90.0, "board_setup_s": 30.0}


@dataclass(frozen=True)
class Factor:
    """One factor: its name, its levels (as the command line writes them), and its target."""

    name: str
    levels: tuple[str, ...]
    target: str  # "knob", "option" or "backing"
    letter: str = ""

    def argv(self, value: str) -> list[str]:
        """The collect arguments that set this factor to `value`."""
        return target_argv(self.name, self.target, value)


def target_argv(name: str, target: str, value: str) -> list[str]:
    """`--knob NAME=VALUE`, `--backing VALUE` or `--option VALUE` for collect."""
    if target == "knob":
        return ["--knob", f"{name}={value}"]
    if target == "backing":
        return [SPECIAL_FACTORS[name], value]
    return ["--" + name.replace("_", "-"), value]


@dataclass(frozen=True)
class Design:
    """A validated design: factors, the conditions it runs, and its alias structure."""

    kind: str
    factors: tuple[Factor, ...]
    fixed: dict[str, str] = field(default_factory=dict)
    generators: tuple[str, ...] = ()  # letter form, e.g. "D=ABC"
    dose: str | None = None
    timing: dict[str, float] = field(default_factory=dict)

    def factor(self, name: str) -> Factor:
        """The factor of that name."""
        return next(f for f in self.factors if f.name == name)

    def conditions(self) -> list[dict[str, str]]:
        """Every condition (factor name -> level) in standard order, before replication."""
        if self.kind != "fractional":
            names = [f.name for f in self.factors]
            return [
                dict(zip(names, values, strict=True))
                for values in itertools.product(*(f.levels for f in self.factors))
            ]
        return [self._level_row(signs) for signs in sign_rows(self.factors, self.generators)]

    def _level_row(self, signs: dict[str, int]) -> dict[str, str]:
        """A row of +/-1 by letter as factor levels (-1: the first level, +1: the second)."""
        return {f.name: f.levels[(signs[f.letter] + 1) // 2] for f in self.factors}

    def defining_relation(self) -> list[frozenset[str]]:
        """The words equal to the identity I (every product of the generator words)."""
        return defining_relation(self.generators)

    def resolution(self) -> int | None:
        """The length of the shortest defining word; None for a full factorial."""
        words = self.defining_relation()
        return min(len(w) for w in words) if words else None

    def aliases(self) -> dict[str, list[str]]:
        """Each main effect and two-factor interaction with the effects it is aliased with."""
        words = self.defining_relation()
        letters = [f.letter for f in self.factors]
        effects = [frozenset(e) for e in letters] + [
            frozenset(p) for p in itertools.combinations(letters, 2)
        ]
        return {
            word_text(effect): sorted((word_text(effect ^ w) for w in words), key=_effect_order)
            for effect in effects
        }

    def summary(self) -> list[str]:
        """The design as printed by `tracekit campaign`: factors, generators, aliases."""
        lines = [f"design: {self.kind}, {len(self.factors)} factor(s)"]
        for f in self.factors:
            lines.append(f"  {f.letter} {f.name} ({f.target}): {', '.join(f.levels)}")
        if self.fixed:
            lines.append("  fixed: " + " ".join(f"{k}={v}" for k, v in self.fixed.items()))
        if self.kind == "dose":
            lines.append(f"  dose: {self.dose} at {len(self.factor(str(self.dose)).levels)} levels")
        if self.kind == "fractional":
            lines += self._fraction_lines()
        return lines

    def _fraction_lines(self) -> list[str]:
        """Generators, defining relation, resolution and the aliases of effects up to 2."""
        relation = " = ".join(["I", *(word_text(w) for w in self.defining_relation())])
        lines = [
            f"  fraction 2^({len(self.factors)}-{len(self.generators)}), resolution "
            f"{roman(self.resolution() or 0)}; generators {', '.join(self.generators)}",
            f"  defining relation: {relation}",
            "  aliases (main effects and two-factor interactions):",
        ]
        shown: set[str] = set()
        for effect, aliased in self.aliases().items():
            if effect not in shown:
                lines.append(f"    {effect} = {' = '.join(aliased)}")
            shown.update([effect, *aliased])
        return lines


def sign_rows(factors: tuple[Factor, ...], generators: tuple[str, ...]) -> list[dict[str, int]]:
    """The +/-1 rows of a 2^(k-p) design: base factors in standard order, others generated."""
    generated = {g.split("=")[0]: g.split("=")[1] for g in generators}
    base = [f.letter for f in factors if f.letter not in generated]
    rows = []
    for signs in itertools.product((-1, 1), repeat=len(base)):
        # Standard (Yates) order: the first factor changes fastest.
        row = dict(zip(base, reversed(signs), strict=True))
        for letter, word in generated.items():
            row[letter] = math.prod(row[c] for c in word)
        rows.append(row)
    return rows


def defining_relation(generators: tuple[str, ...]) -> list[frozenset[str]]:
    """Every product of the generator words D=ABC -> ABCD (products drop squared letters)."""
    words = [frozenset(g.replace("=", "")) for g in generators]
    relation: set[frozenset[str]] = set()
    for size in range(1, len(words) + 1):
        for combo in itertools.combinations(words, size):
            product: frozenset[str] = frozenset()
            for word in combo:
                product = product ^ word
            relation.add(product)
    return sorted(relation, key=_effect_order)


def word_text(word: frozenset[str]) -> str:
    """A word's letters in alphabetical order ("I" for the empty word)."""
    return "".join(sorted(word)) or "I"


def _effect_order(word: frozenset[str] | str) -> tuple[int, str]:
    """Shorter effects first, then alphabetical."""
    text = word if isinstance(word, str) else word_text(word)
    return len(text), text


def roman(n: int) -> str:
    """A design resolution as it is written (III, IV, V...)."""
    numerals = ((10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"))
    out = ""
    for value, text in numerals:
        while n >= value:
            out, n = out + text, n - value
    return out or "-"


def parse_design(source: str, data: Any, collect_options: dict[str, type]) -> Design:
    """Validate a plan's [design] table; one line naming the key on any mistake."""
    if not isinstance(data, dict):
        raise _fail(source, "[design] must be a table")
    _known(source, "design", data, DESIGN_KEYS)
    kind = data.get("kind", "full")
    if kind not in KINDS:
        raise _fail(source, f"[design] kind {kind!r} is unknown; use one of: {', '.join(KINDS)}")
    factors = _factors(source, data.get("factors"), collect_options)
    fixed = _fixed(source, data.get("fixed", {}), collect_options, factors)
    timing = _timing(source, data.get("timing", {}))
    if kind == "dose":
        return _dose_design(source, data, factors, fixed, timing)
    generators: tuple[str, ...] = ()
    if kind == "fractional":
        generators = _generators(source, data, factors)
    elif "generators" in data or "fraction" in data:
        raise _fail(source, '[design] generators/fraction need kind = "fractional"')
    return Design(kind, factors, fixed, generators, None, timing)


def _fail(source: str, message: str) -> TracekitError:
    """A plan error naming the file it is in."""
    return TracekitError(f"plan {source}: {message}")


def _known(source: str, table: str, data: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Unknown keys are mistakes, never ignored."""
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise _fail(
            source, f"unknown key {unknown[0]!r} in [{table}]; allowed: {', '.join(allowed)}"
        )


def factor_target(source: str, name: str, collect_options: dict[str, type]) -> str:
    """What a factor name sets: a guest knob, the RAM backing, or a collect option."""
    if name in KNOBS:
        return "knob"
    if name in SPECIAL_FACTORS:
        return "backing"
    if name in collect_options and collect_options[name] in (int, str):
        return "option"
    raise _fail(
        source,
        f"[design] factor {name!r} is neither a guest knob ({', '.join(KNOBS)}), "
        f"`backing`, nor a numeric/string [collect] option",
    )


def check_level(source: str, name: str, target: str, value: Any) -> str:
    """One level as text, checked against what its knob or option accepts."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _fail(source, f"[design] {name} level {value!r} must be a string or an integer")
    text = str(value)
    try:
        if target == "knob":
            parse_knob(name, text)
    except TracekitError as err:
        raise _fail(source, f"[design] {err}") from None
    if target == "backing" and text not in BACKINGS:
        raise _fail(source, f"[design] backing {text!r}: use one of {', '.join(BACKINGS)}")
    return text


def _factors(source: str, data: Any, collect_options: dict[str, type]) -> tuple[Factor, ...]:
    """The [design.factors] table: name = [levels], each distinct, at least two."""
    if not isinstance(data, dict) or not data:
        raise _fail(source, "[design.factors] must name at least one factor = [levels]")
    if len(data) > len(LETTERS):
        raise _fail(source, f"[design.factors] has {len(data)} factors; at most {len(LETTERS)}")
    factors = []
    for letter, (name, values) in zip(LETTERS, data.items(), strict=False):
        target = factor_target(source, name, collect_options)
        if not isinstance(values, list) or len(values) < 2:
            raise _fail(source, f"[design.factors] {name} needs a list of at least two levels")
        levels = tuple(check_level(source, name, target, v) for v in values)
        if len(set(levels)) != len(levels):
            raise _fail(source, f"[design.factors] {name} repeats a level; use `repeats`")
        factors.append(Factor(name, levels, target, letter))
    return tuple(factors)


def _fixed(
    source: str, data: Any, collect_options: dict[str, type], factors: tuple[Factor, ...]
) -> dict[str, str]:
    """[design.fixed]: knobs/options every cell gets; a factor cannot also be fixed."""
    if not isinstance(data, dict):
        raise _fail(source, "[design.fixed] must be a table of name = value")
    fixed = {}
    for name, value in data.items():
        if any(f.name == name for f in factors):
            raise _fail(source, f"[design.fixed] {name} is also a factor; keep one of them")
        fixed[name] = check_level(source, name, factor_target(source, name, collect_options), value)
    return fixed


def _timing(source: str, data: Any) -> dict[str, float]:
    """[design.timing]: per-cell boot and setup seconds, on the emulated host and a board."""
    if not isinstance(data, dict):
        raise _fail(source, "[design.timing] must be a table")
    _known(source, "design.timing", data, TIMING_KEYS)
    timing = dict(DEFAULT_TIMING)
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise _fail(source, f"[design.timing] {key} must be a number of seconds >= 0")
        timing[key] = float(value)
    return timing


def _dose_design(
    source: str,
    data: dict[str, Any],
    factors: tuple[Factor, ...],
    fixed: dict[str, str],
    timing: dict[str, float],
) -> Design:
    """A one-factor sweep: numeric levels, at least three (a shape needs them)."""
    if len(factors) != 1:
        raise _fail(source, '[design] kind "dose" sweeps one factor; put the others in fixed')
    factor = factors[0]
    if data.get("dose", factor.name) != factor.name:
        raise _fail(source, f"[design] dose {data['dose']!r} is not the factor {factor.name!r}")
    if not all(level.isdigit() for level in factor.levels) or len(factor.levels) < 3:
        raise _fail(source, f"[design] the dose {factor.name} needs at least three numeric levels")
    return Design("dose", factors, fixed, (), factor.name, timing)


def _generators(source: str, data: dict[str, Any], factors: tuple[Factor, ...]) -> tuple[str, ...]:
    """The fraction's generators in letter form, from `generators` or `fraction = p`."""
    odd = [f.name for f in factors if len(f.levels) != 2]
    if odd:
        raise _fail(source, f"[design] a fractional design is two-level; {odd[0]} has more")
    if "generators" in data and "fraction" in data:
        raise _fail(source, "[design] give generators or fraction, not both")
    if "fraction" in data:
        p = data["fraction"]
        key = (len(factors), p)
        if isinstance(p, bool) or key not in STANDARD_GENERATORS:
            known = ", ".join(f"{k}-{q}" for k, q in STANDARD_GENERATORS)
            raise _fail(
                source,
                f"[design] no standard generators for 2^({len(factors)}-{p}); give generators "
                f"(known k-p: {known})",
            )
        return STANDARD_GENERATORS[key]
    texts = data.get("generators")
    if not isinstance(texts, list) or not texts:
        raise _fail(source, '[design] fractional needs generators = ["D = A*B*C", ...]')
    gens = tuple(_generator(source, text, factors) for text in texts)
    _check_independent(source, gens)
    return gens


def _generator(source: str, text: Any, factors: tuple[Factor, ...]) -> str:
    """ "ng = mmu*leaf" (names or letters) as "D=AB"; the generated factor is on the left."""
    by_name = {f.name: f.letter for f in factors} | {f.letter: f.letter for f in factors}
    if not isinstance(text, str) or text.count("=") != 1:
        raise _fail(source, f'[design] generator {text!r}: write "D = A*B*C"')
    left, right = (part.strip() for part in text.split("="))
    names = [n.strip() for n in right.split("*")] if "*" in right else _split(right, by_name)
    unknown = [n for n in [left, *names] if n not in by_name]
    if unknown:
        raise _fail(source, f"[design] generator {text!r}: {unknown[0]!r} is not a factor")
    word = [by_name[n] for n in names]
    if len(word) < 2 or len(set(word)) != len(word) or by_name[left] in word:
        raise _fail(source, f"[design] generator {text!r} needs two or more other factors")
    return f"{by_name[left]}={''.join(sorted(word))}"


def _split(word: str, by_name: dict[str, str]) -> list[str]:
    """A generator's right side given as letters ("ABC") or one factor name."""
    return [word] if word in by_name and len(word) > 1 else list(word)


def _check_independent(source: str, gens: tuple[str, ...]) -> None:
    """Each generated factor once, never used to generate another (else rows repeat)."""
    left = [g.split("=")[0] for g in gens]
    if len(set(left)) != len(left):
        raise _fail(source, f"[design] factor {left[0]} is generated twice")
    for g in gens:
        used = set(g.split("=")[1]) & set(left)
        if used:
            raise _fail(source, f"[design] generator {g}: {sorted(used)[0]} is itself generated")


def check_balance(design: Design) -> list[str]:
    """Imbalances of a design (each level equally often; two-level columns orthogonal)."""
    rows = design.conditions()
    problems = []
    for f in design.factors:
        counts = {level: sum(1 for r in rows if r[f.name] == level) for level in f.levels}
        if len(set(counts.values())) != 1:
            problems.append(f"{f.name}: levels appear {counts}")
    two = [f for f in design.factors if len(f.levels) == 2]
    for a, b in itertools.combinations(two, 2):
        dot = sum(_sign(a, r) * _sign(b, r) for r in rows)
        if dot:
            problems.append(f"{a.name} and {b.name} are not orthogonal ({dot})")
    return problems


def _sign(factor: Factor, row: dict[str, str]) -> int:
    """-1 for a two-level factor's first level, +1 for its second."""
    return -1 if row[factor.name] == factor.levels[0] else 1


def min_p_value(runs: int) -> float:
    """The smallest two-sided p of the exact rank test with `runs` per phase (compare.py)."""
    return min(1.0, 2 / math.comb(2 * runs, runs))


def runs_for_verdict(alpha: float = 0.05) -> int:
    """Quiet runs per phase a cell's own before/after verdict needs (exact rank test)."""
    runs = 1
    while min_p_value(runs) >= alpha:
        runs += 1
    return runs


# Boots per cell the campaign's effect intervals need: a within-cell spread needs two.
REPLICATES_FOR_INTERVALS = 2
