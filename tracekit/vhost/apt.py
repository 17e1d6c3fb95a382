"""A private apt state for Debian arm64 packages: never touches the host's apt or dpkg.

apt-get is pointed, option by option, at lists, caches and sources under tracekit's
cache, with an empty dpkg status (/dev/null), so it resolves the full dependency closure
of the named packages as if nothing were installed and downloads it for arm64.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError

MIRROR_ENV = "TRACEKIT_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
ARCH = "arm64"

# `apt-get -s install` prints one line per package: "Inst NAME (VERSION ORIGIN [ARCH])".
_INST_LINE = re.compile(r"^Inst (\S+) \((\S+) .*\[(\S+)\]\)")
_UNKNOWN_PACKAGE = re.compile(
    r"Unable to locate package (\S+)|Package '?(\S+?)'? has no installation"
)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class AptState:
    """Where one suite's private apt state lives and what it fetches from."""

    root: Path
    suite: str
    mirror: str = DEFAULT_MIRROR
    keyring: Path = KEYRING
    # Source packages (deb-src) instead of arm64 binaries, e.g. QEMU's plugin header.
    source: bool = False
    extra_suites: tuple[str, ...] = ()

    @property
    def archives(self) -> Path:
        """Where downloaded .deb files land."""
        return self.root / "cache" / "archives"


@dataclass(frozen=True, order=True)
class PackageVersion:
    """One package of the resolved closure, as apt chose it."""

    name: str
    version: str
    arch: str

    @property
    def deb_filename(self) -> str:
        """The file name apt gives the downloaded .deb (an epoch's ':' becomes %3a)."""
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.arch}.deb"


def mirror_from_env() -> str:
    """The Debian mirror: $TRACEKIT_DEBIAN_MIRROR or deb.debian.org."""
    return os.environ.get(MIRROR_ENV, DEFAULT_MIRROR).rstrip("/")


def sources_list(state: AptState) -> str:
    """The sources.list of the private state (one line a suite), signed by the Debian keyring."""
    kind = "deb-src" if state.source else "deb"
    suites = (state.suite, *state.extra_suites)
    return "".join(f"{kind} [signed-by={state.keyring}] {state.mirror} {s} main\n" for s in suites)


def apt_options(state: AptState) -> list[str]:
    """The `-o` options that confine apt-get to the private state, for arm64 only."""
    root = state.root
    settings = {
        "APT::Architecture": ARCH,
        "APT::Architectures": ARCH,
        "APT::Install-Recommends": "false",
        "APT::Sandbox::User": "root",
        "Dir::State::Lists": root / "lists",
        "Dir::State::status": "/dev/null",
        "Dir::Etc::SourceList": root / "etc" / "sources.list",
        "Dir::Etc::SourceParts": root / "etc" / "sources.list.d",
        "Dir::Etc::Preferences": root / "etc" / "preferences",
        "Dir::Etc::PreferencesParts": root / "etc" / "preferences.d",
        "Dir::Etc::Trusted": root / "etc" / "trusted.gpg",
        "Dir::Etc::TrustedParts": root / "etc" / "trusted.gpg.d",
        "Dir::Cache": root / "cache",
        "Debug::NoLocking": "1",
    }
    options: list[str] = []
    for key, value in settings.items():
        options += ["-o", f"{key}={value}"]
    return options


def check_tools(state: AptState) -> None:
    """Fail early, naming the Debian package, if apt-get or the keyring is missing."""
    if shutil.which("apt-get") is None:
        raise TracekitError(
            "apt-get not found: `tracekit vhost build` needs a Debian or Ubuntu machine "
            "with apt (install the 'apt' package)"
        )
    if not state.keyring.is_file():
        raise TracekitError(
            f"Debian archive keyring {state.keyring} is missing: install it with "
            "`apt-get install debian-archive-keyring`"
        )


def prepare(state: AptState) -> None:
    """Create the private state's directories and write its sources.list."""
    for sub in (
        "lists/partial",
        "cache/archives/partial",
        "etc/sources.list.d",
        "etc/preferences.d",
        "etc/trusted.gpg.d",
    ):
        (state.root / sub).mkdir(parents=True, exist_ok=True)
    (state.root / "etc" / "sources.list").write_text(sources_list(state))


def _apt_get(state: AptState, args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run apt-get confined to the private state; output is captured for messages."""
    argv = ["apt-get", "-q", *apt_options(state), *args]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _last_error(output: str) -> str:
    """The most telling line of apt's output (its last `E:` line), for one-line errors."""
    errors = [line[2:].strip() for line in output.splitlines() if line.startswith("E:")]
    return errors[-1] if errors else (output.strip().splitlines() or ["no output"])[-1]


def update(state: AptState, progress: Progress) -> None:
    """Refresh the package lists; with old lists present, a failed refresh only warns."""
    prepare(state)
    progress(f"apt: updating package lists for {state.suite} from {state.mirror}")
    done = _apt_get(state, ["update"])
    failed = done.returncode != 0 or "\nW: Failed to fetch" in done.stdout + done.stderr
    if not failed:
        return
    message = _last_error(done.stderr + done.stdout)
    if any((state.root / "lists").glob("*_Packages*")):
        progress(f"apt: warning: could not refresh the lists ({message}); using the old ones")
        return
    raise TracekitError(
        f"apt-get update for {state.suite} failed: {message}; check the network or set "
        f"${MIRROR_ENV} to a reachable Debian mirror"
    )


def parse_simulation(output: str) -> list[PackageVersion]:
    """The packages an `apt-get -s install` would install, sorted by name."""
    found = []
    for line in output.splitlines():
        match = _INST_LINE.match(line)
        if match:
            found.append(PackageVersion(*match.groups()))
    return sorted(found)


def unknown_package(output: str) -> str | None:
    """The package apt could not find, if that is why it failed."""
    match = _UNKNOWN_PACKAGE.search(output)
    return next(group for group in match.groups() if group) if match else None


def _install_failure(state: AptState, done: subprocess.CompletedProcess[str]) -> TracekitError:
    """A one-line error for a failed resolve or download, naming the package if known."""
    output = done.stderr + done.stdout
    missing = unknown_package(output)
    if missing:
        return TracekitError(
            f"Debian {state.suite} has no arm64 package {missing!r}: check the suite name "
            f"or the mirror (${MIRROR_ENV})"
        )
    return TracekitError(f"apt-get could not get the packages: {_last_error(output)}")


def resolve(state: AptState, packages: list[str]) -> list[PackageVersion]:
    """The full dependency closure of `packages`, with the versions apt would take."""
    done = _apt_get(state, ["-s", "install", *packages])
    if done.returncode != 0:
        raise _install_failure(state, done)
    return parse_simulation(done.stdout)


def download(
    state: AptState, packages: list[str], closure: list[PackageVersion], progress: Progress
) -> list[Path]:
    """Download the closure into the private cache; return one .deb path per package."""
    wanted = [state.archives / pkg.deb_filename for pkg in closure]
    missing = [path for path in wanted if not path.is_file()]
    if missing:
        progress(f"apt: downloading {len(missing)} of {len(wanted)} packages")
        done = _apt_get(state, ["-y", "--download-only", "install", *packages])
        if done.returncode != 0:
            raise _install_failure(state, done)
    absent = [path.name for path in wanted if not path.is_file()]
    if absent:
        raise TracekitError(
            f"apt reported success but {len(absent)} .deb files are missing (first: "
            f"{absent[0]}); delete {state.root} and run `tracekit vhost build` again"
        )
    return wanted


def download_source(state: AptState, package: str, version: str, dest: Path) -> list[Path]:
    """Download one source package at one version (.dsc and tarballs) into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = [
        "apt-get",
        "-q",
        *apt_options(state),
        "source",
        "--download-only",
        f"{package}={version}",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=dest)
    if done.returncode != 0 and " 404 " in done.stdout + done.stderr:
        raise TracekitError(
            f"the mirror has no files for {package} {version} (404), though {state.suite}'s "
            f"source index lists it: try another mirror (${MIRROR_ENV})"
        )
    if done.returncode != 0:
        raise TracekitError(
            f"apt-get source could not get {package} {version} from {state.suite}: "
            f"{_last_error(done.stderr + done.stdout)}; check the network or ${MIRROR_ENV}"
        )
    return sorted(dest.iterdir())


def download_package(state: AptState, package: str, version: str, dest: Path) -> Path:
    """Download one binary package at one version, without its dependencies, into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = ["apt-get", "-q", *apt_options(state), "download", f"{package}={version}"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=dest)
    output = done.stdout + done.stderr
    if done.returncode != 0 and " 404 " in output:
        raise TracekitError(
            f"the mirror has no file for {package} {version} (404), though {state.suite}'s "
            f"index lists it: try another mirror (${MIRROR_ENV})"
        )
    if done.returncode != 0:
        raise TracekitError(
            f"apt-get download could not get {package} {version} from {state.suite}: "
            f"{_last_error(output)}"
        )
    found = downloaded_deb(dest, package, version)
    if found is None:
        raise TracekitError(f"apt-get download reported success but left no {package} .deb")
    return found


def downloaded_deb(dest: Path, package: str, version: str) -> Path | None:
    """A .deb of `package` at `version` already in `dest` (any architecture)."""
    found = sorted(dest.glob(f"{package}_{version.replace(':', '%3a')}_*.deb"))
    return found[0] if found else None
