"""Section builders, one topic per module: `section(bundles) -> Section | None`.

Each builder stays thin: numbers come from pure functions in tracekit/analysis/, the
builder only picks runs, labels results and says what it cannot tell (`unknowns`).
tracekit/report/assemble.py lists the builders in report order (SECTION_BUILDERS).
"""
