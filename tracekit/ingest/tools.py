"""Tool outputs -> polars tables: cyclictest (plain, -h histogram, --json, -v -N samples),
stress-ng (--metrics-brief text, --yaml) and `perf stat -x,` CSV (with or without -A / -I).

`read_tool(path)` recognises the tool from the content and returns named tables; the
schemas are listed in docs/tables.md. Lines a reader does not understand are counted in
the "skipped" list it returns, never dropped silently.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import polars as pl

from tracekit.errors import TracekitError

_N = r"\d{1,18}"  # Int64 holds 18 digits: a longer number is damage, not cyclictest's
CYCLIC_T_RE = re.compile(
    rf"^T:\s*(?P<thread>\d{{1,9}})\s+\(\s*(?P<tid>{_N})\)\s+P:\s*(?P<prio>{_N})\s+"
    rf"I:\s*(?P<interval>{_N})\s+C:\s*(?P<cycles>{_N})\s+Min:\s*(?P<min>{_N})\s+"
    rf"Act:\s*(?P<act>{_N})\s+Avg:\s*(?P<avg>{_N})\s+Max:\s*(?P<max>{_N})"
)
STRESS_METRIC_RE = re.compile(
    r"metrc: \[\d+\]\s+(?P<stressor>[\w-]+)\s+(?P<ops>\d+)\s+(?P<real>[\d.]+)\s+"
    r"(?P<usr>[\d.]+)\s+(?P<sys>[\d.]+)\s+(?P<rate_real>[\d.]+)\s+(?P<rate_cpu>[\d.]+)"
)

# cyclictest -v: its header line per thread, and its `thread: cycle: latency` samples.
CYCLIC_INTERVAL_RE = re.compile(r"^Thread \d+ Interval: \d+$", re.M)
CYCLIC_SAMPLES_RE = re.compile(r"^\s*\d+:\s*\d+:\s*\d+\s*$", re.M)

ToolTables = tuple[str, dict[str, pl.DataFrame], list[str]]


def detect_tool(head: str) -> str | None:
    """'cyclictest', 'stress-ng' or 'perf-stat' from the first KBs of a file, else None."""
    if '"rt_test_version:"' in head or re.search(r"^T:\s*\d+\s+\(", head, re.M):
        return "cyclictest"
    if head.startswith("# /dev/cpu_dma_latency") or "# Histogram" in head:
        return "cyclictest"
    if CYCLIC_INTERVAL_RE.search(head) or len(CYCLIC_SAMPLES_RE.findall(head)) >= 3:
        return "cyclictest"  # -v: `Thread N Interval: I` then `thread: cycle: latency` lines
    if "stress-ng" in head and ("metrc:" in head or "stress-ng-version" in head):
        return "stress-ng"
    if re.search(r"^\s*[\d.]*,?(CPU\d+,)?[\d.<>a-z ]+,[^,]*,[\w:-]+,\d+,[\d.]+", head, re.M):
        return "perf-stat"
    return None


def _cyclic_json(data: dict) -> dict[str, pl.DataFrame]:  # type: ignore[type-arg]
    """cyclictest --json: per-thread summary and the histogram (when -h was given)."""
    threads, hist = [], []
    for key, t in sorted(data.get("thread", {}).items(), key=lambda kv: int(kv[0])):
        threads.append(
            dict(thread=int(key), cpu=t.get("cpu"), cycles=t.get("cycles"), min_us=t.get("min"),
                 avg_us=float(t.get("avg", 0)), max_us=t.get("max"))
        )  # fmt: skip
        for bucket, count in (t.get("histogram") or {}).items():
            hist.append(dict(thread=int(key), latency_us=int(bucket), count=int(count)))
    out = {"cyclictest_threads": pl.DataFrame(threads)}
    if hist:
        out["cyclictest_histogram"] = pl.DataFrame(hist)
    return out


def _cyclic_text(lines: list[str], skipped: list[str]) -> dict[str, pl.DataFrame]:
    """Plain `T:` lines and/or the -h histogram with its per-thread summary lines."""
    threads: list[dict[str, int]] = []
    hist: list[dict[str, int]] = []
    summary: dict[str, list[int]] = {}
    overflow_cycles: list[dict[str, int]] = []
    for n, line in enumerate(lines, 1):
        if m := CYCLIC_T_RE.match(line.strip()):
            threads.append({k: int(v) for k, v in m.groupdict().items()})
        elif re.match(rf"^{_N}(\s+{_N})+\s*$", line):
            nums = [int(x) for x in line.split()]
            hist += [dict(thread=i, latency_us=nums[0], count=c) for i, c in enumerate(nums[1:])]
        elif m := re.match(r"^# (Total|Min Latencies|Avg Latencies|Max Latencies|"
                           r"Histogram Overflows):\s*(.*)$", line):  # fmt: skip
            if not re.fullmatch(rf"\s*(?:{_N}(?:\s+{_N})*)?\s*", m.group(2)):
                skipped.append(f"line {n}: {line[:60]!r} (not numbers)")
                continue
            summary[m.group(1)] = [int(x) for x in m.group(2).split()]
        elif m := re.match(rf"^# Thread (\d{{1,9}}):((?:\s+{_N})*)\s*$", line):
            overflow_cycles += [
                dict(thread=int(m.group(1)), cycle=int(c)) for c in m.group(2).split()
            ]
        elif line.strip() and not line.startswith("#"):
            skipped.append(f"line {n}: {line[:60]!r}")
    out: dict[str, pl.DataFrame] = {}
    if threads:
        out["cyclictest_threads"] = pl.DataFrame(threads).rename(
            {"min": "min_us", "act": "act_us", "avg": "avg_us", "max": "max_us"}
        )
    if hist:
        out["cyclictest_histogram"] = pl.DataFrame(hist).filter(pl.col("count") > 0)
    if summary:
        n = max(len(v) for v in summary.values())
        cols = {
            "thread": list(range(n)),
            **{_snake(k): v + [None] * (n - len(v)) for k, v in summary.items()},
        }
        out["cyclictest_summary"] = pl.DataFrame(cols)
    if overflow_cycles:
        out["cyclictest_overflows"] = pl.DataFrame(overflow_cycles)
    return out


def _snake(name: str) -> str:
    """'Max Latencies' -> 'max_latencies_us', 'Histogram Overflows' -> 'overflows'."""
    mapping = {"Total": "samples", "Histogram Overflows": "overflows"}
    return mapping.get(name, name.lower().replace(" ", "_") + "_us")


def _stress_yaml(text: str) -> list[dict[str, object]]:
    """The `metrics:` list of stress-ng --yaml (a flat subset of YAML, read by hand)."""
    rows: list[dict[str, object]] = []
    in_metrics = False
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            in_metrics = line.strip() == "metrics:"
            continue
        if not in_metrics or ":" not in line:
            continue
        key, _, value = line.strip().lstrip("- ").partition(":")
        if line.strip().startswith("- "):
            rows.append({})
        if rows:
            rows[-1][key.strip().replace("-", "_")] = _number(value.strip())
    return rows


def _number(text: str) -> object:
    """int, float, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip("'\"")


def _stress_brief(lines: list[str]) -> list[dict[str, object]]:
    """--metrics-brief `metrc:` lines."""
    rows: list[dict[str, object]] = []
    for line in lines:
        if m := STRESS_METRIC_RE.search(line):
            rows.append(
                dict(stressor=m["stressor"], bogo_ops=int(m["ops"]),
                     wall_clock_time=float(m["real"]), user_time=float(m["usr"]),
                     system_time=float(m["sys"]),
                     bogo_ops_per_second_real_time=float(m["rate_real"]),
                     bogo_ops_per_second_usr_sys_time=float(m["rate_cpu"]))
            )  # fmt: skip
    return rows


def _perf_stat(lines: list[str], skipped: list[str]) -> dict[str, pl.DataFrame]:
    """perf stat -x, CSV: optional interval time and CPU columns, then value,unit,event,..."""
    rows: list[dict[str, object]] = []
    for n, fields in enumerate(csv.reader(lines), 1):
        if not fields or fields[0].startswith("#") or len(fields) < 3:
            if fields and "".join(fields).strip() and not fields[0].startswith("#"):
                skipped.append(f"line {n}: {','.join(fields)[:60]!r}")
            continue
        fields = [f.strip() for f in fields]
        time_s = _float(fields[0]) if _is_interval(fields) else None
        if time_s is not None:
            fields = fields[1:]
        cpu = int(fields[0][3:]) if re.fullmatch(r"CPU\d{1,9}", fields[0]) else None
        if cpu is not None:
            fields = fields[1:]
        if len(fields) < 3:  # value, unit, event at least: a cut or damaged line
            skipped.append(f"line {n}: {','.join(fields)[:60]!r} (too few fields)")
            continue
        value = _float(fields[0])
        rows.append(
            dict(time_s=time_s, cpu=cpu, value=value, unit=fields[1] or None, event=fields[2],
                 run_time_ns=_float(fields[3]) if len(fields) > 3 else None,
                 running_pct=_float(fields[4]) if len(fields) > 4 else None,
                 note=fields[0] if value is None else None)
        )  # fmt: skip
    schema = {"time_s": pl.Float64, "cpu": pl.Int32, "value": pl.Float64, "unit": pl.String,
              "event": pl.String, "run_time_ns": pl.Float64, "running_pct": pl.Float64,
              "note": pl.String}  # fmt: skip
    return {"perf_stat": pl.DataFrame(rows, schema=schema)}


def _is_interval(fields: list[str]) -> bool:
    """-I output starts with a timestamp and has one more column than plain output."""
    return (
        re.fullmatch(r"\d+\.\d+", fields[0]) is not None
        and len(fields) >= 4
        and (re.fullmatch(r"CPU\d+", fields[1]) is not None or not re.search(r"[a-z]", fields[3]))
    )


def _float(text: str) -> float | None:
    """A number, or None for '<not counted>' / '<not supported>' / empty."""
    try:
        return float(text)
    except ValueError:
        return None


def read_tool(path: Path) -> ToolTables:
    """Read a tool output file: (tool name, tables, skipped-line notes)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise TracekitError(f"tool reader: {path}: {err}") from None
    tool = detect_tool(text[:8192])
    skipped: list[str] = []
    lines = text.splitlines()
    if tool == "cyclictest":
        if text.lstrip().startswith("{"):
            try:
                return tool, _cyclic_json(json.loads(text)), skipped
            except (json.JSONDecodeError, AttributeError, ValueError) as err:
                raise TracekitError(f"cyclictest reader: {path}: bad JSON: {err}") from None
        if any(CYCLIC_SAMPLE_RE.match(line) for line in lines):
            return tool, _cyclic_verbose(lines, str(path)), skipped
        return tool, _cyclic_text(lines, skipped), skipped
    if tool == "stress-ng":
        rows = _stress_yaml(text) if "stress-ng-version" in text else _stress_brief(lines)
        if not rows:
            raise TracekitError(f"stress-ng reader: {path}: no metrics (run with --metrics-brief)")
        return tool, {"stress_ng": pl.DataFrame(rows)}, skipped
    if tool == "perf-stat":
        return tool, _perf_stat(lines, skipped), skipped
    raise TracekitError(f"{path}: not a cyclictest, stress-ng or perf stat -x, output")


# %8d:%8d:%8ld: numbers of 8 digits or more fill their field, leaving no space.
CYCLIC_SAMPLE_RE = re.compile(
    rf"^\s*(?P<thread>\d{{1,9}}):\s*(?P<cycle>{_N}):\s*(?P<latency>{_N})\s*$"
)
# Lines cyclictest -v prints around its samples; none of them is a sample.
CYCLIC_VERBOSE_HEADER_RE = re.compile(
    r"^(#.*|Max CPUs = \d+|Online CPUs = \d+|Using \d+ cpus\.|Thread \d+ using cpu \d+\."
    r"|Thread \d+ Interval: \d+|T:\s*\d+\s+\(.*)$"
)
CYCLIC_SAMPLE_SCHEMA = {"thread": pl.Int32, "cycle": pl.Int64, "latency_ns": pl.Int64}


# The `T:` summary of -v output; with -N its Act and Avg fields are 8 wide, else 5.
CYCLIC_VERBOSE_T_RE = re.compile(
    rf"^T:\s*(?P<thread>\d{{1,9}})\s+\(\s*(?P<tid>{_N})\)\s+P:\s*(?P<prio>{_N})\s+"
    rf"I:\s*(?P<interval>{_N})\s+C:\s*(?P<cycles>{_N})\s+Min:\s*(?P<min>{_N})\s+"
    rf"Act:(?P<act>\s*{_N})\s+Avg:\s*(?P<avg>{_N})\s+Max:\s*(?P<max>{_N})"
)
NS_FIELD_WIDTH = 8


def read_cyclictest_verbose(path: Path, stopped: bool = False) -> pl.DataFrame:
    """cyclictest `-v -N` samples: one row per loop (thread, cycle, latency_ns).

    -v prints bare numbers: nanoseconds with -N, microseconds without. The `T:` summary
    line tells which (its fields are wider with -N); microseconds are scaled to ns. With
    no summary line (cyclictest killed) -N is assumed, as `tracekit collect` records.
    Header and summary lines are recognised and passed over; any other line is an error,
    so no sample is lost to a line the reader did not expect. `stopped`: cyclictest was
    stopped (a killed run, bundle.cut_files): a last line without its newline, possibly a
    shortened number, is left out, and no sample at all is an empty table.
    """
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise TracekitError(f"cyclictest reader: {path}: {err}") from None
    lines = text.splitlines()
    if stopped and not text.endswith("\n"):
        lines = lines[:-1]
    if stopped and not any(CYCLIC_SAMPLE_RE.match(line) for line in lines):
        return pl.DataFrame(schema=CYCLIC_SAMPLE_SCHEMA)
    return _cyclic_verbose(lines, str(path))["cyclictest_samples"]


def _cyclic_verbose(lines: list[str], source: str) -> dict[str, pl.DataFrame]:
    """-v output: every sample (cyclictest_samples) and the `T:` lines (cyclictest_threads)."""
    rows: list[tuple[int, int, int]] = []
    threads: list[dict[str, int]] = []
    for n, line in enumerate(lines, 1):
        if m := CYCLIC_SAMPLE_RE.match(line):
            rows.append((int(m["thread"]), int(m["cycle"]), int(m["latency"])))
        elif m := CYCLIC_VERBOSE_T_RE.match(line.strip()):
            threads.append({k: int(v) for k, v in m.groupdict().items()} | {"_w": len(m["act"])})
        elif line.strip() and not CYCLIC_VERBOSE_HEADER_RE.match(line.strip()):
            raise TracekitError(
                f"cyclictest reader: {source}: line {n} is not a `thread: cycle: latency` "
                f"sample ({line[:40]!r}); give the output of `cyclictest -v -N` unchanged"
            )
    if not rows:
        raise TracekitError(
            f"cyclictest reader: {source}: no samples; run cyclictest with -v -N to record them"
        )
    widths = [t.pop("_w") for t in threads]
    scale = 1000 if widths and max(widths) < NS_FIELD_WIDTH else 1  # microseconds: no -N
    samples = pl.DataFrame(rows, schema=CYCLIC_SAMPLE_SCHEMA, orient="row")
    out = {"cyclictest_samples": samples.with_columns(pl.col("latency_ns") * scale)}
    if threads:
        unit = {k: f"{k}_ns" for k in ("min", "act", "avg", "max")}
        table = pl.DataFrame(threads).rename(unit)
        out["cyclictest_threads"] = table.with_columns(pl.col(*unit.values()) * scale)
    return out
