"""Ground truth for the ingest tests: `trace-cmd report -R -t` and tracefs `trace` text."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

LINE_RE = re.compile(
    r"^(?:(?P<inst>[\w.-]+): )?\s*(?P<comm>.*?)-(?P<pid>\d+)\s+(?:\(\s*[-\d]+\)\s+)?"
    r"\[(?P<cpu>\d+)\]\s+(?:[.\w]{4,5}\s+)?(?P<sec>\d+)\.(?P<frac>\d+):\s+"
    r"(?P<event>\w+):\s*(?P<fields>.*)$"
)
DROPPED_RE = re.compile(r"CPU:(?P<cpu>\d+) \[(?:(?P<count>\d+) )?EVENTS DROPPED\]")


@dataclass
class TruthEvent:
    """One event line of a text rendering."""

    ts: int  # ns when the text has 9 digits, else scaled from what it has
    digits: int
    cpu: int
    pid: int
    comm: str
    event: str
    fields: str


def have_trace_cmd() -> bool:
    """True when trace-cmd is installed."""
    return shutil.which("trace-cmd") is not None


def report_raw(dat: Path) -> str:
    """`trace-cmd report -R -t` output of a trace.dat."""
    out = subprocess.run(
        ["trace-cmd", "report", "-R", "-t", str(dat)], capture_output=True, text=True, check=True
    )
    return out.stdout


def parse_lines(text: str) -> tuple[list[TruthEvent], list[tuple[int, int | None]]]:
    """Event lines and EVENTS DROPPED markers of report or trace text."""
    events: list[TruthEvent] = []
    dropped: list[tuple[int, int | None]] = []
    for line in text.splitlines():
        d = DROPPED_RE.search(line)
        if d:
            dropped.append((int(d["cpu"]), int(d["count"]) if d["count"] else None))
            continue
        m = LINE_RE.match(line)
        if not m:
            continue
        frac = m["frac"]
        ts = int(m["sec"]) * 10**9 + int(frac.ljust(9, "0"))
        events.append(
            TruthEvent(ts, len(frac), int(m["cpu"]), int(m["pid"]), m["comm"].strip(),
                       m["event"], m["fields"])
        )  # fmt: skip
    return events, dropped


def split_fields(text: str, names: list[str]) -> dict[str, str]:
    """Split 'a=1 b=two words c=3' given the field names in order."""
    out: dict[str, str] = {}
    for i, name in enumerate(names):
        start = text.find(f"{name}=")
        if start < 0:
            continue
        start += len(name) + 1
        end = len(text)
        if i + 1 < len(names):
            nxt = text.find(f" {names[i + 1]}=", start)
            end = nxt if nxt >= 0 else end
        out[name] = text[start:end]
    return out
