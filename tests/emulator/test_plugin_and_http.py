"""The pytest plugin's fixtures and import cost, and HTTP framing details (chunked bodies, keep-alive)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import anthropic
import openai
import pytest

from airflow_batch_emulator.server import BatchEmulator
from tests.emulator import anthropic_request, chat_line, to_jsonl


def test_env_fixture_points_the_default_connections_at_the_emulator(batch_emulator_env: BatchEmulator) -> None:
    openai_conn = json.loads(os.environ["AIRFLOW_CONN_OPENAI_BATCH_DEFAULT"])
    anthropic_conn = json.loads(os.environ["AIRFLOW_CONN_ANTHROPIC_BATCH_DEFAULT"])
    assert openai_conn == {
        "conn_type": "openai_batch",
        "host": batch_emulator_env.openai_base_url,
        "password": "emulator-key",
    }
    assert anthropic_conn["conn_type"] == "anthropic_batch"
    assert anthropic_conn["host"] == batch_emulator_env.anthropic_base_url == batch_emulator_env.url


def test_fixture_starts_each_test_clean(batch_emulator: BatchEmulator) -> None:
    assert batch_emulator.batches() == []
    assert batch_emulator.stats()["http"]["requests"] == 0
    assert batch_emulator.faults.line_error_rate == 0.0
    batch_emulator.set_faults(line_error_rate=0.5)  # the next test must not see this


def test_plugin_import_is_light() -> None:
    code = (
        "import sys, airflow_batch_emulator.pytest_plugin\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'airflow', 'openai', 'anthropic', 'orjson'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.fixture
def connection(batch_emulator: BatchEmulator) -> Iterator[http.client.HTTPConnection]:
    conn = http.client.HTTPConnection("127.0.0.1", batch_emulator.port, timeout=10)
    yield conn
    conn.close()


def test_chunked_multipart_upload_and_keep_alive(connection: http.client.HTTPConnection) -> None:
    boundary = "zzBOUNDARYzz"
    payload = b'{"custom_id":"a"}\n' * 5000
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="c.jsonl"\r\n\r\n'
        ).encode()
        + payload
        + f"\r\n--{boundary}--\r\n".encode()
    )
    pieces = [body[i : i + 7000] for i in range(0, len(body), 7000)]
    headers = {"Authorization": "Bearer k", "Content-Type": f"multipart/form-data; boundary={boundary}"}
    connection.request("POST", "/v1/files", body=iter(pieces), headers=headers, encode_chunked=True)
    response = connection.getresponse()
    uploaded = json.loads(response.read())
    assert response.status == 200 and uploaded["bytes"] == len(payload)
    connection.request("GET", f"/v1/files/{uploaded['id']}/content", headers=headers)  # same socket
    response = connection.getresponse()
    assert response.read() == payload
    assert response.getheader("Content-Length") == str(len(payload))


def test_unknown_route_and_bad_json(connection: http.client.HTTPConnection) -> None:
    headers = {"x-api-key": "k", "Content-Type": "application/json"}
    connection.request("GET", "/v1/nothing-here", headers=headers)
    response = connection.getresponse()
    assert response.status == 404 and "Invalid URL" in json.loads(response.read())["error"]["message"]
    connection.request("POST", "/v1/messages/batches", body=b"{nope", headers=headers)
    response = connection.getresponse()
    error = json.loads(response.read())
    assert response.status == 400 and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"


async def test_async_sdk_clients(batch_emulator: BatchEmulator) -> None:
    async with openai.AsyncOpenAI(api_key="k", base_url=batch_emulator.openai_base_url) as oai:
        uploaded = await oai.files.create(file=("in.jsonl", to_jsonl([chat_line("a")])), purpose="batch")
        batch = await oai.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        while batch.status not in ("completed", "failed"):
            await asyncio.sleep(0.02)
            batch = await oai.batches.retrieve(batch.id)
        assert batch.status == "completed" and batch.output_file_id
        assert b'"custom_id":"a"' in (await oai.files.content(batch.output_file_id)).content
    async with anthropic.AsyncAnthropic(api_key="k", base_url=batch_emulator.anthropic_base_url) as claude:
        created = await claude.messages.batches.create(requests=[anthropic_request("a")])
        while True:  # poll the emulator's batch (remote state: nothing local to wait on)
            if (await claude.messages.batches.retrieve(created.id)).processing_status == "ended":
                break
            await asyncio.sleep(0.02)
        results = [item async for item in await claude.messages.batches.results(created.id)]
        assert [r.custom_id for r in results] == ["a"]
