"""Lost events: one definition per run, and each run counted once in a report."""

import polars as pl

from tracekit.ingest.lost import lost_per_cpu
from tracekit.report.gather import lost_events_line
from tracekit.report.model import Report, Section


def test_sources_overlap_so_per_cpu_takes_the_largest() -> None:
    """The capture's stats and the pages' missed events report the same losses."""
    lost = pl.DataFrame(
        {"cpu": [0, 0, 1, None], "source": ["stats", "page", "page", "stats"],
         "count": [5, 3, 2, 9]}
    )  # fmt: skip
    assert lost_per_cpu(lost, {"0": 4, "2": 1}) == {0: 5, 1: 2, 2: 1}
    assert lost_per_cpu(None, {"1": 7}) == {1: 7}


def test_losses_of_their_own_add_to_the_overrun() -> None:
    """Dropped and commit-overrun events are other losses than the overrun's; events left
    behind (read but not captured, or unread) too, the larger of the two."""
    lost = pl.DataFrame(
        {"cpu": [0] * 6, "count": [100, 40, 5, 2, 50, 30],
         "source": ["stats_overrun", "page_flag", "stats_dropped", "stats_commit_overrun",
                    "stats_unread", "stats_read"]}
    )  # fmt: skip
    assert lost_per_cpu(lost, {"0": 105}) == {0: 100 + 5 + 2 + 50}


def test_a_run_two_sections_used_is_counted_once() -> None:
    both = {"b::after-traced-0": 40}
    report = Report(
        header=[],
        emulated=False,
        sections=[
            Section("wakeup", "Wake-ups", lost_events=40, lost_by_run=both),
            Section("correlation", "Correlation", lost_events=40, lost_by_run=both),
            Section("vm", "VMs", lost_events=2, lost_by_run={"b::guest": 2}),
        ],
    )
    line = lost_events_line(report)
    assert line.startswith("lost trace events: 42 ")
