"""`--capture trace-cmd`: one run's instance buffers into <run>/trace.dat by trace-cmd.

The run is recorded exactly as with the raw capture (tracekit's own instance, buffers
sized for the run, emptied between runs); only the read-out differs: `trace-cmd extract
-B <instance>` reads the instance's per-CPU buffers (and stores its per_cpu/cpuN/stats
as the file's CPUSTAT) instead of tracekit reading trace_pipe_raw itself. `-B` leaves the
top-level buffer alone. `-k` matters: without it trace-cmd 3.1 removes an instance it
extracted from, even one it did not create. trace-cmd writes its per-CPU temporary files
beside the output, so it writes into a local temporary directory and the finished file
is moved into the bundle, which may sit on a slow share (9p, NFS).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from tracekit.bundle import RunFile
from tracekit.errors import TracekitError
from tracekit.host.cleanup import CleanupStack
from tracekit.host.instance import Instance
from tracekit.host.rawcapture import DrainResult
from tracekit.host.tracefs import KPTR_RESTRICT

# The file a run's trace-cmd capture leaves in its run directory.
TRACE_DAT = RunFile.TRACE_DAT
# trace-cmd's own output (buffer statistics, errors), kept beside the file.
EXTRACT_LOG = "trace-cmd-extract.txt"
# Extracting 16 MB per CPU onto the emulated host's RAM disk takes seconds; this is slack.
EXTRACT_TIMEOUT_S = 600


def extract_argv(trace_cmd: str, instance: str, output: Path) -> list[str]:
    """trace-cmd extract of one instance only, keeping the instance and its settings."""
    return [trace_cmd, "extract", "-k", "-B", instance, "-o", str(output)]


class TraceCmdCapture:
    """Writes a run's trace.dat with `trace-cmd extract` when the run ends."""

    def __init__(self, instance: Instance, rundir: Path, trace_cmd: str) -> None:
        self.instance = instance
        self.rundir = rundir
        self.trace_cmd = trace_cmd
        self.cpus = instance.cpus()
        self.notes: list[str] = []

    @property
    def output(self) -> Path:
        """Where the run's trace.dat goes."""
        return self.rundir / TRACE_DAT

    def start(self) -> None:
        """Check that the run has no trace.dat yet (the buffers are empty already)."""
        self.rundir.mkdir(parents=True, exist_ok=True)
        if self.output.exists():
            raise TracekitError(f"{self.output} exists already; give a new bundle directory")

    def drain(self) -> DrainResult:
        """Nothing can be read out before the end: trace-cmd extract runs once per run."""
        return DrainResult()

    def finish(self) -> None:
        """Extract the instance's buffers into trace.dat, with kernel addresses visible."""
        argv = extract_argv(self.trace_cmd, self.instance.name, Path(TRACE_DAT))
        (self.rundir / f"{EXTRACT_LOG}.argv").write_text(json.dumps(argv) + "\n")
        with (
            tempfile.TemporaryDirectory(prefix="tracekit-extract-") as work,
            self.instance.tracefs.stack.scoped() as lift,
        ):
            self._show_kernel_addresses(lift)
            done = _run(argv, Path(work))
            (self.rundir / EXTRACT_LOG).write_bytes(done.stdout)
            made = Path(work) / TRACE_DAT
            if done.returncode != 0 or not made.is_file():
                raise TracekitError(
                    f"trace-cmd extract failed with exit status {done.returncode}; see "
                    f"{self.rundir / EXTRACT_LOG} (or collect with --capture raw)"
                )
            shutil.move(str(made), self.output)

    def _show_kernel_addresses(self, restore: CleanupStack) -> None:
        """kptr_restrict=2 hides kallsyms addresses even from root: lift it to 1 meanwhile."""
        if KPTR_RESTRICT.exists() and KPTR_RESTRICT.read_text().strip() == "2":
            self.instance.tracefs.set_file(KPTR_RESTRICT, "1", restore)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """Run trace-cmd in `cwd` with its output captured; a hang is an error."""
    try:
        return subprocess.run(
            argv,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=EXTRACT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise TracekitError(
            f"trace-cmd extract did not finish within {EXTRACT_TIMEOUT_S} s; it was stopped"
        ) from None
    except OSError as err:
        raise TracekitError(f"cannot run {argv[0]}: {err.strerror}") from None
