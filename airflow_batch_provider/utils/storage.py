"""Paths on local disk or object storage, and crash-safe writes.

Every path the package handles may be a local path or any URL that Airflow's
``ObjectStoragePath`` understands (``s3://``, ``gs://``, ``file://`` ...). Writes that must
survive a crash go to a temporary name in the same folder and are renamed into place.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from airflow.sdk import ObjectStoragePath

AnyPath = Path | ObjectStoragePath


def to_path(path: str | os.PathLike[str]) -> AnyPath:
    """Return a :class:`pathlib.Path` for local paths, else an ``ObjectStoragePath``."""
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "://" not in text:
        return Path(text).expanduser().absolute()
    return ObjectStoragePath(text)


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """Join path parts onto ``base`` and return the result as a string (local or URL)."""
    return str(to_path(base).joinpath(*parts))


def makedirs(path: str | os.PathLike[str]) -> None:
    """Create a folder and its parents (a no-op on object stores without folders)."""
    to_path(path).mkdir(parents=True, exist_ok=True)


@contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Open ``path`` for writing through a temporary sibling that is renamed into place on success.

    A crash or exception leaves the previous file (if any) untouched and removes the temporary.
    """
    target = to_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open(mode) as handle:
            yield handle
            if isinstance(tmp, Path):
                handle.flush()
                os.fsync(handle.fileno())
        if isinstance(tmp, Path):
            os.replace(str(tmp), str(target))
        else:
            tmp.rename(target)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise


def remove_tree(path: AnyPath) -> None:
    """Delete a folder and everything under it; a missing folder is fine."""
    if isinstance(path, Path):
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.fs.rm(path.path, recursive=True)
