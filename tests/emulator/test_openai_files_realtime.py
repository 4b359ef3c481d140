"""OpenAI files, realtime routes, auth and HTTP-level faults, driven by the real ``openai`` SDK."""

from __future__ import annotations

import base64
import json
import math
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_emulator.server import BatchEmulator
from tests.emulator import chat_line, read_jsonl, submit, to_jsonl, wait_openai


@pytest.fixture
def client(batch_emulator: BatchEmulator) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(api_key="test-key", base_url=batch_emulator.openai_base_url) as sdk:
        yield sdk


def _raw(url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_file_crud_and_listing(client: openai.OpenAI, batch_emulator: BatchEmulator) -> None:
    data = to_jsonl([chat_line("a")])
    first = client.files.create(
        file=("one.jsonl", data), purpose="batch", expires_after={"anchor": "created_at", "seconds": 7200}
    )
    second = client.files.create(file=("two.jsonl", b"hello"), purpose="user_data")
    assert (first.filename, first.bytes, first.object, first.purpose) == ("one.jsonl", len(data), "file", "batch")
    assert first.expires_at == first.created_at + 7200
    assert client.files.retrieve(first.id).id == first.id
    assert client.files.content(first.id).content == data
    assert [f.id for f in client.files.list()] == [second.id, first.id]
    assert [f.id for f in client.files.list(purpose="batch")] == [first.id]
    deleted = client.files.delete(first.id)
    assert deleted.deleted is True and deleted.id == first.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(first.id)
    stats = batch_emulator.stats()["openai"]
    assert (stats["files_uploaded"], stats["files_deleted"]) == (2, 1)
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", b"x"), purpose="nonsense")  # type: ignore[arg-type]


def test_large_upload_and_streamed_download_are_linear(client: openai.OpenAI) -> None:
    line = json.dumps(chat_line("x", "y" * 900)).encode() + b"\n"
    data = line * (48 * 1024 * 1024 // len(line))  # about 48 MB
    started = time.perf_counter()
    uploaded = client.files.create(file=("big.jsonl", data), purpose="batch")
    with client.files.with_streaming_response.content(uploaded.id) as response:
        pieces = list(response.iter_bytes(1 << 20))
    elapsed = time.perf_counter() - started
    assert uploaded.bytes == len(data)
    assert b"".join(pieces) == data
    assert elapsed < 10, f"48 MB round trip took {elapsed:.1f}s"


def test_realtime_chat_and_embeddings(client: openai.OpenAI, batch_emulator: BatchEmulator) -> None:
    chat = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}])
    assert chat.choices[0].message.content and chat.choices[0].finish_reason == "stop"
    assert chat.usage is not None and chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    default = client.embeddings.create(model="te-3", input=["alpha", "beta"], dimensions=12)  # SDK asks for base64
    floats = client.embeddings.create(model="te-3", input=["alpha", "beta"], dimensions=12, encoding_format="float")
    assert [len(d.embedding) for d in default.data] == [12, 12]
    for got, want in zip(default.data, floats.data):
        assert got.embedding == pytest.approx(want.embedding, abs=1e-6)
        assert math.isclose(sum(v * v for v in want.embedding), 1.0, rel_tol=1e-9)
    assert batch_emulator.stats()["realtime"]["requests"] == 3
    assert batch_emulator.stats()["realtime"]["requests_by_priority"] == {"absent": 3}


def test_realtime_stats_count_the_priority_field_as_sent(client: openai.OpenAI, batch_emulator: BatchEmulator) -> None:
    """vLLM's ``priority`` request field, counted by the value a client sent (a test's way to see it was sent)."""
    for priority in (10, 10, -1):
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], extra_body={"priority": priority}
        )
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}])
    stats = batch_emulator.stats()["realtime"]
    assert stats["requests_by_priority"] == {"10": 2, "-1": 1, "absent": 1} and stats["requests"] == 4


def test_raw_embeddings_default_to_floats_and_honour_base64(batch_emulator: BatchEmulator) -> None:
    url = batch_emulator.openai_base_url + "/embeddings"
    auth = {"Authorization": "Bearer k", "Content-Type": "application/json"}
    status, plain = _raw(url, "POST", {"model": "te-3", "input": "hello"}, auth)
    assert status == 200 and isinstance(plain["data"][0]["embedding"], list)
    status, packed = _raw(url, "POST", {"model": "te-3", "input": "hello", "encoding_format": "base64"}, auth)
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert list(struct.unpack("<16f", raw)) == pytest.approx(plain["data"][0]["embedding"], abs=1e-6)


def test_realtime_concurrency_is_tracked() -> None:
    with BatchEmulator(EmulatorConfig(latency=0.01, realtime_delay=0.2)) as emulator:
        sdk = openai.OpenAI(api_key="k", base_url=emulator.openai_base_url)
        with sdk, ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda i: sdk.embeddings.create(model="te", input=f"text {i}"), range(6)))
        assert emulator.stats()["realtime"]["realtime_max_concurrency"] >= 3


AUTH_CASES = [
    pytest.param({"Authorization": "Bearer sk-anything"}, 200, id="bearer"),
    pytest.param({"x-api-key": "anything"}, 200, id="x-api-key"),
    pytest.param({}, 401, id="none"),
    pytest.param({"Authorization": "Bearer "}, 401, id="empty-bearer"),
]


@pytest.mark.parametrize(("headers", "status"), AUTH_CASES)
def test_auth_headers(batch_emulator: BatchEmulator, headers: dict[str, str], status: int) -> None:
    code, body = _raw(batch_emulator.openai_base_url + "/batches", headers=headers)
    assert code == status
    if status == 401:
        assert set(body["error"]) == {"message", "type", "param", "code"}


def test_429_with_retry_after_is_retried_by_the_sdk(batch_emulator: BatchEmulator) -> None:
    batch_emulator.set_faults(http_429_rate=0.4, retry_after=0.01)
    with openai.OpenAI(api_key="k", base_url=batch_emulator.openai_base_url, max_retries=6) as sdk:
        batch = wait_openai(sdk, submit(sdk, [chat_line(f"r{i}") for i in range(5)]).id)
        assert batch.status == "completed"
        assert len(read_jsonl(sdk, batch.output_file_id)) == 5
    assert batch_emulator.stats()["http"]["injected_429"] > 0
    batch_emulator.set_faults(http_429_rate=1.0, retry_after=0.5)
    sdk = openai.OpenAI(api_key="k", base_url=batch_emulator.openai_base_url, max_retries=0)
    with sdk, pytest.raises(openai.RateLimitError) as info:
        sdk.batches.list()
    assert info.value.response.headers["retry-after"] == "0.5"
    assert info.value.response.headers["retry-after-ms"] == "500"


@pytest.mark.parametrize(
    ("fault", "counter"),
    [pytest.param("http_500_rate", "injected_500", id="500"), pytest.param("drop_rate", "dropped", id="drop")],
)
def test_500s_and_drops_are_retried_by_the_sdk(batch_emulator: BatchEmulator, fault: str, counter: str) -> None:
    batch_emulator.set_faults(**{fault: 0.3})
    with openai.OpenAI(api_key="k", base_url=batch_emulator.openai_base_url, max_retries=8) as sdk:
        for i in range(8):
            assert sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": str(i)}]).choices
    assert batch_emulator.stats()["http"][counter] > 0


def test_control_routes(batch_emulator: BatchEmulator) -> None:
    status, faults = _raw(batch_emulator.url + "/_emulator/faults", "POST", {"line-error-rate": 0.5, "seed": 7})
    assert status == 200 and faults["line_error_rate"] == 0.5 and faults["seed"] == 7
    assert batch_emulator.faults.line_error_rate == 0.5
    status, error = _raw(batch_emulator.url + "/_emulator/faults", "POST", {"no_such_fault": 1})
    assert status == 400 and "no_such_fault" in error["error"]
    with openai.OpenAI(api_key="k", base_url=batch_emulator.openai_base_url) as sdk:
        wait_openai(sdk, submit(sdk, [chat_line("a"), chat_line("b")]).id)
    status, listing = _raw(batch_emulator.url + "/_emulator/batches?custom_ids=1")
    assert status == 200
    assert [(b["provider"], b["custom_id_count"], b["custom_ids"]) for b in listing["data"]] == [
        ("openai", 2, ["a", "b"])
    ]
    status, _ = _raw(batch_emulator.url + "/_emulator/reset", "POST", {})
    assert status == 200
    assert batch_emulator.batches() == [] and batch_emulator.faults.line_error_rate == 0.0
    status, stats = _raw(batch_emulator.url + "/_emulator/stats")
    assert status == 200 and stats["http"]["requests"] == 0 and stats["openai"]["batches_created"] == 0
