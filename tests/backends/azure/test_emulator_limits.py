"""The emulator's Azure routes enforce Azure's file limit (100,000 requests), not OpenAI's (50,000)."""

from __future__ import annotations

import time

import httpx
import orjson

LINES = 50_001  # one over OpenAI's limit, well under Azure's


def _file(url: str) -> bytes:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    return b"".join(
        orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body}) + b"\n" for i in range(LINES)
    )


def _create(base: str, url: str, query: str, headers: dict) -> dict:
    upload = httpx.post(
        f"{base}/files{query}",
        files={"file": ("in.jsonl", _file(url))},
        data={"purpose": "batch"},
        headers=headers,
        timeout=60,
    )
    file_id = upload.json()["id"]
    made = httpx.post(
        f"{base}/batches{query}",
        json={"input_file_id": file_id, "endpoint": url, "completion_window": "24h"},
        headers=headers,
        timeout=30,
    )
    return made.json()


def _settled(base: str, batch_id: str, query: str, headers: dict) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        batch = httpx.get(f"{base}/batches/{batch_id}{query}", headers=headers, timeout=10).json()
        if batch["status"] != "validating":
            return batch
        time.sleep(0.05)
    raise AssertionError(f"{batch_id} still validating")


def test_azure_takes_more_requests_per_file_than_openai(batch_emulator):
    batch_emulator.set_faults(slow=60.0)  # keep the accepted batch from running its 50,001 lines
    openai_headers, azure_headers = {"Authorization": "Bearer k"}, {"api-key": "k"}
    refused = _create(batch_emulator.openai_base_url, "/v1/chat/completions", "", openai_headers)
    query = "?api-version=2024-10-21"
    accepted = _create(batch_emulator.url + "/openai", "/chat/completions", query, azure_headers)
    refused = _settled(batch_emulator.openai_base_url, refused["id"], "", openai_headers)
    accepted = _settled(batch_emulator.url + "/openai", accepted["id"], query, azure_headers)
    assert refused["status"] == "failed" and refused["errors"]["data"][0]["code"] == "too_many_tasks"
    assert accepted["status"] == "in_progress" and accepted["request_counts"]["total"] == LINES
    httpx.post(f"{batch_emulator.url}/openai/batches/{accepted['id']}/cancel{query}", headers=azure_headers, timeout=10)
