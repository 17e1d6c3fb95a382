"""The ground-truth TCG plugin: QEMU's plugin header fetched, the plugin built, its argv.

The plugin (reproducer/groundtruth/) must be compiled against include/qemu/qemu-plugin.h
of the very QEMU that loads it. Debian ships that header only in the qemu source
package, so it is fetched through a private apt state with a deb-src line (the host's
apt is never touched), cut out of the upstream tarball and cached under
<cache>/vhost/groundtruth/<version>/, next to the plugin built from it.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.vhost import apt
from tracekit.vhost.cache import vhost_cache
from tracekit.vhost.ksource import source_state
from tracekit.vhost.qemu import QEMU

QEMU_PACKAGE = "qemu-system-arm"
HEADER = "qemu-plugin.h"
PLUGIN = "tkgt.so"
# QEMU_PLUGIN_VERSION the plugin is written for (7.2's API: no register reads).
PLUGIN_API = 1
# The log's bound: 16 Mi records of 32 bytes (512 MiB; a bookworm boot with one VM writes
# ~1 Mi, mostly DSBs); reservations past it are counted, never silently dropped.
DEFAULT_LIMIT = 16 << 20

Progress = Callable[[str], None]

_DEBIAN_VERSION = re.compile(r"\(Debian ([^)]+)\)")
_API_LINE = re.compile(rb"#define QEMU_PLUGIN_VERSION (\d+)")


@dataclass(frozen=True)
class QemuVersion:
    """The installed QEMU: its binary package version and the source it was built from."""

    binary: str
    source: str

    @property
    def key(self) -> str:
        """A directory name for this source version (':' of the epoch dropped)."""
        return self.source.replace(":", "_")


def plugin_source_dir() -> Path:
    """reproducer/groundtruth/ of the checkout this package runs from."""
    from tracekit.vhost.runner import project_tree

    return project_tree() / "reproducer" / "groundtruth"


def parse_debian_version(version_output: str) -> str | None:
    """The Debian version in `qemu-system-aarch64 --version`, e.g. '1:7.2+dfsg-7+deb12u18+b3'."""
    match = _DEBIAN_VERSION.search(version_output)
    return match.group(1) if match else None


def installed_qemu() -> QemuVersion:
    """The installed qemu-system-arm, checked against the binary that will run."""
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}\t${source:Version}", QEMU_PACKAGE],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or "\t" not in done.stdout:
        raise TracekitError(
            f"{QEMU_PACKAGE} is not installed as a Debian package: the ground-truth plugin "
            f"needs Debian's QEMU (`apt-get install {QEMU_PACKAGE}`)"
        )
    binary, source = done.stdout.split("\t", 1)
    runs = subprocess.run([QEMU, "--version"], capture_output=True, text=True, check=False)
    running = parse_debian_version(runs.stdout)
    check_same_version(binary, running)
    return QemuVersion(binary, source.strip())


def check_same_version(package: str, running: str | None) -> None:
    """One line if the qemu-system-aarch64 on PATH is not the packaged one the header fits."""
    if running != package:
        raise TracekitError(
            f"{QEMU} on PATH reports Debian version {running or 'none'}, but {QEMU_PACKAGE} "
            f"{package} is installed: the plugin must be built for the QEMU that loads it; "
            f"put Debian's {QEMU} first on PATH"
        )


def header_dir(version: QemuVersion) -> Path:
    """Where this QEMU's plugin header and the plugin built against it are cached."""
    return vhost_cache() / "groundtruth" / version.key


def host_suite() -> str:
    """The codename of the Debian release this machine runs (its QEMU's suite)."""
    try:
        release = Path("/etc/os-release").read_text()
    except OSError:
        release = ""
    match = re.search(r"^VERSION_CODENAME=(\w+)", release, re.M)
    if not match:
        raise TracekitError(
            "cannot tell this machine's Debian release (/etc/os-release has no "
            "VERSION_CODENAME): the QEMU plugin header comes from Debian's qemu source"
        )
    return match.group(1)


def header_from_tarball(orig: Path) -> bytes:
    """include/qemu/qemu-plugin.h out of QEMU's upstream tarball."""
    with tarfile.open(orig) as tar:
        for member in tar:
            if member.isfile() and member.name.endswith("/include/qemu/" + HEADER):
                extracted = tar.extractfile(member)
                if extracted is not None:
                    return extracted.read()
    raise TracekitError(f"{orig.name} has no include/qemu/{HEADER}: not a QEMU source tarball")


def check_not_patched(debian_tar: Path) -> None:
    """Refuse if a Debian patch changes the header: then the tarball's copy is not QEMU's."""
    with tarfile.open(debian_tar) as tar:
        for member in tar:
            extracted = tar.extractfile(member) if member.isfile() else None
            if extracted and b"include/qemu/" + HEADER.encode() in extracted.read():
                raise TracekitError(
                    f"Debian's {member.name} patches {HEADER}; the unpatched header would "
                    "not match the installed QEMU (not supported: build the plugin by hand)"
                )


def check_api(header: bytes) -> None:
    """One line if the header's plugin API is not the one the plugin is written for."""
    match = _API_LINE.search(header)
    api = int(match.group(1)) if match else None
    if api != PLUGIN_API:
        raise TracekitError(
            f"QEMU's {HEADER} declares plugin API {api}, the ground-truth plugin is written "
            f"for API {PLUGIN_API} (QEMU 7.2): this QEMU is not supported"
        )


def fetch_header(version: QemuVersion, progress: Progress) -> Path:
    """The cached qemu-plugin.h of `version`, fetched from Debian's source on first use."""
    cached = header_dir(version) / HEADER
    if cached.is_file():
        return cached
    state = source_state(host_suite())
    apt.check_tools(state)
    apt.update(state, progress)
    progress(f"groundtruth: fetching Debian's qemu source {version.source} for {HEADER}")
    with tempfile.TemporaryDirectory(prefix="tracekit-qemu-src-") as tmp:
        files = apt.download_source(state, "qemu", version.source, Path(tmp))
        orig = next((f for f in files if ".orig.tar." in f.name), None)
        debian = next((f for f in files if ".debian.tar." in f.name), None)
        if orig is None or debian is None:
            raise TracekitError(
                f"apt-get source qemu={version.source} brought {[f.name for f in files]}, "
                "without an .orig and a .debian tarball"
            )
        check_not_patched(debian)
        header = header_from_tarball(orig)
    check_api(header)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".partial")
    partial.write_bytes(header)
    partial.replace(cached)
    return cached


def plugin_sources_digest() -> str:
    """sha256 (12 hex digits) of the plugin's sources in this checkout."""
    digest = hashlib.sha256()
    for path in sorted(plugin_source_dir().iterdir()):
        if path.is_file() and (path.suffix in (".c", ".h") or path.name == "Makefile"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def build_plugin(progress: Progress, version: QemuVersion | None = None) -> Path:
    """The plugin for the installed QEMU, (re)built by make when its sources changed."""
    version = version or installed_qemu()
    header = fetch_header(version, progress)
    # Keyed by the sources too: checkouts of different plugin sources (worktrees, a
    # snapshot) never overwrite or reuse each other's build.
    out = header_dir(version) / f"build-{plugin_sources_digest()}"
    if shutil.which("make") is None or shutil.which("gcc") is None:
        raise TracekitError(
            "the ground-truth plugin needs make and gcc (`apt-get install build-essential`)"
        )
    done = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(plugin_source_dir()),
            f"QEMU_PLUGIN_INCLUDE={header.parent}",
            f"O={out}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise TracekitError(f"building the ground-truth plugin failed: {last}")
    return out / PLUGIN


def plugin_argv(
    plugin: Path, log: Path, limit: int = DEFAULT_LIMIT, sim: tuple[Path, Path] | None = None
) -> list[str]:
    """QEMU's -plugin option loading the plugin with its log file and bound, and with a
    simulated mechanism's plugin form and log when `sim` is (form, log)."""
    paths = (plugin, log, *(sim or ()))
    for path in paths:
        if "," in str(path):
            raise TracekitError(f"{path}: QEMU's -plugin option cannot take a path with a comma")
    extra = f",sim={sim[0]},simlog={sim[1]}" if sim else ""
    return ["-plugin", f"file={plugin},out={log},limit={limit}{extra}"]
