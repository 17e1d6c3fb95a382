"""Which capture reads a traced run out of the instance: tracekit's raw one or trace-cmd.

Both record the same run in the same instance; they differ only in the file a run
leaves: `runs/<run>/trace` (docs/raw-capture.md) or `runs/<run>/trace.dat`.
"""

from __future__ import annotations

from pathlib import Path

from tracekit.bundle import RunFile
from tracekit.errors import TracekitError
from tracekit.host.instance import TRACE_CLOCK, Instance
from tracekit.host.protocol import ROLLOVER_ACTIONS
from tracekit.host.rawcapture import RawCapture
from tracekit.host.tracecmdcapture import TRACE_DAT, TraceCmdCapture

# `--capture` values; raw is the default (no tool needed on the host).
CAPTURES = ("raw", "trace-cmd")
# The directory name of a run's raw capture.
RAW_TRACE = RunFile.TRACE

Capture = RawCapture | TraceCmdCapture


def check_capture(capture: str, after_guest: str) -> None:
    """The capture method is known and fits the run plan (before the host is touched)."""
    if capture not in CAPTURES:
        raise TracekitError(f"--capture {capture}: unknown; choose one of {', '.join(CAPTURES)}")
    if capture == "trace-cmd" and after_guest in ROLLOVER_ACTIONS:
        # A rollover runs thousands of VMs in one run; only the raw capture can empty the
        # buffers between batches, trace-cmd extract reads them once at the end.
        raise TracekitError(
            f"--after-guest {after_guest} needs --capture raw: the buffers are drained between "
            "batches of VMs, which trace-cmd extract cannot do"
        )


def capture_record(capture: str, trace_cmd: str | None) -> dict[str, str]:
    """How traced runs were read out, for the manifest (ingest takes the clock from it)."""
    if capture == "trace-cmd":
        # trace-cmd stores the top-level buffer's clock in the file, not the instance's:
        # the manifest is where the instance's clock is written down.
        return {"method": capture, "file": TRACE_DAT, "trace_clock": TRACE_CLOCK,
                "tool": trace_cmd or ""}  # fmt: skip
    return {"method": capture, "file": RAW_TRACE, "trace_clock": TRACE_CLOCK}


def new_capture(capture: str, instance: Instance, rundir: Path, trace_cmd: str | None) -> Capture:
    """The capture object for one traced run (not started yet)."""
    if capture == "trace-cmd":
        if trace_cmd is None:
            raise TracekitError("--capture trace-cmd: trace-cmd was not looked for (plan error)")
        return TraceCmdCapture(instance, rundir, trace_cmd)
    return RawCapture(instance, rundir / RAW_TRACE)
