"""The host facts collect records: the boot a bundle was collected in."""

from __future__ import annotations

import re
from pathlib import Path

from tracekit.host.procs import BOOT_ID
from tracekit.host.procs import boot_id as read_boot_id

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_the_boot_id_is_this_boots_uuid_and_stable_within_it() -> None:
    """Read here from the real /proc: a UUID, the same at every read of this boot."""
    first = read_boot_id()
    assert first is not None and UUID.fullmatch(first)
    assert read_boot_id() == first == BOOT_ID.read_text().strip()


def test_no_boot_id_where_the_kernel_gives_none(tmp_path: Path) -> None:
    """A missing or empty file: None (the bundle then counts as a boot of its own)."""
    assert read_boot_id(tmp_path / "absent") is None
    (tmp_path / "empty").write_text("\n")
    assert read_boot_id(tmp_path / "empty") is None
