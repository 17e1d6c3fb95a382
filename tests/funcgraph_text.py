"""function_graph text as the kernel prints it (kernel/trace/trace_functions_graph.c),
generated from a call tree, for the funcgraph reader's tests.

The layout follows print_graph_prologue/duration/entry/return: `[abstime |] CPU) [proc |]
[mark] DURATION |  INDENT BODY`, durations as trace_print_graph_duration writes them
(seven digits of µs at most, so a call of 10 s or more has no decimals), the options
funcgraph-args, -retval (6.15+ ` /* ret=0x0 */`, 6.5 to 6.14 ` /* = 0x0 */`), -tail and
-proc, and the context-switch banner verif_pid prints when proc is off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HEADER = """\
# tracer: function_graph
#
# CPU  DURATION                  FUNCTION CALLS
# |     |   |                     |   |   |   |
"""


@dataclass
class Call:
    """One function call: its children make it a nested entry/exit, none a leaf."""

    name: str
    dur_ns: int
    children: list[Call] = field(default_factory=list)
    args: str = ""  # "a=1, b=0x2" as funcgraph-args prints them
    ret: str = "0x0"


@dataclass
class Style:
    """The tracer options that shape the text."""

    abstime: bool = False
    proc: bool = False
    args: bool = False
    retval: str = ""  # "", "new" (ret=) or "old" (= )
    tail: bool = False


def duration(ns: int) -> str:
    """trace_print_graph_duration: µs, decimals while the total stays within 7 digits."""
    us = str(ns // 1000)
    text = us if len(us) >= 7 else f"{us}.{ns % 1000:03d}"[: 8 if len(us) < 7 else None]
    return (text + " us ").ljust(11)


def mark(ns: int) -> str:
    """The overhead mark: $ > 1 s, @ > 100 ms, * > 10 ms, # > 1 ms, ! > 100 µs, + > 10 µs."""
    for limit, sign in ((10**9, "$"), (10**8, "@"), (10**7, "*"), (10**6, "#"), (10**5, "!")):
        if ns > limit:
            return sign
    return "+" if ns > 10**4 else " "


class Writer:
    """Renders calls on CPUs into lines, keeping the clock and the current task per CPU."""

    def __init__(self, style: Style, start_ns: int = 5_000_000_000) -> None:
        self.style = style
        self.now = start_ns
        self.lines: list[str] = []
        self.task: dict[int, str] = {}

    def _prefix(self, cpu: int, task: str, dur: int | None) -> str:
        """Everything before the body's `|  `."""
        out = ""
        if self.style.abstime:
            out += f"{self.now // 10**9:5d}.{self.now % 10**9 // 1000:06d} |  "
        out += f" {cpu}) "
        if self.style.proc:
            out += f"{task:^14} | "
        out += "              " if dur is None else f"{mark(dur)} {duration(dur)}"
        return out + "|  "

    def switch(self, cpu: int, task: str) -> None:
        """The context-switch banner when a CPU's task changes (proc off: verif_pid)."""
        prev = self.task.get(cpu)
        self.task[cpu] = task
        if prev is None or prev == task:
            return
        self.lines += [
            " ------------------------------------------",
            f" {cpu})  {prev:>12}  =>  {task:<12}",
            " ------------------------------------------",
            "",
        ]

    def call(self, cpu: int, c: Call, depth: int = 0) -> None:
        """One call and its children, advancing the clock."""
        ind = "  " * depth
        args = c.args if self.style.args else ""
        task = self.task[cpu]
        if not c.children:
            body = f"{c.name}({args});" + self._ret_comment(c, leaf=True)
            self.lines.append(self._prefix(cpu, task, c.dur_ns) + ind + body)
            self.now += c.dur_ns
            return
        start = self.now
        self.lines.append(self._prefix(cpu, task, None) + ind + f"{c.name}({args}) {{")
        self.now += 1000
        for child in c.children:
            self.call(cpu, child, depth + 1)
            self.now += 500
        self.now = max(self.now, start + c.dur_ns)
        self.lines.append(self._prefix(cpu, task, c.dur_ns) + ind + self._exit(c))

    def _ret_comment(self, c: Call, leaf: bool) -> str:
        """A leaf's ` /* ret=.. */` under funcgraph-retval."""
        if not self.style.retval:
            return ""
        return f" /* ret={c.ret} */" if self.style.retval == "new" else f" /* = {c.ret} */"

    def _exit(self, c: Call) -> str:
        """A nested call's closing brace."""
        if self.style.retval == "new":
            return f"}} /* {c.name} ret={c.ret} */"
        if self.style.retval == "old":
            return f"}} /* {c.name} = {c.ret} */"
        return f"}} /* {c.name} */" if self.style.tail else "}"

    def text(self) -> str:
        """The whole file."""
        return HEADER + "\n".join(self.lines) + "\n"


def count(c: Call) -> tuple[int, int]:
    """(entries, leaves) in a call tree."""
    if not c.children:
        return 1, 1
    sub = [count(x) for x in c.children]
    return 1 + sum(e for e, _ in sub), sum(leaf for _, leaf in sub)


def sample_tree() -> Call:
    """A syscall's tree: nested calls, leaves, a module function, an error return, a
    call over 10 s (no decimals) and one over 10 µs (a `+` mark)."""
    return Call("do_sys_openat2", 12_345_678_901, [
        Call("getname", 2_500, [Call("kmem_cache_alloc", 250, args="s=0xffff0000c0010000")]),
        Call("kvm_vcpu_ioctl [kvm]", 45_000, [Call("mutex_lock", 120), Call("might_fault", 80)],
             args="filp=0xffff000012345678, ioctl=0xae80, arg=0x0"),
        Call("do_filp_open", 12_345_000_000, [Call("path_openat", 999_999, ret="-2")],
             args="dfd=-100, pathname=0xffff00001000", ret="0xfffffffffffffffe"),
    ], args="dfd=-100, filename=0xffff800080000000, how=0xffff800080001234", ret="0x3")  # fmt: skip


def render(style: Style, cpus: tuple[int, ...] = (0, 1)) -> str:
    """Two tasks' trees on each CPU, with a switch between them."""
    w = Writer(style)
    for cpu in cpus:
        for task in ("cat-1234", "kworker/0:1-56"):
            w.switch(cpu, task)
            w.call(cpu, sample_tree())
    return w.text()
