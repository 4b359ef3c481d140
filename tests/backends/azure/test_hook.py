"""AzureOpenAIBatchHook with the real ``openai`` SDK (``AzureOpenAI``) against the emulator's Azure routes."""

from __future__ import annotations

import asyncio
import json
import sys
import types

import httpx
import openai
import pytest
from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException

from airflow_batch_provider.backends.azure.hook import ENTRA_SCOPE, AzureOpenAIBatchHook
from airflow_batch_provider.exceptions import ProviderCallError
from airflow_batch_provider.hooks.base import IDEMPOTENCY_METADATA_KEY
from airflow_batch_provider.hooks.registry import get_batch_hook
from airflow_batch_provider.status import BatchStatus
from airflow_batch_provider.utils.retry import RetryPolicy
from tests.backends.azure.conftest import DEPLOYMENT, azure_chunk, azure_connection
from tests.conftest import wait_terminal

NO_RETRY = RetryPolicy(attempts=1)


def _use(monkeypatch, emulator, conn_id: str = "azure_test", **conn) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({**azure_connection(emulator), **conn}))
    return conn_id


def test_submit_wait_results_on_azure_paths(azure_hook, azure_conn, tmp_path):
    """Upload, create, poll and download go to /openai/... with api-version; the states are the azure backend's."""
    chunk = azure_chunk(tmp_path, 12)
    submitted = azure_hook.submit(chunk, metadata={IDEMPOTENCY_METADATA_KEY: "k-az"})
    state = wait_terminal(azure_hook, submitted["batch_id"])
    assert (state.provider, state.status, state.key) == ("azure", BatchStatus.COMPLETED, "k-az")
    assert (state.counts.total, state.counts.completed, state.counts.failed) == (12, 12, 0)
    records = list(azure_hook.iter_results(state))
    assert sorted(r["custom_id"] for r in records) == sorted(f"row-0-{i}" for i in range(12))
    assert all(r["status"] == "succeeded" and r["input_tokens"] > 0 for r in records)
    routes = azure_conn.stats()["routes"]
    assert routes["POST /openai/files"] == 1 and routes["POST /openai/batches"] == 1
    assert not [route for route in routes if " /v1/" in route]  # nothing went to the OpenAI paths
    (batch,) = azure_conn.batches()
    assert batch["endpoint"] == "/chat/completions"  # Azure's form, as the lines carry it
    assert azure_hook.batch_url(state.batch_id) is None  # no console link for an emulator endpoint


def test_a_lost_create_answer_is_found_by_key(azure_hook, azure_conn, tmp_path):
    """The create took effect but its answer was lost: the hook finds the batch by key instead of a second create."""
    azure_conn.set_faults(lose_answer_routes={"POST /openai/batches": 1})
    chunk = azure_chunk(tmp_path, 3)
    submitted = azure_hook.submit(chunk, metadata={IDEMPOTENCY_METADATA_KEY: "k-lost"})
    azure_conn.set_faults()
    assert azure_conn.stats()["openai"]["batches_created"] == 1
    assert [s.batch_id for s in azure_hook.find_existing("k-lost", chunk)] == [submitted["batch_id"]]


def test_the_hook_is_the_registered_azure_hook(azure_conn):
    hook = get_batch_hook("azure")
    assert type(hook) is AzureOpenAIBatchHook and hook.conn_id == "azure_openai_batch_default"
    assert isinstance(hook.client, openai.AzureOpenAI)
    assert hook.client.base_url == f"{azure_conn.url}/openai/"
    assert hook.client._custom_query == {"api-version": "2024-10-21"}


def test_api_version_comes_from_the_connection(batch_emulator, monkeypatch, tmp_path):
    """The extra's api_version is what the SDK sends: a malformed one is refused by the endpoint, unretried."""
    conn_id = _use(monkeypatch, batch_emulator, extra={"api_version": "latest"})
    hook = AzureOpenAIBatchHook(conn_id, retry_policy=RetryPolicy(attempts=3, base_delay=0.01))
    with pytest.raises(ProviderCallError, match=r"after 1 attempt.*400 - Unsupported api-version 'latest'") as raised:
        hook.upload_file(azure_chunk(tmp_path, 1)["requests_path"])
    assert isinstance(raised.value.__cause__, openai.BadRequestError)
    assert batch_emulator.stats()["openai"]["files_uploaded"] == 0


@pytest.mark.parametrize(
    ("query", "headers", "status", "code"),
    [
        ("", {"api-key": "k"}, 400, "MissingApiVersionParameter"),
        ("?api-version=2024-10-21", {}, 401, "invalid_api_key"),
        ("?api-version=2024-10-21", {"api-key": "k"}, 200, None),
        ("?api-version=2025-04-01-preview", {"Authorization": "Bearer entra-token"}, 200, None),
    ],
)
def test_the_emulator_requires_api_version_and_a_key(batch_emulator, query, headers, status, code):
    answer = httpx.get(f"{batch_emulator.url}/openai/batches{query}", headers=headers, timeout=10)
    assert answer.status_code == status, answer.text
    assert (answer.json().get("error") or {}).get("code") == code


def test_a_connection_without_endpoint_says_where_it_goes(batch_emulator, monkeypatch):
    conn_id = _use(monkeypatch, batch_emulator, host="")
    with pytest.raises(openai.OpenAIError, match=r"names no endpoint: put https://<resource>\.openai\.azure\.com"):
        _ = AzureOpenAIBatchHook(conn_id).client


def test_no_key_signs_in_with_entra_id(batch_emulator, monkeypatch):
    """No password: a bearer token from azure-identity's provider on every call.

    azure-identity itself is stood in by a module with its two names (no Entra tenant is reachable
    here, and the extra is not part of the test install); the SDK, the hook and the HTTP calls are real.
    """
    asked: list[str] = []

    def get_bearer_token_provider(credential, scope):
        asked.append(scope)

        def token() -> str:
            asked.append("token")  # the SDK asks for one per request, to send as Authorization: Bearer
            return "entra-token"

        return token

    fake = types.ModuleType("azure.identity")
    fake.DefaultAzureCredential = object  # type: ignore[attr-defined]
    fake.get_bearer_token_provider = get_bearer_token_provider  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "azure", types.ModuleType("azure"))
    monkeypatch.setitem(sys.modules, "azure.identity", fake)
    hook = AzureOpenAIBatchHook(_use(monkeypatch, batch_emulator, password=""))
    assert list(hook.iter_keyed_batches(since=0)) == []  # a real list call, authorised by the bearer token
    assert asked == [ENTRA_SCOPE, "token"]


def test_no_key_and_no_azure_identity_names_the_extra(batch_emulator, monkeypatch):
    monkeypatch.setitem(sys.modules, "azure.identity", None)  # import fails, as where the extra is not installed
    hook = AzureOpenAIBatchHook(_use(monkeypatch, batch_emulator, password=""))
    with pytest.raises(AirflowOptionalProviderFeatureException, match=r"airflow-batch-provider\[azure\]"):
        _ = hook.client


def test_async_client_polls_and_lists(azure_hook, azure_conn, tmp_path):
    submitted = azure_hook.submit(azure_chunk(tmp_path, 2), metadata={IDEMPOTENCY_METADATA_KEY: "k-async"})

    async def poll():
        try:
            state = await azure_hook.aget_state(submitted["batch_id"])
            pages = [page async for page in azure_hook.alist_states()]
            return state, pages, await azure_hook.aget_client()
        finally:
            await azure_hook.aclose()

    state, pages, client = asyncio.run(poll())
    assert isinstance(client, openai.AsyncAzureOpenAI)
    assert state.provider == "azure" and state.batch_id == submitted["batch_id"]
    assert [s.batch_id for page in pages for s in page] == [submitted["batch_id"]]


def test_realtime_calls_go_to_the_deployment(azure_hook, azure_conn):
    """The SDK routes a chat call to /openai/deployments/{model}/chat/completions; the emulator answers it."""
    answer = azure_hook.client.chat.completions.create(
        model=DEPLOYMENT, messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    assert answer.choices[0].message.content
    assert azure_conn.stats()["routes"]["POST /openai/deployments/{deployment}/chat/completions"] == 1
