"""The one place SDK clients are built: connection settings, the shared TLS context, async off the loop."""

from __future__ import annotations

import asyncio
import threading

import anthropic
import openai
import pytest
from airflow.sdk import Connection

from airflow_batch_provider.hooks.sdk_clients import anew_client, connection_client_kwargs, new_client, with_scheme
from airflow_batch_provider.hooks.tls import shared_tls_context


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("api.example.invalid", "https://api.example.invalid"),
        ("http://127.0.0.1:8089/v1", "http://127.0.0.1:8089/v1"),
        ("", None),
        (None, None),
    ],
)
def test_a_bare_host_gets_https(url, expected):
    assert with_scheme(url) == expected


def test_connection_settings_prefer_the_base_url_extra_then_the_host():
    conn = Connection(conn_id="c", conn_type="openai_batch", host="host.invalid", password="sk-1")
    assert connection_client_kwargs(conn, max_retries=3, timeout=9.0) == {
        "api_key": "sk-1",
        "base_url": "https://host.invalid",
        "max_retries": 3,
        "timeout": 9.0,
    }
    extra = Connection(conn_id="c", conn_type="x", host="h.invalid", extra='{"base_url": "b.invalid", "api_key": "k"}')
    kwargs = connection_client_kwargs(extra, max_retries=0, timeout=1.0)
    assert (kwargs["base_url"], kwargs["api_key"]) == ("https://b.invalid", "k")
    bare = Connection(conn_id="c", conn_type="x")
    assert connection_client_kwargs(bare, max_retries=0, timeout=1.0, base_url="given.invalid")["api_key"] is None
    assert connection_client_kwargs(bare, max_retries=0, timeout=1.0, base_url="given.invalid")["base_url"] == (
        "https://given.invalid"
    )


@pytest.mark.parametrize("client_class", [openai.OpenAI, anthropic.Anthropic])
def test_clients_of_either_sdk_share_the_tls_context_and_keep_their_settings(client_class):
    client = new_client(
        client_class, {"api_key": "k", "base_url": "https://x.invalid", "max_retries": 4, "timeout": 7.0}
    )
    assert client._client._transport._pool._ssl_context is shared_tls_context()
    assert (client.max_retries, client.timeout) == (4, 7.0)


def test_an_async_client_and_its_settings_are_built_off_the_event_loop():
    seen: dict[str, int] = {}

    def settings() -> dict[str, object]:
        seen["settings"] = threading.get_ident()
        return {"api_key": "k", "base_url": "https://x.invalid"}

    async def build() -> tuple[openai.AsyncOpenAI, int]:
        client = await anew_client(openai.AsyncOpenAI, settings)
        return client, threading.get_ident()

    client, loop_thread = asyncio.run(build())
    assert isinstance(client, openai.AsyncOpenAI) and seen["settings"] != loop_thread
    assert client._client._transport._pool._ssl_context is shared_tls_context()
