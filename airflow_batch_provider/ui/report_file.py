"""Open a published run report for the api-server: a regular file under the report root, never through a link.

Whoever can run a task can write into the report root (the workers publish there), so a folder or
file there may be a symbolic link to ``/etc/passwd`` or the Fernet key, a hard link to either, a
FIFO that blocks the reader, or a file of many gigabytes. Checking a path first and opening it
afterwards leaves a gap in which a link can be swapped in, so the file is *opened* without following
links, one component at a time from the root (``O_NOFOLLOW`` on each, relative to the folder opened
before), and what was opened is checked (``fstat``): a regular file with one name and at most
:data:`MAX_REPORT_BYTES`. The body is then read from that open descriptor, a piece at a time, so a
GET costs one piece of memory whatever the file's size.

The root itself is the deployment's configuration (``[llm_batch] report_dir``) and may be a link
the deployer made. An object-store root (``s3://…``) has no links; its object is only size-checked.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from airflow_batch_provider.utils.storage import AnyPath, to_path

#: A report is a page of tables and SVG charts: a few hundred KB for a run of millions of rows. 64 MiB
#: leaves two orders of magnitude of room and still bounds what one GET makes the api-server send.
MAX_REPORT_BYTES = 64 * 1024 * 1024
PIECE = 64 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer (a hung worker thread).
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ReportNotServed(Exception):
    """The report is missing or is not a file the view serves (``too_large``: only its size is wrong)."""

    def __init__(self, too_large: bool = False) -> None:
        super().__init__("too large" if too_large else "not served")
        self.too_large = too_large


def open_report(root: str, parts: Sequence[str]) -> Iterator[bytes]:
    """Return the body of the report at ``root``/``parts`` as pieces of bytes; raise ReportNotServed.

    The checks are done and the file is open when this returns; the iterator closes it at its end.
    """
    if not parts or any(part in ("", ".", "..") or "/" in part or "\x00" in part for part in parts):
        raise ReportNotServed
    base = to_path(root)
    if not isinstance(base, Path):
        return _object_pieces(base.joinpath(*parts))
    fd = _open_beneath(str(base), parts)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:  # a folder, a FIFO, a device, a hard link
            raise ReportNotServed
        _check_size(info.st_size)
    except BaseException:
        os.close(fd)
        raise
    return _pieces(os.fdopen(fd, "rb", buffering=0), info.st_size)


def _open_beneath(root: str, parts: Sequence[str]) -> int:
    """Open ``root``/``parts`` following no link below ``root``; return the file's descriptor."""
    try:
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise ReportNotServed from None
    try:
        for name in parts[:-1]:
            inner = os.open(name, _DIR_FLAGS, dir_fd=folder)  # a link here: ELOOP or ENOTDIR
            os.close(folder)
            folder = inner
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=folder)
    except OSError:
        raise ReportNotServed from None
    finally:
        os.close(folder)


def _check_size(size: int) -> None:
    if size > MAX_REPORT_BYTES:
        raise ReportNotServed(too_large=True)


def _object_pieces(path: AnyPath) -> Iterator[bytes]:
    """Open an object of an object-store root after checking its size."""
    try:
        size = int(path.stat().st_size)
        _check_size(size)
        handle = path.open("rb")
    except (OSError, ValueError):
        raise ReportNotServed from None
    return _pieces(handle, size)


def _pieces(handle: IO[bytes], size: int) -> Iterator[bytes]:
    """Yield the first ``size`` bytes (what was checked: a file grown since is not sent further), then close."""
    with handle:
        left = size
        while left > 0 and (piece := handle.read(min(PIECE, left))):
            left -= len(piece)
            yield piece
