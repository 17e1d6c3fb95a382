"""tracekit.open on a directory of bundles (a campaign's), as `tracekit report` takes it;
the Trace's repr; the package's __all__."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from vm_bundles import make_vm_bundle

import tracekit


def test_a_campaign_directory_opens_as_one_trace_with_a_bundle_column(tmp_path: Path) -> None:
    camp = tmp_path / "camp"
    a = tracekit.open(
        make_vm_bundle(camp / "001-a", {"guest": "teardown-6.1-a76"}, "6.1.0-50-arm64")
    )
    b = tracekit.open(
        make_vm_bundle(camp / "002-b", {"guest": "cacheflush-1vcpu"}, "6.1.0-50-arm64")
    )
    both = tracekit.open(camp)
    assert both.events.columns[0] == "bundle"
    counts = dict(both.events.group_by("bundle").len().iter_rows())
    assert counts == {"001-a": a.events.height, "002-b": b.events.height}
    assert both.events["row"].is_unique().all()  # rows renumbered across bundles
    # A per-event table still joins its events by row, bundle by bundle.
    name = next(n for n in both.event_names if n in a.event_names and n in b.event_names)
    joined = both.event(name).join(both.events, on="row", suffix="_e")
    assert (joined["bundle"] == joined["bundle_e"]).all() and joined.height == both.event(
        name
    ).height
    assert [r["bundle"] for r in both.meta["runs"]] == ["001-a", "002-b"]
    assert both.meta["bundles"] == ["001-a", "002-b"]
    text = repr(both)
    assert text.startswith("Trace('camp', reader='campaign'") and "bundles=2" in text
    assert f"events={a.events.height + b.events.height}" in text
    assert both.events.filter(pl.col("bundle") == "002-b")["run_id"].unique().to_list() == ["guest"]


def test_the_package_says_what_it_exports() -> None:
    assert tracekit.__all__ == ["__version__", "open"]
    assert all(hasattr(tracekit, name) for name in tracekit.__all__)
