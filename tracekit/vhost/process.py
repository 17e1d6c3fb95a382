"""Run QEMU in its own process group, pump its console, and always clean it up.

QEMU gets a new session, so stopping it means signalling the whole group: nothing is
left behind on timeout, Ctrl-C or SIGTERM, whichever comes first. A parent killed
outright (SIGKILL) cannot clean up: the kernel then kills QEMU (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

from tracekit.errors import TracekitError
from tracekit.host.cleanup import die_with_parent

STOP_GRACE_S = 5.0


class Terminated(Exception):
    """SIGTERM arrived while the emulated host was running."""


class Timeout(Exception):
    """The emulated host ran past its time budget."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into a Terminated exception (main thread only) while inside."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        """Unwind to the cleanup code instead of dying with QEMU still running."""
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it after a grace period, and reap QEMU."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group, if any
    proc.wait()


def run_pumping(argv: list[str], feed: Callable[[bytes], None], timeout_s: float) -> int:
    """Run `argv`, passing its output to `feed` as it comes; return its exit code.

    Raises Timeout past `timeout_s`, Terminated on SIGTERM; KeyboardInterrupt passes
    through. In every case the process group is gone when this returns or raises.
    """
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,  # async-signal-safe: one prctl call
        )
    except OSError as err:
        raise TracekitError(f"cannot start {argv[0]}: {err}") from err
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    try:
        with _sigterm_raises(), selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Timeout()
                if not selector.select(min(remaining, 1.0)):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                feed(chunk)
        return proc.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired as err:
        raise Timeout() from err
    finally:
        stop_group(proc)
        proc.stdout.close()
