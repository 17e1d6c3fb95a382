"""The after-guest EL2 maintenance log (RunFile.MAINT) as a table.

tracekit.host.afterguest.issue_maint writes one line per request to the debug series'
interface (reproducer/kpatch/): `<op> <cpu> [<vmid> [<s2>]] issued at T0, done at T1`,
the request as written and the CLOCK_BOOTTIME (trace clock) nanoseconds before and
after the write, which returns once the operation ran on that CPU.
"""

from __future__ import annotations

import re

import polars as pl

from tracekit.bundle import RunFile
from tracekit.errors import TracekitError

MAINT_SCHEMA = {
    "op": pl.String,  # as the interface names it: alle1, vmalls12e1is, ...
    "cpu": pl.Int64,
    "vmid": pl.Int64,  # null: not a VMID-scoped request
    "s2": pl.Int64,  # stage 2 enabled while issued (1) or not (0); null: not given
    "issued": pl.Int64,
    "done": pl.Int64,
}
_LINE = re.compile(
    r"^(?P<op>[a-z0-9]+) (?P<cpu>\d+)(?: (?P<vmid>\d+)(?: (?P<s2>\d+))?)? "
    r"issued at (?P<issued>\d+), done at (?P<done>\d+)$"
)


def parse_maint_log(text: str, source: str = RunFile.MAINT) -> pl.DataFrame:
    """MAINT_SCHEMA rows of a maintenance log; one line naming the first bad line."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        found = _LINE.match(line.strip())
        if found is None:
            raise TracekitError(
                f"{source}:{number}: not a maintenance request line ('<op> <cpu> [<vmid> "
                f"[<s2>]] issued at T0, done at T1'): {line.strip()[:80]!r}"
            )
        fields = found.groupdict()
        rows.append(
            (
                fields["op"],
                *(None if fields[k] is None else int(fields[k]) for k in ("cpu", "vmid", "s2")),
                int(fields["issued"]),
                int(fields["done"]),
            )
        )
    return pl.DataFrame(rows, schema=MAINT_SCHEMA, orient="row")
