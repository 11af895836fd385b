"""Reading files nafix did not make: only regular files are ever read.

A path a user, a model, a report folder or the cache names may be a FIFO, a socket or a device:
opening a FIFO for reading blocks until a writer comes (for ever), and a device may never end.
:func:`open_regular` opens without blocking (``O_NONBLOCK``), then checks what was opened with
``fstat`` on the open descriptor (no window between a check and the open), and only then reads.
Callers turn :class:`NotRegularFileError` (an ``OSError``) into their own sentence: an input error
for a file the user named, a cache miss for a cache entry.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO


class NotRegularFileError(OSError):
    """The path exists but is a folder, a FIFO, a socket or a device."""

    def __init__(self, path: str | os.PathLike[str], mode: int):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a regular file")
        super().__init__(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
                         f"is {kind}, not a regular file", str(path))
        self.kind = kind


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for binary reading, only when it is a regular file.

    Raises :class:`NotRegularFileError` for a folder, FIFO, socket or device (never blocking on a
    FIFO), and the usual ``OSError`` (``FileNotFoundError``, ``PermissionError`` ...) otherwise.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    flags |= getattr(os, "O_BINARY", 0)
    if not hasattr(os, "O_NONBLOCK"):  # pragma: no cover - Windows: no FIFOs to block on; check before opening
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(path, st.st_mode)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(path, st.st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file never blocks; plain reads from here on
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`)."""
    with open_regular(path) as fh:
        return fh.read()


def read_text(path: str | os.PathLike[str], *, encoding: str = "utf-8", errors: str = "strict") -> str:
    """The text of the regular file ``path`` (see :func:`open_regular`); universal newlines as
    ``Path.read_text``."""
    return decode_text(read_bytes(path), encoding=encoding, errors=errors)


def decode_text(data: bytes, *, encoding: str = "utf-8", errors: str = "strict") -> str:
    """``data`` as text with universal newlines, as ``Path.read_text`` gives it."""
    text = data.decode(encoding, errors)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def is_regular(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a regular file (following symlinks); False for anything else or an error."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


__all__ = ["NotRegularFileError", "open_regular", "read_bytes", "read_text", "decode_text", "is_regular"]
