"""Paths on local disk or object storage, and crash-safe writes.

Every path the package handles may be a local path or any URL that Airflow's
``ObjectStoragePath`` understands (``s3://``, ``gs://``, ``file://`` ...).

Publishing, so that a reader never sees a half-written file and a crash leaves nothing that
looks finished:

- local disk: write to a temporary name in the same folder, fsync, rename into place (atomic);
- object stores have no rename (S3's is a copy plus a delete, neither atomic together), but an
  object PUT — or the completion of a multipart upload — is: a reader sees the previous object or
  the new one whole. So the object itself is written, and a write that fails is *discarded*
  (fsspec's file would otherwise commit the half it got on close); a process killed mid-write
  never completes its upload, so nothing appears. A folder is published by copying its files
  with the one that marks it complete (the manifest) copied last, after the old marker was
  deleted first (:func:`publish_folder`).
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
    """Open ``path`` for writing so that it appears whole on success and not at all on failure.

    Local: through a temporary sibling renamed into place. Object store: the object itself, one
    atomic PUT / multipart completion, discarded on an exception. Either way a crash or exception
    leaves the previous file (if any) untouched.
    """
    target = to_path(path)
    if not isinstance(target, Path):
        with _object_write(target, mode) as handle:
            yield handle
        return
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


@contextmanager
def _object_write(target: ObjectStoragePath, mode: str) -> Iterator[IO[Any]]:
    """Write one object; on an exception abort the upload instead of committing what was written."""
    # The file system's own file: ObjectStoragePath.open() wraps it in a lineage tracker that hides discard().
    handle = target.fs.open(target.path, mode)
    try:
        yield handle
    except BaseException:
        _discard(handle)
        raise
    handle.close()


def _discard(handle: IO[Any]) -> None:
    """Drop a half-written object: fsspec's ``close()`` (and so ``with``) would upload the part written."""
    from fsspec.spec import AbstractBufferedFile

    if isinstance(handle, AbstractBufferedFile):
        handle.discard()  # s3fs: aborts the multipart upload; a small file's buffer is simply never sent
        handle.closed = True  # so that no later close() commits it
    else:
        handle.close()  # not a buffered upload (e.g. a local file system behind a URL): nothing to abort


def publish_folder(staging: ObjectStoragePath, final: ObjectStoragePath, *, last: str) -> None:
    """Publish the flat folder ``staging`` as ``final`` on an object store; ``last`` marks it complete.

    There is no folder rename, so: delete ``final/last`` first (from then on the old folder no
    longer reads as complete), delete the rest of the old folder (old and new files never mix),
    copy every staged file server-side, ``last`` after all the others, then delete the staging
    folder. A crash at any point leaves ``final`` without ``last`` — never mistaken for finished
    work — or complete; the rerun removes the leftovers.
    """
    fs = final.fs
    names = sorted(p.name for p in staging.iterdir())
    if last not in names:
        raise ValueError(f"{staging} has no {last}: refusing to publish an unfinished folder")
    marker = final / last
    if marker.exists():
        marker.unlink()
    if final.exists():
        fs.rm(final.path, recursive=True)
    for name in [n for n in names if n != last] + [last]:
        fs.copy((staging / name).path, (final / name).path)
    fs.rm(staging.path, recursive=True)
