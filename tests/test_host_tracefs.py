"""The host tracefs layer on this machine's REAL tracefs, in instances of its own.

Needs root and a kernel with tracefs; skipped with the reason otherwise. Every test
checks that `snapshot()` reads the same after the run as before: that is the promise
that tracekit leaves the host as it found it. The raw capture has its own tests
(test_host_rawcapture.py); kprobes on a real arm64 kernel are checked in the emulated
host, since this machine's kernel has no kprobe_events.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import VhostBoot, register_vhost_check
from host_uprobes import libc_uprobe_target
from ringbuf_decoder import decoded_events

from tracekit.errors import TracekitError
from tracekit.host.cleanup import CleanupStack
from tracekit.host.instance import Instance, parse_cpu_stats
from tracekit.host.probes import (
    KernelSymbols,
    ProbeSet,
    define_kprobes,
    parse_probe,
    remove_leftovers,
)
from tracekit.host.tracefs import (
    Tracefs,
    find_tracefs_mount,
    restorable_value,
    snapshot,
)

# `root` (skips without root or tracefs) and `unchanged`.
pytest_plugins = ["host_tracefs_support"]


# --- pure helpers -------------------------------------------------------------------------


def test_find_tracefs_mount_prefers_the_standard_place() -> None:
    mounts = (
        "sysfs /sys sysfs rw 0 0\n"
        "tracefs /sys/kernel/debug/tracing tracefs rw 0 0\n"
        "tracefs /sys/kernel/tracing tracefs rw 0 0\n"
    )
    assert find_tracefs_mount(mounts) == Path("/sys/kernel/tracing")
    assert find_tracefs_mount("tracefs /mnt/my\\040trace tracefs rw 0 0") == Path("/mnt/my trace")
    assert find_tracefs_mount("sysfs /sys sysfs rw 0 0") is None


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("trace_clock", "local global [boot] mono\n", "boot"),
        ("events/sched/sched_switch/filter", "none\n", "0"),
        ("enable", "0*\n", "0"),
        ("buffer_size_kb", "7 (expanded: 1408)\n", "1408"),
        ("set_graph_function", "#### all functions enabled ####\n", ""),
        ("saved_cmdlines_size", "6552\n", "6552"),
    ],
)
def test_restorable_value(name: str, text: str, value: str) -> None:
    assert restorable_value(name, text) == value


def test_parse_cpu_stats() -> None:
    text = "entries: 3\noverrun: 7\noldest event ts:     0.000000\ndropped events: 2\n"
    assert parse_cpu_stats(text) == {
        "entries": 3,
        "overrun": 7,
        "oldest event ts": 0.0,
        "dropped events": 2,
    }


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "p:tracekit/free kvm_free_stage2_pgd mmu=%x0",
            "p:tracekit/free kvm_free_stage2_pgd mmu=%x0",
        ),
        (
            "r:free_ret kvm_free_stage2_pgd $retval",
            "r:tracekit/free_ret kvm_free_stage2_pgd $retval",
        ),
        ("p do_sys_openat2", "p:tracekit/p_do_sys_openat2 do_sys_openat2"),
        ("r16:tracekit/x kvm:f+4", "r16:tracekit/x kvm:f+4"),
    ],
)
def test_parse_probe_puts_it_in_our_group(text: str, line: str) -> None:
    assert parse_probe(text).line() == line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("p:kprobes/x do_sys_openat2", "only defines probes in its own group"),
        ("x:tracekit/y do_sys_openat2", "bad probe definition"),
        ("p:tracekit/", "bad probe definition"),
        ("p:tracekit/1x f", "bad probe event name"),
    ],
)
def test_parse_probe_rejects(text: str, message: str) -> None:
    with pytest.raises(TracekitError, match=message):
        parse_probe(text)


# --- root, mount, instances ---------------------------------------------------------------


def test_non_root_is_refused_before_anything_changes(unchanged: dict[str, object]) -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, try, report the message
        os.close(read_end)
        message = "no error"
        try:
            os.setgid(65534)
            os.setuid(65534)
            with CleanupStack() as stack:
                Tracefs.open(stack)
        except TracekitError as err:
            message = str(err)
        finally:
            os.write(write_end, message.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        message = pipe.read()
    os.waitpid(pid, 0)
    assert "needs root" in message
    assert "\n" not in message


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
@pytest.mark.usefixtures("root")  # needs root and tracefs, like the rest
def test_tracefs_is_mounted_when_absent_and_unmounted_after() -> None:
    # In a private mount namespace, so that the rest of the machine never notices.
    script = textwrap.dedent(
        """
        import subprocess
        from tracekit.host.cleanup import CleanupStack
        from tracekit.host.tracefs import PROC_MOUNTS, Tracefs, find_tracefs_mount
        while find_tracefs_mount(PROC_MOUNTS.read_text()):
            subprocess.run(["umount", str(find_tracefs_mount(PROC_MOUNTS.read_text()))], check=True)
        with CleanupStack() as stack:
            tracefs = Tracefs.open(stack)
            print("during", find_tracefs_mount(PROC_MOUNTS.read_text()), tracefs.exists("trace"))
        print("after", find_tracefs_mount(PROC_MOUNTS.read_text()))
        """
    )
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 and "unshare failed" in result.stderr:
        pytest.skip(f"cannot make a mount namespace here: {result.stderr.strip()}")
    assert result.stdout.splitlines() == ["during /sys/kernel/tracing True", "after None"], (
        result.stderr
    )


def test_instance_is_ours_stopped_and_removed(root: Path, unchanged: dict[str, object]) -> None:
    with CleanupStack() as stack:
        instance = Instance.create(Tracefs.open(stack))
        assert instance.name == f"tracekit-{os.getpid()}"
        assert instance.path.is_dir()
        assert instance.read("tracing_on").strip() == "0"
        assert instance.name in snapshot(root)["instances"]  # type: ignore[operator]
    assert not instance.path.exists()


# A child that creates its instance (events on, tracing), says READY and waits to be killed.
CHILD_KILLED_WITH_INSTANCE = textwrap.dedent(
    """
    import time
    from tracekit.host.cleanup import CleanupStack
    from tracekit.host.instance import Instance
    from tracekit.host.tracefs import Tracefs
    with CleanupStack() as stack:
        instance = Instance.create(Tracefs.open(stack))
        instance.enable_events(["sched/sched_switch"])
        instance.start()
        print(instance.name, flush=True)
        while True:
            time.sleep(3600)
    """
)


def test_stale_instance_of_a_killed_run_is_removed_next_time(
    root: Path, unchanged: dict[str, object]
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_KILLED_WITH_INSTANCE], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    name = child.stdout.readline().strip()
    child.kill()  # SIGKILL: no chance to clean up
    child.wait()
    child.stdout.close()
    assert (root / "instances" / name).is_dir()
    with CleanupStack() as stack:
        tracefs = Tracefs.open(stack)
        assert name in tracefs.stale_instances()
        assert name in remove_leftovers(tracefs)
    assert not (root / "instances" / name).exists()


# --- events, filters, options ----------------------------------------------------------------


def test_events_and_filters_only_in_the_instance(root: Path, unchanged: dict[str, object]) -> None:
    with CleanupStack() as stack:
        tracefs = Tracefs.open(stack)
        instance = Instance.create(tracefs)
        specs = ["sched/sched_switch", "sched:sched_waking", "irq", "timer/hrtimer_expire_entry"]
        if instance.has_event("syscalls/sys_enter_mprotect"):
            specs.append("syscalls/sys_enter_mprotect")
        instance.enable_events(specs, {"sched/sched_switch": "prev_pid != 0"})
        instance.set_buffer_size_kb(256)
        instance.set_trace_clock()
        during = snapshot(root, [instance.name])
        settings = during[f"instance:{instance.name}"]
        assert isinstance(settings, dict)
        assert "sched:sched_switch" in settings["set_event"]
        assert "irq:irq_handler_entry" in settings["set_event"]
        assert settings["filters"]["sched/sched_switch"] == "prev_pid != 0"
        assert settings["trace_clock"] == "boot"
        assert during["top"] == unchanged["top"]  # nothing at the top level changed
    assert not instance.path.exists()


@pytest.mark.parametrize(
    ("specs", "filters", "message"),
    [
        (["sched/no_such_event"], {}, "unknown event 'sched/no_such_event'"),
        (["no_such_system"], {}, "unknown event system 'no_such_system'"),
        (["sched/sched_switch"], {"sched/sched_waking": "pid > 1"}, "which is not enabled"),
        (["sched/sched_switch"], {"sched/sched_switch": "no_such_field == 1"}, "cannot write"),
    ],
)
def test_bad_events_and_filters_are_one_clear_line(
    specs: list[str], filters: dict[str, str], message: str, unchanged: dict[str, object]
) -> None:
    with pytest.raises(TracekitError, match=message) as err, CleanupStack() as stack:
        Instance.create(Tracefs.open(stack)).enable_events(specs, filters)
    assert "\n" not in str(err.value)


def test_record_task_names_raises_and_restores_saved_cmdlines(
    root: Path, unchanged: dict[str, object]
) -> None:
    with CleanupStack() as stack:
        instance = Instance.create(Tracefs.open(stack))
        instance.record_task_names()
        assert int((root / "saved_cmdlines_size").read_text()) >= 8192
        assert instance.read("options/record-tgid").strip() == "1"


def test_function_graph_in_the_instance_or_a_clear_reason(unchanged: dict[str, object]) -> None:
    with CleanupStack() as stack:
        instance = Instance.create(Tracefs.open(stack))
        reason = instance.function_graph_unavailable()
        if reason is None:
            instance.enable_function_graph(["schedule"])
            assert instance.read("current_tracer").strip() == "function_graph"
        else:
            assert "function_graph is not available" in reason
            with pytest.raises(TracekitError, match="function_graph is not available"):
                instance.enable_function_graph(["schedule"])


# --- probes ----------------------------------------------------------------------------------


def test_bad_kprobe_symbol_is_one_clear_line(unchanged: dict[str, object]) -> None:
    with pytest.raises(TracekitError) as err, CleanupStack() as stack:
        define_kprobes(Tracefs.open(stack), ["p:tracekit/x tracekit_no_such_function"])
    message = str(err.value)
    assert "'tracekit_no_such_function' does not exist in this kernel" in message
    assert "\n" not in message


def _a_probeable_function(symbols: KernelSymbols) -> str:
    """A function every x86 or arm64 kernel has, for a kprobe."""
    for name in ("do_sys_openat2", "do_sys_open", "vfs_read"):
        if symbols.has(name):
            return name
    pytest.skip("none of the usual kprobe targets is in this kernel's symbols")


def test_kprobe_in_our_instance_and_removed(root: Path, unchanged: dict[str, object]) -> None:
    if not (root / "kprobe_events").exists():
        pytest.skip("this kernel has no kprobe_events (CONFIG_KPROBE_EVENTS not set)")
    with CleanupStack() as stack:
        tracefs = Tracefs.open(stack)
        function = _a_probeable_function(KernelSymbols.load(tracefs))
        define_kprobes(
            tracefs, [f"p:tracekit/tk_test {function}", f"r:tracekit/tk_test_ret {function}"]
        )
        instance = Instance.create(tracefs)
        instance.enable_events(["tracekit/tk_test", "tracekit/tk_test_ret"])
        instance.start()
        Path("/proc/self/stat").read_text()  # opens a file: the probed path runs
        instance.stop()
        trace = instance.read("trace")
        assert "tk_test:" in trace and "tk_test_ret:" in trace
        assert "tracekit/tk_test" in (root / "kprobe_events").read_text()
    assert "tracekit/" not in (root / "kprobe_events").read_text()


def _append(path: Path, line: str) -> None:
    """Append one line to a probe list without truncating it (O_APPEND, no seek)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


@pytest.fixture
def foreign_uprobe(root: Path) -> Iterator[str]:
    """A probe defined by somebody else (another group), which tracekit must not touch."""
    if not (root / "uprobe_events").exists():
        pytest.skip("this kernel has no uprobe_events (CONFIG_UPROBE_EVENTS not set)")
    _append(root / "uprobe_events", f"p:tktest_foreign/getppid {libc_uprobe_target('getppid')}")
    yield "tktest_foreign/getppid"
    _append(root / "uprobe_events", "-:tktest_foreign/getppid")


def test_probes_are_enabled_in_our_instance_and_only_ours_removed(
    root: Path, foreign_uprobe: str, unchanged: dict[str, object]
) -> None:
    # The same mechanism as kprobes, on uprobe_events, which this kernel does have.
    with CleanupStack() as stack:
        tracefs = Tracefs.open(stack)
        probes = ProbeSet(tracefs, "uprobe_events")
        probes.define(parse_probe(f"p:tracekit/tk_getppid {libc_uprobe_target('getppid')}"))
        instance = Instance.create(tracefs)
        instance.enable_events(["tracekit/tk_getppid"])
        instance.start()
        subprocess.run([sys.executable, "-c", "import os; os.getppid()"], check=True)
        instance.stop()
        assert "tk_getppid:" in instance.read("trace")
        # Enabled in our instance only, not at the top level.
        assert (root / "events/tracekit/tk_getppid/enable").read_text().strip() == "0"
        with pytest.raises(TracekitError, match="already defined"):
            probes.define(parse_probe(f"p:tracekit/tk_getppid {libc_uprobe_target('getppid')}"))
    assert ProbeSet(tracefs, "uprobe_events").existing() == [foreign_uprobe]


def test_probes_of_a_killed_run_are_removed_next_time(
    root: Path, foreign_uprobe: str, unchanged: dict[str, object]
) -> None:
    _append(root / "uprobe_events", f"p:tracekit/tk_left_behind {libc_uprobe_target('getppid')}")
    with CleanupStack() as stack:
        assert remove_leftovers(Tracefs.open(stack)) == ["tracekit/tk_left_behind"]
    assert "tk_left_behind" not in (root / "uprobe_events").read_text()


# --- signals in the middle of tracing ------------------------------------------------------

# A child that sets everything up and is tracing (draining now and then) when signalled.
CHILD_TRACING = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tracekit.host.cleanup import CleanupStack, Interrupted
    from tracekit.host.instance import Instance
    from tracekit.host.rawcapture import RawCapture
    from tracekit.host.tracefs import Tracefs
    try:
        with CleanupStack() as stack:
            instance = Instance.create(Tracefs.open(stack))
            instance.set_buffer_size_kb(512)
            instance.set_trace_clock()
            instance.record_task_names()
            instance.enable_events(["sched", "irq"], {"sched/sched_switch": "prev_pid >= 0"})
            capture = RawCapture(instance, Path(sys.argv[1]))
            capture.start()
            instance.start()
            instance.write_marker("ready")
            capture.drain()
            print(instance.name, flush=True)
            while True:
                instance.write_marker("tracing")
                capture.drain()
    except Interrupted as stop:
        sys.exit(stop.exit_code)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_tracing_leaves_tracefs_as_before(
    root: Path, tmp_path: Path, signum: int, unchanged: dict[str, object]
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_TRACING, str(tmp_path / "capture")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    name = child.stdout.readline().strip()
    assert name.startswith("tracekit-"), child.stderr.read() if child.stderr else ""
    assert (root / "instances" / name).is_dir()
    child.send_signal(signum)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 128 + signum, stderr
    assert not (root / "instances" / name).exists()
    manifest = json.loads((tmp_path / "capture" / "capture.json").read_text())
    assert manifest["complete"] is False


def test_buffer_sizes_compare_as_pages(tmp_path: Path) -> None:
    # header_page as x86-64 and arm64 kernels with 4 KB pages print it.
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "header_page").write_text(
        "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
        "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
        "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
        "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n"
    )
    (tmp_path / "buffer_size_kb").write_text("7 (expanded: 1408)\n")
    before = snapshot(tmp_path)["top"]
    (tmp_path / "buffer_size_kb").write_text("1410\n")  # what the kernel shows once expanded
    after = snapshot(tmp_path)["top"]
    assert before == after == {"buffer_size_kb": "354 pages"}


# --- kprobes on a real arm64 kernel, in the emulated host -----------------------------------

register_vhost_check(
    "nvhe-a76", "host_tracefs_kprobes", "python3 /tracekit/tests/host_vhost_check.py"
)


@pytest.mark.vhost
def test_kprobes_and_preflight_in_the_emulated_arm64_host(
    vhost_boot: Callable[[str], VhostBoot],
) -> None:
    boot = vhost_boot("nvhe-a76")
    check = boot.checks["host_tracefs_kprobes"]
    assert check.status == 0, f"{check.stdout}\n{check.stderr}"
    seen = dict(line.split("=", 1) for line in check.stdout.splitlines() if "=" in line)
    assert seen["trace_has_entry"] == "True" and seen["trace_has_return"] == "True"
    assert seen["top_level_enable"] == "0"  # enabled in our instance only
    assert "'tracekit_no_such_function' does not exist in this kernel" in seen["bad_symbol"]
    assert seen["kprobe_events_after"] == "''"
    assert seen["restored"] == "True"
    # Preflight on the same boot: the configuration asks nVHE on Cortex-A76 under QEMU.
    assert seen["kvm_mode"] == boot.result.kvm_mode == "nvhe"
    assert seen["cores"] == "Cortex-A76"
    assert seen["emulation"] == "qemu-virt"
    capture = boot.result.out_dir / "checks" / "host_tracefs_kprobes" / "capture"
    names = {name for events in decoded_events(capture).values() for _, name, _ in events}
    assert {"tracekit/tk_open", "tracekit/tk_open_ret", "ftrace/print"} <= names


def test_mounts_are_parsed_once_for_runs_and_for_the_journal() -> None:
    """journal.py's undo and tracefs.py read /proc/mounts through one parser (tracefsio)."""
    import inspect

    from tracekit.host import journal
    from tracekit.host.tracefsio import parse_tracefs_mounts

    text = "tracefs /mnt/a\\011b tracefs rw 0 0\ntracefs /mnt/c\\134d tracefs rw 0 0\n"
    assert parse_tracefs_mounts(text) == [Path("/mnt/a\tb"), Path("/mnt/c\\d")]
    assert find_tracefs_mount(text) == Path("/mnt/a\tb")
    source = inspect.getsource(journal)
    assert "/proc/self/mounts" not in source and "subprocess" not in source  # no parser, no umount


def test_kprobe_misses_are_read_per_probe_from_kprobe_profile(tmp_path: Path) -> None:
    """kprobe_profile as trace_kprobe.c prints it: event (no group), hits, misses."""
    from tracekit.host.probes import read_misses

    (tmp_path / "kprobe_profile").write_text(
        f"  {'kvm_arm_vmid_update':<44} {812:>15} {0:>15}\n"
        f"  {'kvm_free_stage2_pgd_ret':<44} {9:>15} {2:>15}\n"
        f"  {'somebody_elses':<44} {1:>15} {7:>15}\n"
    )
    probes = [
        parse_probe("p:tracekit/kvm_arm_vmid_update kvm_arm_vmid_update"),
        parse_probe("r:tracekit/kvm_free_stage2_pgd_ret kvm_free_stage2_pgd"),
        parse_probe("p:tracekit/not_listed f"),
    ]
    with CleanupStack() as stack:
        found = read_misses(Tracefs(tmp_path, stack), probes)
    assert found == {"tracekit/kvm_arm_vmid_update": 0, "tracekit/kvm_free_stage2_pgd_ret": 2}
    (tmp_path / "kprobe_profile").unlink()
    with CleanupStack() as stack:
        assert read_misses(Tracefs(tmp_path, stack), probes) == {}


def test_a_kprobe_name_listed_twice_has_unknown_misses() -> None:
    """kprobe_profile prints no group: with perf probe's kprobes/kvm_arm_vmid_update beside
    ours the two lines cannot be told apart, so that probe's misses are left out
    (unknown), never the other's; names listed once still read."""
    from tracekit.host.probes import profile_misses

    text = (
        f"  {'kvm_arm_vmid_update':<44} {812:>15} {0:>15}\n"
        f"  {'kvm_arm_vmid_update':<44} {3:>15} {5:>15}\n"
        f"  {'kvm_free_stage2_pgd_ret':<44} {9:>15} {2:>15}\n"
    )
    probes = [
        parse_probe("p:tracekit/kvm_arm_vmid_update kvm_arm_vmid_update"),
        parse_probe("r:tracekit/kvm_free_stage2_pgd_ret kvm_free_stage2_pgd"),
    ]
    assert profile_misses(text, probes) == {"tracekit/kvm_free_stage2_pgd_ret": 2}
