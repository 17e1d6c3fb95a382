"""`tracekit ingest` and `tracekit events` through click, on real fixtures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from tracekit.cli import main

FIX = Path(__file__).parent / "fixtures" / "ingest"


def _copy(tmp: Path, name: str) -> str:
    """A private copy (the cache is written beside it)."""
    shutil.copy(FIX / name, tmp / name)
    return str(tmp / name)


def test_ingest_summary(tmp_path: Path) -> None:
    """The summary names the format, counts per type and CPU, and the losses."""
    res = CliRunner().invoke(main, ["ingest", _copy(tmp_path, "overrun.v7zstd.dat")])
    assert res.exit_code == 0, res.output
    assert "trace.dat v7 (zstd)" in res.output
    assert "sched_switch" in res.output and "cpu1" in res.output
    assert "cpu0 page_flag: 358 events" in res.output
    assert "cpu1 page_flag: count unknown" in res.output


def test_events_filters_and_formats(tmp_path: Path) -> None:
    """--event/--cpu filter; json and csv print every row asked for."""
    path = _copy(tmp_path, "small.v7zstd.dat")
    res = CliRunner().invoke(
        main, ["events", path, "--event", "sched_switch", "--cpu", "1", "--format", "json"]
    )
    rows = json.loads(res.output)
    assert rows and {r["cpu"] for r in rows} == {1} and "next_comm" in rows[0]
    res = CliRunner().invoke(main, ["events", path, "--format", "csv", "--limit", "5"])
    assert res.output.splitlines()[0].startswith("row,ts,cpu,common_pid")
    assert len(res.output.splitlines()) == 6


def test_user_mistakes_are_one_line(tmp_path: Path) -> None:
    """Missing file, unknown event, corrupt file: one 'tracekit: error:' line, exit 2."""
    bad = tmp_path / "bad.dat"
    bad.write_bytes((FIX / "small.v6.dat").read_bytes()[:30000])
    for args in (
        ["ingest", str(tmp_path / "missing.dat")],
        ["events", _copy(tmp_path, "small.v7.dat"), "--event", "nope"],
        ["ingest", str(bad)],
    ):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2
        assert res.output.startswith("tracekit: error: ") and res.output.count("\n") == 1


def test_events_cpu_takes_a_kernel_cpu_list_and_refuses_an_absent_cpu(tmp_path: Path) -> None:
    path = _copy(tmp_path, "small.v7zstd.dat")  # CPUs 0 and 1
    res = CliRunner().invoke(main, ["events", path, "--cpu", "0-1", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert {r["cpu"] for r in json.loads(res.output)} == {0, 1}
    res = CliRunner().invoke(main, ["events", path, "--cpu", "1,5-6"])
    assert res.exit_code != 0
    assert res.output.strip() == (
        "tracekit: error: --cpu 1,5-6: CPU 5-6 not in this trace, which recorded CPUs 0-1;"
        " pick from those"
    )
    res = CliRunner().invoke(main, ["events", path, "--cpu", "x"])
    assert res.exit_code != 0 and "bad CPU list 'x'" in res.output


def test_events_prints_addresses_in_hex(tmp_path: Path) -> None:
    path = _copy(tmp_path, "small.v7zstd.dat")
    args = ["events", path, "--event", "hrtimer_start", "--limit", "3"]
    rows = json.loads(CliRunner().invoke(main, [*args, "--format", "json"]).output)
    assert all(r["function"].startswith("0xffff") for r in rows)  # a kernel text address
    assert all(isinstance(r["expires"], int) for r in rows)  # a time stays a number
    csv = CliRunner().invoke(main, [*args, "--format", "csv"]).output
    assert ",0xffff" in csv.splitlines()[1]


def test_every_command_shows_an_example_its_options_accept() -> None:
    import shlex

    import click

    from tracekit.cli.examples import EXAMPLES

    def walk(group: click.Group, prefix: str) -> dict[str, click.Command]:
        found = {}
        ctx = click.Context(group)
        for name in group.list_commands(ctx):  # the root's commands load when asked for
            command = group.get_command(ctx, name)
            assert command is not None, name
            found[prefix + name] = command
            if isinstance(command, click.Group):
                found |= walk(command, f"{prefix}{name} ")
        return found

    commands = walk(main, "")
    assert set(EXAMPLES) == set(commands)
    for key, command in commands.items():
        help_text = command.get_help(click.Context(command, info_name=key))
        assert "Examples:" in help_text, key
        for line in EXAMPLES[key]:
            assert line in help_text
            words = shlex.split(line)
            words = words[words.index("tracekit") + 1 :]
            group: click.Command = main
            while isinstance(group, click.Group) and words:
                sub = group.get_command(click.Context(group), words[0])
                if sub is None:
                    break
                group, words = sub, words[1:]
            group.make_context(key, words)  # raises on an option the command does not take


def test_a_command_imports_only_its_own_module() -> None:
    import subprocess
    import sys

    probe = (
        "import sys; from click.testing import CliRunner; from tracekit.cli import main; "
        "CliRunner().invoke(main, ['verify', '--help']); "
        "print(sorted(m for m in sys.modules if m.startswith('tracekit.cli.')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['tracekit.cli.examples',", "'tracekit.cli.verify']"]
    listed = CliRunner().invoke(main, ["--help"]).output
    assert all(f"  {name} " in listed for name in ("vhost", "collect", "board-pack", "events"))


def test_a_bundle_ingest_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from vm_bundles import make_vm_bundle

    runs = {"guest-0": "teardown-6.1-a76", "guest-1": "cacheflush-1vcpu"}
    bundle = make_vm_bundle(tmp_path / "b", runs, "6.1.0-50-arm64")
    piped = CliRunner().invoke(main, ["ingest", str(bundle)])
    assert piped.exit_code == 0 and "ingest: runs" not in piped.output
    leader, follower = os.openpty()  # stderr is a terminal: the bar is drawn there
    done = subprocess.run(
        [sys.executable, "-m", "tracekit", "ingest", "--no-cache", str(bundle)],
        stdout=subprocess.PIPE, stderr=follower, timeout=120, check=True,
        cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    os.close(follower)
    drawn = b""
    while chunk := _read(leader):
        drawn += chunk
    os.close(leader)
    assert b"ingest: runs" in drawn and b"100%" in drawn
    assert b"ingest: runs" not in done.stdout  # the summary alone on stdout


def _read(fd: int) -> bytes:
    """What is left to read on a pty (b"" once it is drained or closed)."""
    import os
    import select

    if not select.select([fd], [], [], 1)[0]:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:  # the other side closed
        return b""
