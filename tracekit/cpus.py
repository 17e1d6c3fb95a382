"""CPU lists in the kernel's notation ("0-2,5"), shared by every part of tracekit."""

from __future__ import annotations

from tracekit.errors import TracekitError


def parse_cpu_list(text: str) -> list[int]:
    """Parse a kernel CPU list such as "0-2,5" into sorted, unique CPU numbers."""
    cpus: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return []
    for part in stripped.split(","):
        part = part.strip()
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise TracekitError(
                f"bad CPU list {text!r}: {part!r} is not a number or range; "
                "write CPU lists as the kernel does, e.g. 0-2,5"
            ) from None
        if lo < 0 or hi < lo:
            raise TracekitError(
                f"bad CPU list {text!r}: range {part!r} is empty or negative; "
                "write ranges low-high, e.g. 0-2"
            )
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def format_cpu_list(cpus: list[int] | set[int]) -> str:
    """Format CPU numbers back into the kernel's compact notation ("0-2,5")."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
