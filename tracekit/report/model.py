"""What a report says, apart from how it is drawn: sections of tables, plots and findings.

Analyses return frames; a section builder (tracekit/report/sections/<topic>.py) turns
their results into one `Section`; every renderer (text, email, html, json) draws the same
`Report`, so the formats never disagree on a number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from tracekit.bundle import EMULATED_LINE

if TYPE_CHECKING:
    from tracekit.analysis.compare import Comparison
    from tracekit.bundle import RunRecord
    from tracekit.ingest.bundle import BundleData

PlotKind = Literal["cdf", "histogram", "bars", "xy", "timeline", "intervals"]


@dataclass(frozen=True)
class Table:
    """A frame shown as a table; `note` says how to read it (units, what was excluded)."""

    title: str
    frame: pl.DataFrame
    note: str = ""


@dataclass(frozen=True)
class Plot:
    """A plot drawn from a long-format frame: one line/bar group per `series` value.

    cdf/histogram use `x` only; bars, xy and timeline use `x` and `y` (timeline: `x` is
    the start in ns, `y` the lane, and `frame` also has `end` and `label` columns);
    intervals: `x` the estimate, `y` the row's label, `frame` also has `low` and `high`.
    """

    title: str
    kind: PlotKind
    frame: pl.DataFrame
    x: str
    y: str | None = None
    series: str | None = None
    log_x: bool = False
    log_y: bool = False
    x_label: str = ""
    y_label: str = ""


@dataclass(frozen=True)
class Section:
    """One topic of the report (before/after, wake-ups, TLBI cost, VMs, decision table)."""

    key: str  # stable identifier, used as the JSON key and the HTML anchor
    title: str
    findings: list[str] = field(default_factory=list)  # plain sentences, most important first
    comparisons: list[Comparison] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)  # what this section cannot tell
    lost_events: int | None = None  # lost events in the data it used; None: no traces used
    # The same per run whose trace it used (run_key -> lost), so a report counts each once.
    lost_by_run: dict[str, int] = field(default_factory=dict)
    # Findings that contradict the setup (e.g. the ground truth shows a step did not run
    # what it claims): the report's lead states them, right after the warning line.
    contradictions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Report:
    """A whole report: who/where first (EMULATED when it is), then sections."""

    header: list[str]  # host, kernel, KVM mode, protocol; "EMULATED HOST ..." first if so
    emulated: bool
    sections: list[Section]
    # Every section's contradictions, in section order (Section.contradictions).
    contradictions: list[str] = field(default_factory=list)

    def lead(self) -> list[str]:
        """The header with the contradicting findings right after its warning line."""
        said = [f"{CONTRADICTS}: {line}" for line in self.contradictions]
        at = 1 if self.header and self.header[0] == EMULATED_LINE else 0
        return [*self.header[:at], *said, *self.header[at:]]


# How the lead marks a finding that contradicts the setup.
CONTRADICTS = "CONTRADICTS THE SETUP"


# A section builder reads loaded bundles (and may open their traces) and returns its
# section, or None when the bundles hold nothing for it (e.g. no teardown runs).
SectionBuilder = Callable[[list["BundleData"]], Section | None]


def run_key(data: BundleData, run: RunRecord) -> str:
    """One run of one bundle, as the lost-events accounting names it."""
    return f"{data.path}::{run.run_id}"


def used_runs(keys: dict[str, int]) -> dict[str, Any]:
    """Section fields for the runs whose traces a section used: lost events, each once."""
    return {"lost_events": sum(keys.values()), "lost_by_run": keys}
