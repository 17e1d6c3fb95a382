"""Campaigns: a matrix of conditions, one freshly booted host per cell (issue 8).

- plan.py     the plan file (TOML or JSON): axes, placements, options, repeats, seed
- cells.py    the matrix expanded into cells, in a seeded random order
- command.py  what a cell runs: the collect command line and the emulated host's boot
- state.py    campaign.json: the record of every cell, and the resume state
- run.py      the executors: every cell in the emulated host, or one per board boot

Standard library only (plus tracekit.host/vhost): this runs on boards too.
"""
