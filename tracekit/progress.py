"""How long work tells its caller how far it is: (done, total, item) before each item.

The library calls it; the CLI draws it (tracekit/cli/progress.py), on a terminal only.
"""

from __future__ import annotations

from collections.abc import Callable

# done items, all items, the item about to be worked on (a run id, a file name).
Steps = Callable[[int, int, str], None]
