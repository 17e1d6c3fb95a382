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

if TYPE_CHECKING:
    from tracekit.analysis.compare import Comparison
    from tracekit.bundle import RunRecord
    from tracekit.ingest.bundle import BundleData

PlotKind = Literal["cdf", "histogram", "bars", "xy", "timeline", "intervals"]
# Log axes only where values span decades by nature: distributions. A bar's length, a
# point on a curve or an interval's whiskers on a log axis mislead the eye.
LOG_KINDS = ("cdf", "histogram")


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
    intervals: `x` the estimate, `y` the row's label, `frame` also has `low` and `high`
    (null when there is no interval: the point alone is drawn), against a line at
    `reference` (1.0: no change, for ratios).
    """

    title: str
    kind: PlotKind
    frame: pl.DataFrame
    x: str
    y: str | None = None
    series: str | None = None
    log_x: bool = False
    log_y: bool = False
    reference: float = 1.0  # intervals: the reference line's x
    x_label: str = ""
    y_label: str = ""

    def __post_init__(self) -> None:
        """Refuse a log axis outside distributions (a bug in the section that asks)."""
        if (self.log_x or self.log_y) and self.kind not in LOG_KINDS:
            raise ValueError(f"plot {self.title!r}: a {self.kind} plot has linear axes only")


@dataclass(frozen=True)
class Section:
    """One topic of the report (before/after, wake-ups, TLBI cost, VMs, decision table)."""

    key: str  # stable identifier, used as the JSON key and the HTML anchor
    title: str
    findings: list[str] = field(default_factory=list)  # plain sentences, most important first
    comparisons: list[Comparison] = field(default_factory=list)  # the details' comparisons
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)  # what this section cannot tell
    # Findings that contradict the setup (e.g. the ground truth shows an action did not do
    # what it claims): the report's lead states them right after its warnings line.
    contradictions: list[str] = field(default_factory=list)
    # The comparisons that answer the report's question: the lead states them (and only
    # it), as its result with their spread.
    headline: list[Comparison] = field(default_factory=list)
    # Findings about the controls (the observer effect): the lead's controls part.
    controls: list[str] = field(default_factory=list)
    lost_events: int | None = None  # lost events in the data it used; None: no traces used
    # The same per run whose trace it used (run_key -> lost), so a report counts each once.
    lost_by_run: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """A whole report: its warnings first, then findings against the setup, then sections."""

    header: list[str]  # the setup: bundle, host, kernel, KVM mode, protocol
    emulated: bool
    sections: list[Section]
    # The lead's first line, one sentence each: EMULATED HOST, SIMULATED EFFECT (and its
    # model), INCOMPLETE or DAMAGED bundle (tracekit/report/header.py WARNINGS adds them).
    warnings: list[str] = field(default_factory=list)
    # Every section's contradictions, in report order, each once.
    contradictions: list[str] = field(default_factory=list)
    question: str = ""  # what the bundles were collected to answer
    controls: list[str] = field(default_factory=list)  # the protocol's, then the sections'
    # The comparisons that answer the report's question: the lead states them (and only
    # it), as its result with their spread.
    headline: list[Comparison] = field(default_factory=list)
    # Findings about the controls (the observer effect): the lead's controls part.
    controls: list[str] = field(default_factory=list)


# A section builder reads loaded bundles (and may open their traces) and returns its
# section, or None when the bundles hold nothing for it (e.g. no teardown runs).
SectionBuilder = Callable[[list["BundleData"]], Section | None]


def run_key(data: BundleData, run: RunRecord) -> str:
    """One run of one bundle, as the lost-events accounting names it."""
    return f"{data.path}::{run.run_id}"


def used_runs(keys: dict[str, int]) -> dict[str, Any]:
    """Section fields for the runs whose traces a section used: lost events, each once."""
    return {"lost_events": sum(keys.values()), "lost_by_run": keys}
