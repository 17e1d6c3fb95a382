#!/usr/bin/env python3
"""Ingest benchmark: tracekit's binary ingest vs `trace-cmd report`, on several shapes.

Each shape is a trace recorded on this machine or generated here, cached under
$TRACEKIT_CACHE or ~/.cache/tracekit/bench (never in the repo), and timed against
`trace-cmd report` on the same file:

- v6: `dd bs=1` x2 (raw_syscalls, sched, timer, irq) into an instance of its own,
  `trace-cmd extract`, then `trace-cmd convert --file-version 6` (uncompressed).
- v7-zstd: the same recording as extracted: trace.dat v7, zstd (trace-cmd's default).
- sched-mix: `perf bench sched pipe` beside a 50 us sleep loop (sched, irq, timer, tlb:
  many small events), extracted (v7 zstd).
- large-1g: 2 KB trace_marker writes beside context switches with the stacktrace option
  (print, kernel_stack, sched_switch: a few large event types), extracted (v7 zstd),
  with buffers for 1 GB of markers and stopped once that much is written. This is the
  few-large-event-types shape: sized like the others (trace-cmd report takes 13-19 s on
  each), so its ratio measures per-byte work, as on the traces users record.
- large: the same recording, a tenth as long (103 MB, trace-cmd report about 1 s).
  Reported, but START-UP BOUND (marked so in the table): a process that only imports
  tracekit and polars takes 0.42 s, so no ingest can reach 5x of a 1 s trace-cmd run
  (the footer prints each shape's ceiling, trace-cmd's time over that floor). The 5x
  wall and 3x memory targets apply to every other shape.
- rawcap: the sched-mix workload captured by tracekit.host.rawcapture
  (docs/raw-capture.md). trace-cmd cannot read it, so its reference is `trace-cmd
  report` on the sched-mix file, compared per event; its own text (the instance's
  `trace` file, read before the capture) is kept beside it (rawcap.txt).
- funcgraph: generated. This kernel has no function_graph tracer, so a trace.dat v6 is
  written here with this machine's header_page, ftrace formats and kallsyms and per-CPU
  pages of funcgraph_entry/exit records (nested calls of real kernel text symbols, 60%
  leaves, whose entry and exit trace-cmd prints as one line).

Recording needs root and tracefs; `trace-cmd record` does not work on this machine,
`extract` does. Each contender runs in its own process so that its peak memory
(ru_maxrss) is its own: once to warm up, then --repeat times taking turns (a shared
machine's speed drifts); the figures are medians, and the spread (min-max of the ratio)
is printed. The ratio is trace-cmd's time over tracekit's on the same file (rawcap:
per event, against the sched-mix file), in wall time (what a user waits; tracekit
uses every core, trace-cmd one) and CPU time (the work). Peak RSS is set against the
trace's decompressed ring-buffer data. The tracekit children run with bytecode, as an
installed package does (PYTHONPYCACHEPREFIX in the cache, written by a first import
before any timing), also where PYTHONDONTWRITEBYTECODE is set.

    python3 benchmarks/ingest.py [--shape NAME ...] [--repeat 3] [--quick] [--record-only]

--quick makes small traces (a smoke test: no warm-up, one run) in their own cache
directory. On a shared machine, run timings when no emulated-host boot runs beside them;
--record-only makes the traces first, so the timed run does only the timing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
INSTANCE = "tk-ingest-bench"
SHAPES = ("sched-mix", "v7-zstd", "v6", "large", "rawcap", "funcgraph", "large-1g")
# Shapes whose trace-cmd time is within a few times the start-up floor: their ratio
# shows the fixed cost of a start, not the decode (see the module doc); marked in the table.
STARTUP_BOUND = frozenset({"large"})


@dataclass
class Size:
    """How big the recordings are (full or quick)."""

    buffer_kb: int  # per CPU
    dd_bytes: int  # per dd, for the syscall recording
    pipe_loops: int  # perf bench sched pipe loops
    seconds: float  # sleep loop / marker loop duration
    graph_events: int  # per CPU, generated
    big_bytes: int  # marker bytes at which large-1g stops


# Full: a few million events per shape, as users record them (the trace: 4.19 M).
FULL = Size(buffer_kb=96 * 1024, dd_bytes=2_500_000, pipe_loops=500_000, seconds=8.0,
            graph_events=2_000_000, big_bytes=1_000_000_000)  # fmt: skip
QUICK = Size(buffer_kb=1024, dd_bytes=20_000, pipe_loops=3_000, seconds=0.2, graph_events=20_000,
             big_bytes=10_000_000)  # fmt: skip
BIG = 10  # large-1g's recording: this many times large's duration and loops


def _cache_base() -> Path:
    """$TRACEKIT_CACHE or ~/.cache/tracekit."""
    return Path(os.environ.get("TRACEKIT_CACHE") or str(Path.home() / ".cache" / "tracekit"))


PYCACHE = _cache_base() / "bench" / "pycache"  # the children's bytecode (see measure)


def cache_root(quick: bool) -> Path:
    """Where the benchmark's traces go (quick ones apart)."""
    out = _cache_base() / "bench" / ("quick" if quick else "full")
    out.mkdir(parents=True, exist_ok=True)
    return out


# -- recording ---------------------------------------------------------------------------
def _instance(events: list[str], buffer_kb: int, options: dict[str, str]) -> Path:
    """A fresh instance of its own with these events and options, not yet tracing."""
    inst = TRACEFS / "instances" / INSTANCE
    if inst.exists():
        inst.rmdir()
    inst.mkdir()
    (inst / "buffer_size_kb").write_text(str(buffer_kb))
    (inst / "options" / "overwrite").write_text("0")  # stop when full: no overruns
    for name, value in options.items():
        (inst / "options" / name).write_text(value)
    for spec in events:
        (inst / "events" / spec / "enable").write_text("1")
    return inst


def _traced(inst: Path, workload: Callable[[], None]) -> None:
    """Run the workload with the instance tracing (the instance goes if it fails)."""
    (inst / "tracing_on").write_text("1")
    try:
        workload()
    except BaseException:
        (inst / "tracing_on").write_text("0")
        inst.rmdir()
        raise
    (inst / "tracing_on").write_text("0")


def _extract(inst: Path, out: Path) -> None:
    """trace-cmd extract the instance into out, then remove the instance."""
    try:
        subprocess.run(["trace-cmd", "extract", "-B", INSTANCE, "-o", str(out)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    finally:
        if inst.exists():
            inst.rmdir()


def _dd(size: Size) -> None:
    """Two `dd bs=1`: two syscalls (four raw_syscalls events) per byte, on both CPUs."""
    dd = ["dd", "if=/dev/zero", "of=/dev/null", "bs=1", f"count={size.dd_bytes}"]
    procs = [subprocess.Popen(dd, stderr=subprocess.DEVNULL) for _ in range(2)]
    for p in procs:
        p.wait()


def _sched_mix(size: Size) -> None:
    """Context switches (perf bench sched pipe) beside a 50 us sleep loop (hrtimers)."""
    pipe = _pipe_bench(size.pipe_loops)
    end = time.monotonic() + size.seconds
    while time.monotonic() < end and pipe.poll() is None:
        time.sleep(50e-6)
    _stop(pipe)  # the recording lasts `seconds` (or until the buffer is full)


def _pipe_bench(loops: int) -> subprocess.Popen:
    """`perf bench sched pipe` in a process group of its own (it forks its other end)."""
    return subprocess.Popen(["perf", "bench", "sched", "pipe", "-l", str(loops)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip


def _stop(pipe: subprocess.Popen) -> None:
    """End the pipe benchmark and the child it forked: terminating perf alone left the
    child waiting on its pipe for good, one per recording."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pipe.pid, signal.SIGTERM)
    pipe.wait()


def _large(inst: Path, size: Size, cap: int = 1 << 62) -> None:
    """2 KB marker writes beside context switches (each with a kernel stack), for
    `seconds` or until `cap` bytes of markers are written."""
    pipe = _pipe_bench(size.pipe_loops // 4)
    text = ("tracekit-bench " * 140)[:2000]
    end = time.monotonic() + size.seconds
    fd = os.open(inst / "trace_marker", os.O_WRONLY)  # no O_TRUNC: tracefs refuses it
    try:
        n = 0
        while time.monotonic() < end and n * len(text) < cap:
            try:
                os.write(fd, f"{n} {text}".encode())
            except OSError:  # EBADF: the buffer is full (the kernel reserves no room)
                break
            n += 1
    finally:
        os.close(fd)
        _stop(pipe)


SCHED_MIX_EVENTS = ["sched", "irq", "timer", "tlb"]


def record_syscalls(root: Path, size: Size) -> None:
    """v7-zstd (as extracted) and v6 (converted) of one dd recording."""
    inst = _instance(["raw_syscalls", "sched", "timer", "irq"], size.buffer_kb, {})
    _traced(inst, lambda: _dd(size))
    _extract(inst, root / "v7-zstd.dat")
    subprocess.run(["trace-cmd", "convert", "--file-version", "6", "-i", str(root / "v7-zstd.dat"),
                    "-o", str(root / "v6.dat")], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)  # fmt: skip


def record_sched_mix(root: Path, size: Size) -> None:
    """The sched/irq/timer/tlb mix, extracted."""
    inst = _instance(SCHED_MIX_EVENTS, size.buffer_kb, {})
    _traced(inst, lambda: _sched_mix(size))
    _extract(inst, root / "sched-mix.dat")


def record_large(root: Path, size: Size) -> None:
    """print, kernel_stack and sched_switch, extracted."""
    inst = _instance(["sched/sched_switch"], size.buffer_kb, {"stacktrace": "1"})
    _traced(inst, lambda: _large(inst, size))
    _extract(inst, root / "large.dat")


def record_large_big(root: Path, size: Size) -> None:
    """large's recording BIG times over, to big_bytes of markers (room for all of it on
    either CPU: the writer may stay on one)."""
    big = replace(size, seconds=size.seconds * BIG, pipe_loops=size.pipe_loops * BIG)
    buffer_kb = max(size.buffer_kb, size.big_bytes * 6 // 5 // 1024)
    inst = _instance(["sched/sched_switch"], buffer_kb, {"stacktrace": "1"})
    _traced(inst, lambda: _large(inst, big, size.big_bytes))
    _extract(inst, root / "large-1g.dat")


def record_rawcap(root: Path, size: Size) -> None:
    """The sched-mix workload as a tracekit raw capture, and its own text beside it."""
    from tracekit.host.cleanup import CleanupStack
    from tracekit.host.instance import Instance
    from tracekit.host.rawcapture import RawCapture
    from tracekit.host.tracefs import Tracefs

    out = root / "rawcap"
    if out.exists():
        shutil.rmtree(out)
    with CleanupStack() as stack:
        instance = Instance.create(Tracefs.open(stack))
        instance.set_buffer_size_kb(size.buffer_kb)
        instance.set_trace_clock()
        instance.record_task_names()
        instance.enable_events(SCHED_MIX_EVENTS)
        capture = RawCapture(instance, out)
        capture.start()
        instance.start()
        _sched_mix(size)
        instance.stop()
        with open(instance.path / "trace", "rb") as src, open(root / "rawcap.txt", "wb") as dst:
            shutil.copyfileobj(src, dst)  # the text first: the capture consumes the pages
        capture.finish()


# -- the generated function_graph trace ----------------------------------------------------
def _fmt_id(text: str) -> int:
    """The ID: line of a format file."""
    return int(next(line for line in text.splitlines() if line.startswith("ID:")).split()[1])


def _text_symbols(kallsyms: bytes) -> list[int]:
    """Addresses of kernel text symbols (t/T) of the kernel proper."""
    out = []
    for line in kallsyms.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in (b"t", b"T") and int(parts[0], 16):
            out.append(int(parts[0], 16))
    return out[: 1 << 16]


def _graph_records(n: int, pid: int, funcs: list[int], ids: tuple[int, int],
                   rng: random.Random) -> list[tuple[int, bytes]]:  # fmt: skip
    """n funcgraph records of one task: (time delta, payload), nested calls, depth < 12."""
    entry_id, exit_id = ids
    out: list[tuple[int, bytes]] = []
    stack: list[tuple[int, int]] = []  # (func, calltime)
    now = 1_000_000
    while len(out) < n:
        now += rng.randint(80, 900)
        if stack and (len(stack) >= 12 or rng.random() < 0.45):
            func, called = stack.pop()
            body = struct.pack("<HBBiQIIQQ", exit_id, 1, 0, pid, func, len(stack), 0, called, now)
            out.append((now, body))
            continue
        func = rng.choice(funcs)
        out.append((now, struct.pack("<HBBiQII", entry_id, 1, 0, pid, func, len(stack), 0)))
        if rng.random() < 0.6:  # a leaf: its exit follows at once (one line in the report)
            now += rng.randint(80, 400)
            body = struct.pack(
                "<HBBiQIIQQ", exit_id, 1, 0, pid, func, len(stack), 0, now - 200, now
            )
            out.append((now, body))
        else:
            stack.append((func, now))
    return out


def _pages(records: list[tuple[int, bytes]], page_size: int) -> bytes:
    """Ring-buffer pages (8-byte stamp, 8-byte commit, data) holding the records in order."""
    pages: list[bytes] = []
    i = 0
    while i < len(records):
        page_ts, last, body = records[i][0], records[i][0], bytearray()
        while i < len(records) and 16 + len(body) + 4 + len(records[i][1]) <= page_size:
            ts, payload = records[i]
            body += struct.pack("<I", ((ts - last) << 5) | (len(payload) // 4)) + payload
            last, i = ts, i + 1
        pages.append(struct.pack("<QQ", page_ts, len(body)) + body.ljust(page_size - 16, b"\0"))
    return b"".join(pages)


def _section(data: bytes, size_fmt: str) -> bytes:
    """A size-prefixed block of a trace.dat v6."""
    return struct.pack("<" + size_fmt, len(data)) + data


def generate_funcgraph(root: Path, size: Size) -> None:
    """A trace.dat v6 of generated funcgraph_entry/exit pages on two CPUs (see module doc)."""
    events = TRACEFS / "events"
    ftrace = sorted(p for p in (events / "ftrace").iterdir() if (p / "format").exists())
    formats = {p.name: (p / "format").read_bytes() for p in ftrace}
    ids = (
        _fmt_id(formats["funcgraph_entry"].decode()),
        _fmt_id(formats["funcgraph_exit"].decode()),
    )
    kallsyms = Path("/proc/kallsyms").read_bytes()
    funcs = _text_symbols(kallsyms)
    if not funcs:
        sys.exit("benchmarks/ingest.py: /proc/kallsyms shows no addresses (run as root)")
    rng = random.Random(23)
    cpu_pages = [_pages(_graph_records(size.graph_events, 4000 + c, funcs, ids, rng), 4096)
                 for c in range(2)]  # fmt: skip
    head = b"\x17\x08\x44tracing6\0" + bytes([0, 8]) + struct.pack("<I", 4096)
    head += b"header_page\0" + _section((events / "header_page").read_bytes(), "Q")
    head += b"header_event\0" + _section((events / "header_event").read_bytes(), "Q")
    head += struct.pack("<I", len(formats)) + b"".join(_section(f, "Q") for f in formats.values())
    head += struct.pack("<I", 0)  # no other event systems
    head += _section(kallsyms, "I") + _section(b"", "I")  # kallsyms, printk formats
    head += _section(b"4000 bench-graph\n4001 bench-graph\n", "Q")
    head += struct.pack("<I", 2) + b"options  \0" + struct.pack("<H", 0) + b"flyrecord\0"
    data_at = -(-(len(head) + 32) // 4096) * 4096
    table, at = b"", data_at
    for pages in cpu_pages:
        table += struct.pack("<QQ", at, len(pages))
        at += len(pages)
    out = root / "funcgraph.dat"
    out.write_bytes((head + table).ljust(data_at, b"\0") + b"".join(cpu_pages))


MAKERS: dict[str, tuple[str, Callable[[Path, Size], None]]] = {
    "v6": ("v6.dat", record_syscalls),
    "v7-zstd": ("v7-zstd.dat", record_syscalls),
    "sched-mix": ("sched-mix.dat", record_sched_mix),
    "large": ("large.dat", record_large),
    "large-1g": ("large-1g.dat", record_large_big),
    "rawcap": ("rawcap", record_rawcap),
    "funcgraph": ("funcgraph.dat", generate_funcgraph),
}


def ensure(shape: str, root: Path, size: Size) -> Path:
    """The shape's trace, made if the cache does not hold it."""
    name, make = MAKERS[shape]
    path = root / name
    if not path.exists() or (shape == "rawcap" and not (path / "capture.json").exists()):
        if os.geteuid() != 0 and shape != "funcgraph":
            sys.exit(f"benchmarks/ingest.py: recording {shape} needs root (tracefs)")
        make(root, size)
    return path


# -- measuring -------------------------------------------------------------------------------
Figures = tuple[float, float, int, str]


def measure(argv: list[str], stdout: Path | None = None, source: Path | None = None) -> Figures:
    """Run argv (with `source` first on PYTHONPATH); return (wall seconds, CPU seconds, peak
    RSS in bytes, its stderr)."""
    out = open(stdout, "w") if stdout else subprocess.DEVNULL  # noqa: SIM115
    env = dict(os.environ, PYTHONPATH=str(source)) if source else dict(os.environ)
    # Bytecode, as an installed package has it: with PYTHONDONTWRITEBYTECODE set (as on
    # this machine) every run would compile tracekit's sources again. The cache is ours,
    # so no tree timed gets a __pycache__.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, text=True, env=env)
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if stdout:
        out.close()  # type: ignore[union-attr]
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"benchmark step failed: {' '.join(argv)}\n{err}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, err


# Children run with -P: without it `python -c` puts the working directory first on
# sys.path, and a checkout there would shadow the tracekit given by PYTHONPATH.
TRACEKIT_CHILD = (
    "import sys, tracekit; t = tracekit.open(sys.argv[1], use_cache=False); "
    "print(t.events.height, t.meta.get('cpu_bytes', 0), file=sys.stderr)"
)
BASELINE_CHILD = "import tracekit, polars"


Contender = tuple[list[str], Path | None, Path | None]  # argv, its stdout, its tracekit


def runs(contenders: list[Contender], repeat: int, warm: bool) -> list[list[Figures]]:
    """Each contender once to warm up (unless not warm), then `repeat` times taking turns."""
    if warm:
        for c in contenders:
            measure(*c)
    done: list[list[Figures]] = [[] for _ in contenders]
    for _ in range(max(repeat, 1)):
        for c, got in zip(contenders, done, strict=True):
            got.append(measure(*c))
            os.sync()  # written output goes back to disk now, not under the next contender
    return done


@dataclass
class Row:
    """One shape's figures with one tracekit source."""

    shape: str
    source: str
    events: int
    ref_events: int
    data_bytes: int
    tc: list[Figures]
    tk: list[Figures]

    same_file: bool = True  # trace-cmd read the file tracekit read (not so for rawcap)

    def ratios(self, k: int) -> list[float]:
        """Per run pair, trace-cmd's time over tracekit's (k: 0 wall, 1 CPU).

        On the same file, the times themselves: trace-cmd's line count is not an event
        count (a kernel stack is several lines, a leaf call's entry and exit one), so a
        per-line rate would misstate it. Only rawcap, whose reference is another
        recording (the sched-mix file, whose lines are its events), goes per event.
        """
        scale = self.events / self.ref_events if not self.same_file else 1.0
        return [a[k] / b[k] * scale for a, b in zip(self.tc, self.tk, strict=True)]


def reference_events(text: Path) -> int:
    """Lines of trace-cmd report's output that are events (not its cpus= header)."""
    with open(text, "rb") as f:
        return sum(1 for line in f if not line.startswith((b"cpus=", b"#", b"version =")))


def bench(
    shape: str, root: Path, size: Size, repeat: int, warm: bool, sources: dict[str, Path]
) -> list[Row]:
    """Time trace-cmd report and each tracekit source on one shape."""
    path = ensure(shape, root, size)
    ref = ensure("sched-mix", root, size) if shape == "rawcap" else path
    text = root / f"{shape}.report.txt"
    child = [sys.executable, "-P", "-c", TRACEKIT_CHILD, str(path)]
    tc, *tks = runs(
        [(["trace-cmd", "report", str(ref)], text, None)]
        + [(child, None, source) for source in sources.values()],
        repeat, warm,
    )  # fmt: skip
    rows = []
    for name, tk in zip(sources, tks, strict=True):
        events, data_bytes = (int(x) for x in tk[-1][3].split()[-2:])
        ref_events = reference_events(text)
        rows.append(Row(shape, name, events, ref_events, data_bytes, tc, tk, ref == path))
    return rows


def _spread(values: list[float]) -> str:
    """median (min-max)."""
    return f"{statistics.median(values):5.1f} ({min(values):.1f}-{max(values):.1f})"


HEAD = ("shape", "tracekit", "events", "ref ev", "data MB", "tc wall", "tk wall", "tk CPU",
        "x wall (min-max)", "x CPU (min-max)", "peak MB", "peak/data (min-max)")  # fmt: skip
WIDTHS = (10, 9, 10, 10, 8, 8, 8, 7, 18, 18, 8, 22)


def header(repeat: int) -> None:
    """The table's head (rows follow shape by shape, as they are measured)."""
    print(f"medians of {repeat} runs; load average {_load()} at the start")
    cells = zip(HEAD, WIDTHS, strict=True)
    print("".join(f"{h:>{w}}" if i else f"{h:<{w}}" for i, (h, w) in enumerate(cells)), flush=True)


def _load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_row(r: Row) -> None:
    """One shape's figures with one tracekit source."""
    peak = statistics.median(f[2] for f in r.tk)
    # The peak's spread too: where it is set (the events table's construction) it moved
    # by 15-30 MB from run to run with what the allocators kept (docs/ingest-speed.md).
    peaks = [f[2] / max(r.data_bytes, 1) for f in r.tk]
    shape = r.shape + ("*" if r.shape in STARTUP_BOUND else "")
    cells = (
        f"{shape:<10}", f"{r.source:>9}", f"{r.events:>10}", f"{r.ref_events:>10}",
        f"{r.data_bytes / 1e6:>8.1f}", f"{statistics.median(f[0] for f in r.tc):>8.2f}",
        f"{statistics.median(f[0] for f in r.tk):>8.2f}",
        f"{statistics.median(f[1] for f in r.tk):>7.2f}", f"{_spread(r.ratios(0)):>18}",
        f"{_spread(r.ratios(1)):>18}", f"{peak / 1e6:>8.0f}",
        f"{peak / max(r.data_bytes, 1):>10.2f} ({min(peaks):.2f}-{max(peaks):.2f})",
    )  # fmt: skip
    print("".join(cells), flush=True)


def floor(repeat: int) -> tuple[list[Figures], list[Figures]]:
    """A bare interpreter, and a process that only imports tracekit and polars: what any
    ingest pays before it reads a byte, timed `repeat` times (after one warm-up)."""
    bare = [sys.executable, "-P", "-c", "pass"]
    imports = [sys.executable, "-P", "-c", BASELINE_CHILD]
    measure(imports)
    return [measure(bare) for _ in range(repeat)], [measure(imports) for _ in range(repeat)]


def footer(bare: list[Figures], imports: list[Figures], rows: list[Row]) -> None:
    """What the columns mean, the start-up floor and what it allows, the load at the end."""
    wall, cpu = (statistics.median(f[k] for f in imports) for k in (0, 1))
    print(
        f"floor: bare interpreter {statistics.median(f[0] for f in bare):.3f} s wall; a process"
        f" that only imports tracekit, polars {wall:.3f} s wall, {cpu:.3f} s CPU,"
        f" {statistics.median(f[2] for f in imports) / 1e6:.0f} MB RSS"
    )
    for shape in dict.fromkeys(r.shape for r in rows if r.same_file):
        tc = statistics.median(f[0] for f in next(r for r in rows if r.shape == shape).tc)
        print(f"  {shape}: trace-cmd {tc:.2f} s / floor {wall:.3f} s = at most {tc / wall:.1f}x")
    print(f"* start-up bound (targets not applied): {', '.join(sorted(STARTUP_BOUND))}")
    print("ref ev: trace-cmd report's event lines (a leaf call's entry+exit is one line, a "
          "kernel stack several; rawcap: the sched-mix file's)")  # fmt: skip
    print(f"load average at the end: {_load()}")


def main() -> None:
    """Make (or take from the cache) each shape, time both readers, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", choices=SHAPES, help="default: every shape")
    ap.add_argument("--repeat", type=int, default=3, help="runs per contender (medians)")
    ap.add_argument("--quick", action="store_true", help="small traces, one run, no warm-up")
    ap.add_argument("--record-only", action="store_true", help="make the traces, time nothing")
    ap.add_argument(
        "--tracekit",
        action="append",
        metavar="NAME=DIR",
        help="time the tracekit package under DIR (repeat for a before/after table, e.g. an "
        "older commit's tree from git archive); default: this checkout's",
    )
    args = ap.parse_args()
    if shutil.which("trace-cmd") is None:
        sys.exit("benchmarks/ingest.py needs trace-cmd (apt-get install trace-cmd)")
    size, root = (QUICK if args.quick else FULL), cache_root(args.quick)
    shapes = args.shape or list(SHAPES)
    if args.record_only:
        for shape in shapes:
            print(shape, ensure(shape, root, size))
        return
    repeat = 1 if args.quick else args.repeat
    sources = {n: Path(d).resolve() for n, _, d in (t.partition("=") for t in args.tracekit or [])}
    sources = sources or {"this": Path(__file__).resolve().parents[1]}
    for source in sources.values():  # bytecode before any timing (see measure)
        measure([sys.executable, "-P", "-c", "import tracekit.ingest"], source=source)
    header(repeat)
    rows = []
    for shape in shapes:
        for row in bench(shape, root, size, repeat, not args.quick, sources):
            print_row(row)
            rows.append(row)
    footer(*floor(repeat), rows)


if __name__ == "__main__":
    main()
