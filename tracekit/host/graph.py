"""`--function-graph`: follow the TLB-flush and stage-2 teardown paths, as the kernel allows.

Linux 6.11 and later run function_graph inside a tracefs instance, limited to the call
trees of chosen functions (set_graph_function). On older kernels the same functions get
an entry and a return kprobe each, which gives their durations but not their callees.
The bundle records which of the two was used, for which functions, and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.host.instance import Instance
from tracekit.host.probes import KernelSymbols


@dataclass
class GraphChoice:
    """How the paths are followed: function_graph, kprobes, or not at all."""

    method: str  # function_graph, kprobes, none
    functions: list[str]
    missing: list[str] = field(default_factory=list)
    reason: str = ""

    def kprobe_functions(self) -> list[str]:
        """The functions that need entry and return probes (the fallback's)."""
        return self.functions if self.method == "kprobes" else []


def choose_graph(instance: Instance, symbols: KernelSymbols, wanted: list[str]) -> GraphChoice:
    """function_graph in the instance where the kernel allows it, else entry/return kprobes."""
    offered = [name for name in wanted if symbols.has(name)]
    missing = [name for name in wanted if name not in offered]
    if not offered:
        return GraphChoice("none", [], missing, "none of these functions is in this kernel")
    unavailable = instance.function_graph_unavailable()
    # set_graph_function only takes what ftrace can hook (available_filter_functions).
    graphable = [name for name in offered if name in symbols.filter_functions]
    if unavailable is None and graphable:
        skipped = [name for name in offered if name not in graphable]
        reason = f"limited by {instance.graph_limit_file()}"
        if skipped:
            reason += f"; not traceable by ftrace: {', '.join(skipped)}"
        return GraphChoice("function_graph", graphable, missing + skipped, reason)
    reason = unavailable or "ftrace cannot hook these functions (not in available_filter_functions)"
    return GraphChoice("kprobes", offered, missing, reason)


def apply_graph(instance: Instance, choice: GraphChoice) -> None:
    """Start function_graph in the instance when that is the choice (kprobes come elsewhere)."""
    if choice.method == "function_graph":
        instance.enable_function_graph(choice.functions)
