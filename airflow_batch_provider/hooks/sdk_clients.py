"""One place that builds the HTTP SDK clients of every hook (OpenAI, Anthropic, OpenAI-compatible servers).

What each hook used to repeat: the base URL from the connection's ``base_url`` extra or host
field (``https://`` added when the host has no scheme), the API key from the password field (or
an ``api_key`` extra), the SDK's own retry count and timeout, quiet transport logs, and an
``http_client`` over this process's one TLS context (:mod:`~airflow_batch_provider.hooks.tls`).
An async client is built in a worker thread: loading the trust store takes tens of
milliseconds, which must not stall a triggerer's event loop.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from airflow_batch_provider.hooks.tls import with_shared_tls
from airflow_batch_provider.utils.http_logs import quiet_transport_logs

ClientT = TypeVar("ClientT")


def with_scheme(url: str | None) -> str | None:
    """Return ``url`` with ``https://`` in front when it names no scheme (a bare host); None when empty."""
    if not url:
        return None
    return url if "://" in url else f"https://{url}"


def connection_client_kwargs(
    conn: Any, *, max_retries: int, timeout: float, base_url: str | None = None
) -> dict[str, Any]:
    """Return the SDK client arguments every hook shares, read from an Airflow connection.

    ``base_url`` (already resolved by the caller) wins over the ``base_url`` extra and the host
    field. ``api_key`` is None when the connection holds none: the caller decides whether that
    is an error (a provider's API) or fine (a local server).
    """
    extra: Mapping[str, Any] = conn.extra_dejson or {}
    return {
        "api_key": conn.password or extra.get("api_key") or None,
        "base_url": with_scheme(base_url or extra.get("base_url") or conn.host or None),
        "max_retries": max_retries,
        "timeout": timeout,
    }


def new_client(client_class: type[ClientT], kwargs: Mapping[str, Any], *, asynchronous: bool = False) -> ClientT:
    """Build ``client_class`` (``openai.OpenAI``, ``anthropic.AsyncAnthropic`` ...) with the shared TLS context."""
    quiet_transport_logs()  # every client is built here: no INFO line per poll or request
    sdk = importlib.import_module(client_class.__module__.partition(".")[0])
    return client_class(**with_shared_tls(sdk, dict(kwargs), asynchronous=asynchronous))


async def anew_client(client_class: type[ClientT], make_kwargs: Callable[[], Mapping[str, Any]]) -> ClientT:
    """Build an async SDK client off the event loop, ``make_kwargs()`` included (see the module notes)."""
    return await asyncio.to_thread(lambda: new_client(client_class, make_kwargs(), asynchronous=True))
