"""The board a dry run plans for, when it is not this machine: its CPUs and IPA limit.

Given by flags (`collect --dry-run --board-cpus 0-7 --board-ipa-bits 40`) or by a facts
file: a bundle's manifest.json recorded on that board (its `host` facts), or a JSON
object with the same keys (`online_cpus` as the kernel writes CPU lists, and
`ipa_limit_bits`). Standard library only: it runs on the board too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracekit.cpus import parse_cpu_list
from tracekit.errors import TracekitError


@dataclass(frozen=True)
class Board:
    """What planning needs from the host: which CPUs are online, the largest IPA size."""

    online: list[int]
    ipa_limit: int | None  # None: not known (no sweep is then limited)


def board_from(cpus: str | None, ipa_bits: int | None, facts: Path | None) -> Board | None:
    """The board the flags or the facts file describe (flags win), or None for this host."""
    if cpus is None and ipa_bits is None and facts is None:
        return None
    known = _facts(facts) if facts is not None else {}
    listed = cpus if cpus is not None else known.get("online_cpus")
    if not listed:
        raise TracekitError(
            "planning for a board needs its online CPUs: --board-cpus 0-7, or a facts file"
            " with online_cpus (a bundle's manifest.json from that board has them)"
        )
    limit = ipa_bits if ipa_bits is not None else known.get("ipa_limit_bits")
    return Board(parse_cpu_list(str(listed)), int(limit) if limit else None)


def _facts(path: Path) -> dict[str, Any]:
    """The host facts in a facts file or a bundle manifest (its `host` part)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TracekitError(
            f"--board-facts {path}: not readable JSON ({err}); give a bundle's manifest.json"
            " or a JSON object with online_cpus and ipa_limit_bits"
        ) from None
    if not isinstance(data, dict):
        raise TracekitError(
            f"--board-facts {path}: a JSON object is needed, not {type(data).__name__}"
        )
    host = data.get("host", data)
    return host if isinstance(host, dict) else {}
