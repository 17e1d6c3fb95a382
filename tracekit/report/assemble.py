"""A Report from loaded bundles: the header, then every section builder in report order.

Adding a topic is one import and one entry in SECTION_BUILDERS. A builder that fails on
the user's data (a missing event, too few runs) becomes a section saying so, so one
topic's gap never hides the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tracekit.errors import TracekitError
from tracekit.ingest.bundle import BundleData
from tracekit.report.header import (
    controls_line,
    header_lines,
    is_emulated,
    question_line,
    warning_lines,
)
from tracekit.report.model import Report, Section, SectionBuilder
from tracekit.report.sections import (
    beforeafter,
    broadcast,
    cacheflush,
    churn,
    correlation,
    decision,
    factorial,
    groundtruth,
    predictions,
    simulated,
    teardown,
    tlbi,
    vm,
    vmidprep,
    wakeup,
)

# How a section that failed on a bug (not on the user's data) begins its reason.
INTERNAL_ERROR = "internal error"

# Report order: headline numbers first, then attribution, then the related cases.
SECTION_BUILDERS: list[SectionBuilder] = [
    beforeafter.section,
    decision.section,
    predictions.section,
    simulated.section,
    factorial.section,
    vmidprep.section,
    wakeup.section,
    tlbi.section,
    correlation.section,
    vm.section,
    teardown.section,
    churn.section,
    cacheflush.section,
    broadcast.section,
    groundtruth.section,
]
# The sections that need only a bundle's tables (manifest, samples, summaries): what a
# report over a results dataset (ingest/dataset.py), which has no raw files, can run.
TABLE_SECTIONS: list[SectionBuilder] = [beforeafter.section, decision.section, factorial.section]
# The header's line for such a report, naming what it leaves out.
TABLES_ONLY_LINE = (
    "from a results dataset: only the sections that need no raw traces (before/after,"
    " decision table, factorial effects); report the bundles themselves for the rest"
)


def build_report(
    bundles: list[BundleData], progress: Callable[[str], None] | None = None
) -> Report:
    """Run every section builder over the bundles; `progress` hears each step's name."""
    if not bundles:
        raise TracekitError("report: no bundles given; name a bundle directory")
    tables_only = any(b.tables_only for b in bundles)
    sections = []
    for builder in TABLE_SECTIONS if tables_only else SECTION_BUILDERS:
        if progress is not None:
            progress(f"report: {_builder_name(builder)}")
        section = _run_builder(builder, bundles)
        if section is not None:
            sections.append(section)
    return Report(
        header=header_lines(bundles) + ([TABLES_ONLY_LINE] if tables_only else []),
        emulated=any(is_emulated(b) for b in bundles),
        sections=sections,
        warnings=warning_lines(bundles),
        contradictions=list(dict.fromkeys(c for s in sections for c in s.contradictions)),
        question=question_line(bundles),
        controls=[controls_line(bundles), *(c for s in sections for c in s.controls)],
    )


def _run_builder(builder: SectionBuilder, bundles: list[BundleData]) -> Section | None:
    """The builder's section, or one that says why it could not be made.

    A bug in one builder must not hide the other sections: it becomes a section that
    names it as an internal error (TRACEKIT_DEBUG=1 re-raises it, with its traceback).
    """
    try:
        return builder(bundles)
    except TracekitError as err:
        return _not_computed(_builder_name(builder), str(err))
    except Exception as err:
        if os.environ.get("TRACEKIT_DEBUG"):
            raise
        why = (
            f"{INTERNAL_ERROR} ({type(err).__name__}: {err}); a tracekit bug: please report "
            "it with the bundle (TRACEKIT_DEBUG=1 shows the traceback)"
        )
        return _not_computed(_builder_name(builder), why)


def _not_computed(name: str, why: str) -> Section:
    """A section that says why it is missing, so the report shows the gap."""
    return Section(
        key=name,
        title=f"{name}: not computed",
        findings=[f"not computed: {why}"],
        unknowns=[f"{name}: everything this section would show ({why})"],
    )


def _builder_name(builder: SectionBuilder) -> str:
    """The builder's topic: its module's last name (sections/<topic>.py)."""
    return getattr(builder, "__module__", "section").rsplit(".", 1)[-1]
