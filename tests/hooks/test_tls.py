"""Every SDK client the hooks build shares one TLS context (each default one costs ~1 MB and ~40 ms).

The context a client uses is read from its transport's connection pool (``_ssl_context``, an
attribute of the SDKs' HTTP library): the only place it can be seen without a TLS handshake.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from airflow_batch_provider.backends.anthropic.hook import AnthropicBatchHook
from airflow_batch_provider.backends.openai.hook import OpenAIBatchHook
from airflow_batch_provider.hooks.openai_compatible import OpenAICompatibleHook
from airflow_batch_provider.hooks.tls import shared_tls_context, with_shared_tls


def _context(client) -> object:
    return client._client._transport._pool._ssl_context


@pytest.fixture
def connections(monkeypatch):
    for name, conn_type, host in (
        ("OPENAI_BATCH_DEFAULT", "openai_batch", "https://api.example.invalid/v1"),
        ("ANTHROPIC_BATCH_DEFAULT", "anthropic_batch", "https://api.example.invalid"),
        ("OPENAI_COMPATIBLE_DEFAULT", "openai_compatible", "https://vllm.example.invalid/v1"),
    ):
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{name}", f'{{"conn_type": "{conn_type}", "host": "{host}", "password": "sk-test-key"}}'
        )


def test_sync_and_async_clients_of_every_hook_share_one_context(connections):
    shared = shared_tls_context()
    clients = [OpenAIBatchHook().client, OpenAIBatchHook().client, AnthropicBatchHook().client]
    clients.append(OpenAICompatibleHook().get_conn())
    clients.append(asyncio.run(OpenAIBatchHook().aget_client()))
    clients.append(asyncio.run(AnthropicBatchHook().aget_client()))
    assert all(_context(client) is shared for client in clients)
    # Still the SDK's own defaults otherwise: the hook's timeout and retries reach the client.
    assert clients[0].timeout == OpenAIBatchHook().timeout and clients[0].max_retries == OpenAIBatchHook().max_retries


def test_a_client_already_in_the_arguments_is_kept():
    own = openai.DefaultHttpxClient()
    kwargs = with_shared_tls(openai, {"api_key": "k", "http_client": own}, asynchronous=False)
    assert kwargs["http_client"] is own
    built = with_shared_tls(openai, {"api_key": "k"}, asynchronous=True)["http_client"]
    assert isinstance(built, openai.DefaultAsyncHttpxClient)
    assert shared_tls_context() is shared_tls_context()
