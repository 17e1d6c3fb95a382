"""A writer for the "newc" cpio format the kernel unpacks as its initramfs.

Written here rather than calling cpio(1) so the archive can hold device nodes
(/dev/console) without mknod on the build machine, and so it is reproducible: entries in
sorted order, owned by root, with mtime 0.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

MAGIC = b"070701"
TRAILER = "TRAILER!!!"


def _pad(length: int) -> bytes:
    """The NUL bytes that bring `length` up to the next multiple of four."""
    return b"\0" * (-length % 4)


class CpioWriter:
    """Appends newc entries to a binary stream; call close() to write the trailer."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._next_inode = 1

    def _entry(
        self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)
    ) -> None:
        """Write one header, name and body, each padded as newc requires."""
        encoded = name.encode() + b"\0"
        fields = (
            self._next_inode,
            mode,
            0,
            0,
            1,
            0,
            len(data),
            0,
            0,
            rdev[0],
            rdev[1],
            len(encoded),
            0,
        )
        self._next_inode += 1
        header = MAGIC + b"".join(b"%08X" % value for value in fields)
        self._stream.write(header + encoded + _pad(len(header) + len(encoded)))
        self._stream.write(data + _pad(len(data)))

    def add_directory(self, name: str, perms: int = 0o755) -> None:
        """A directory entry (parents must come first)."""
        self._entry(name, stat.S_IFDIR | perms)

    def add_file(self, name: str, data: bytes, perms: int = 0o644) -> None:
        """A regular file with the given contents."""
        self._entry(name, stat.S_IFREG | perms, data)

    def add_symlink(self, name: str, target: str) -> None:
        """A symbolic link; its body is the target path."""
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def add_char_device(self, name: str, major: int, minor: int, perms: int = 0o600) -> None:
        """A character device node, e.g. dev/console (5, 1)."""
        self._entry(name, stat.S_IFCHR | perms, rdev=(major, minor))

    def close(self) -> None:
        """Write the trailer entry that ends the archive."""
        self._entry(TRAILER, 0)


def add_tree(writer: CpioWriter, root: Path) -> int:
    """Add every directory, file and symlink under `root` (sorted); return the entry count."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(dirnames + filenames):
            path = base / name
            arcname = path.relative_to(root).as_posix()
            info = path.lstat()
            perms = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                writer.add_symlink(arcname, os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                writer.add_directory(arcname, perms)
            elif stat.S_ISREG(info.st_mode):
                writer.add_file(arcname, path.read_bytes(), perms)
            else:
                continue  # sockets/fifos/devices never come out of .deb data archives
            count += 1
    return count
