"""tiktoken's BPE files, found offline: tiktoken's cache, ``[llm_batch] tiktoken_dir`` or a ``bpe-openai`` wheel.

Every file is checked against the sha256 tiktoken pins, and nothing is ever downloaded: workers
often have no internet, and a chunk task must not hang on a blob-store request (see
:mod:`airflow_batch_provider.cost.tokens` for how the counts are used).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from airflow_batch_provider import settings

log = logging.getLogger(__name__)

# The BPE files tiktoken loads for these encodings, and the sha256 it pins for each
# (tiktoken_ext/openai_public.py); the URL also names the file in tiktoken's cache.
ENCODING_FILES: dict[str, tuple[str, str]] = {
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}


def tiktoken_cache_dir() -> str | None:
    """Return the folder tiktoken caches BPE files in, as tiktoken computes it (None: caching off)."""
    folder = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    if folder is None:
        folder = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return folder or None


def _cache_path(name: str) -> Path | None:
    folder = tiktoken_cache_dir()
    if folder is None:
        return None
    url = ENCODING_FILES[name][0]
    return Path(folder) / hashlib.sha1(url.encode()).hexdigest()


def _verified(data: bytes, name: str) -> bool:
    return hashlib.sha256(data).hexdigest() == ENCODING_FILES[name][1]


def _local_copies(name: str) -> list[Path]:
    """Return candidate BPE files outside tiktoken's cache, in the order they are tried."""
    folders: list[Path] = []
    configured = settings.tiktoken_dir()
    if configured:
        folders.append(Path(configured).expanduser())
    spec = importlib.util.find_spec("bpe_openai")  # finds the wheel without importing its extension
    if spec is not None and spec.submodule_search_locations:
        folders += [Path(p) / "data" for p in spec.submodule_search_locations]
    return [folder / f"{name}{suffix}" for folder in folders for suffix in (".tiktoken", ".tiktoken.gz")]


def _install_into_cache(name: str, cache: Path) -> bool:
    """Copy a verified local BPE file into tiktoken's cache; return True when one is there."""
    for candidate in _local_copies(name):
        try:
            raw = candidate.read_bytes()
            data = gzip.decompress(raw) if candidate.suffix == ".gz" else raw
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        if not _verified(data, name):
            log.warning("Ignoring %s: its sha256 is not the one tiktoken pins for %s", candidate, name)
            continue
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f"{cache.name}.{uuid.uuid4().hex}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, cache)
        except OSError as err:
            log.warning("Cannot copy %s into tiktoken's cache %s: %s", candidate, cache.parent, err)
            return False
        return True
    return False


@functools.cache
def load_encoding(name: str) -> Any | None:
    """Return the tiktoken Encoding ``name`` if it can be loaded without the network, else None.

    Cached per process; call ``load_encoding.cache_clear()`` after adding a file.
    """
    if name not in ENCODING_FILES:
        return None
    try:
        import tiktoken
    except ImportError:
        return None
    cache = _cache_path(name)
    if cache is None:
        return None  # caching disabled: tiktoken would download on every load
    try:
        ready = cache.is_file() and _verified(cache.read_bytes(), name)
    except OSError:
        ready = False
    if not ready and not _install_into_cache(name, cache):
        return None
    # The cache file is present and verified, so tiktoken reads it and makes no request.
    return tiktoken.get_encoding(name)
