"""docs/robustness-figures.md is what scripts/robustness_figures.py makes of the kept results."""

from __future__ import annotations

from scripts_loader import load_script


def test_the_figures_doc_is_generated_from_the_kept_results() -> None:
    figures = load_script("robustness_figures")
    text = figures.render()
    assert figures.DOC.read_text() == text, "run: python scripts/robustness_figures.py"
    # Every kept output gave its rows: one for fuzzing, one per signal in the kill trials,
    # one per signal (and the power cut) that the matrix ran.
    for source in figures.SOURCES:
        assert source.rows((figures.RESULTS / source.file).read_text()), source.file
    assert len(figures.kill_trial_rows((figures.RESULTS / "kill_trials.txt").read_text())) == 3
