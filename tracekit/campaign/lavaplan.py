"""A plan's [lava] table: where and how each cell runs on a LAVA board farm.

    [lava]
    device_type = "rk3399-rock-pi-4b"    # the farm's device type
    tags = ["big-little"]                # optional: device tags the job requires
    job_timeout = 120                    # minutes for the whole job (boot + collect)
    action_timeout = 90                  # minutes for any one action (the collect)
    pack_url = "https://store.example/tracekit-board.tar.gz"  # `tracekit board-pack`
    store = "https://store.example/upload"  # bundles are PUT to STORE/<campaign>/<cell>.tar.gz
    campaign = "a76-vmid"                # optional: the campaign's name in the store
    [lava.kernels.bookworm]              # per kernel axis value: what the deploy installs
    url = "https://store.example/6.1/Image"
    [lava.deploy]                        # the lab's deploy action for this device, as-is
    to = "tftp"
    nfsrootfs = { url = "https://store.example/rootfs.tar.xz", compression = "xz" }
    [lava.boot]                          # the lab's boot action for this device, as-is
    method = "u-boot"
    commands = "nfs"
    prompts = ["root@"]
    [lava.context]                       # job context (extra_kernel_args gains the cell's
    extra_kernel_args = "console=ttyS2"  # KVM mode and the rt CPU's isolation)

The deploy and boot tables are the farm's own (LAVA's schema checks them, tests use
lava_common.schemas); tracekit adds the cell's kernel, its kernel arguments and the test
action that unpacks the board pack, runs the cell's collect and uploads the bundle.
Every mistake is one line naming the key. Standard library only.
"""

from __future__ import annotations

from typing import Any

from tracekit.errors import TracekitError

REQUIRED = ("device_type", "pack_url", "store", "deploy", "boot")
# Key -> its type; lists hold strings.
KEYS: dict[str, type] = {
    "device_type": str,
    "tags": list,
    "job_timeout": int,
    "action_timeout": int,
    "priority": str,
    "visibility": str,
    "pack_url": str,
    "store": str,
    "campaign": str,
    "kernels": dict,
    "deploy": dict,
    "boot": dict,
    "context": dict,
}
DEFAULTS: dict[str, Any] = {
    "tags": [],
    "job_timeout": 120,
    "action_timeout": 90,
    "priority": "medium",
    "visibility": "public",
    "kernels": {},
    "context": {},
}
PRIORITIES = ("high", "medium", "low")
STORE_SCHEMES = ("http://", "https://", "file://")


def parse_lava(source: str, data: Any) -> dict[str, Any]:
    """The validated [lava] table with defaults filled in ({} when the plan has none)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _fail(source, "[lava] must be a table")
    for key, value in data.items():
        if key not in KEYS:
            raise _fail(source, f"[lava] has no key {key!r}; allowed: {', '.join(KEYS)}")
        if not isinstance(value, KEYS[key]):
            raise _fail(source, f"[lava] {key} must be a {KEYS[key].__name__}, not {value!r}")
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise _fail(source, f"[lava] lacks {missing[0]}")
    lava = DEFAULTS | data
    _check_values(source, lava)
    return lava


def _check_values(source: str, lava: dict[str, Any]) -> None:
    """Values that have a fixed set or shape."""
    if not all(isinstance(tag, str) for tag in lava["tags"]):
        raise _fail(source, "[lava] tags must be a list of strings")
    for key in ("job_timeout", "action_timeout"):
        if lava[key] < 1:
            raise _fail(source, f"[lava] {key} is in minutes and must be at least 1")
    if lava["action_timeout"] > lava["job_timeout"]:
        raise _fail(source, "[lava] action_timeout must not exceed job_timeout")
    if lava["priority"] not in PRIORITIES:
        raise _fail(source, f"[lava] priority must be one of {', '.join(PRIORITIES)}")
    if not lava["store"].startswith(STORE_SCHEMES):
        raise _fail(source, f"[lava] store must start with {', '.join(STORE_SCHEMES)}")
    for name, kernel in lava["kernels"].items():
        if not isinstance(kernel, dict) or not isinstance(kernel.get("url"), str):
            raise _fail(source, f"[lava.kernels.{name}] needs url, the kernel image to deploy")
    for table in ("deploy", "boot"):
        if not isinstance(lava[table].get("to" if table == "deploy" else "method"), str):
            what = "to (tftp, tmpfs, ...)" if table == "deploy" else "method (u-boot, qemu, ...)"
            raise _fail(source, f"[lava.{table}] needs {what}")
    if any(key in lava["deploy"] for key in ("kernel",)) and lava["kernels"]:
        raise _fail(source, "[lava.deploy] kernel and [lava.kernels] both given; keep one")


def _fail(source: str, message: str) -> TracekitError:
    """A plan mistake as one line naming the file."""
    return TracekitError(f"plan {source}: {message}")
