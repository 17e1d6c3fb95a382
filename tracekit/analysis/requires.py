"""What each analysis needs from a trace, checked before it runs (LISA's idea, plainly).

An analysis declares its events as `{event name: how to record it}`; `require_events`
fails with one line naming every missing event and the way to get it, instead of an
empty result that looks like "nothing happened".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tracekit.errors import TracekitError

# How to record the events tracekit's traced runs enable by default.
TRACED_RUN = "a traced run of `tracekit collect` records it (--traced-runs >= 1)"


def require_events(analysis: str, available: Iterable[str], needs: Mapping[str, str]) -> None:
    """Raise naming each needed event the trace lacks, and how to record it."""
    have = set(available)
    missing = [(name, how) for name, how in needs.items() if name not in have]
    if missing:
        detail = "; ".join(f"{name} ({how})" for name, how in missing)
        raise TracekitError(f"{analysis} needs events this trace does not have: {detail}")


def optional_events(available: Iterable[str], wanted: Iterable[str]) -> list[str]:
    """The wanted events the trace has: for analyses that use more when it is there."""
    have = set(available)
    return [name for name in wanted if name in have]
