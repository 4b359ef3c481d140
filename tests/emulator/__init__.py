"""Tests of the batch emulator with the real openai/anthropic SDKs over loopback; shared helpers.

The fixtures ``batch_emulator`` etc. come from the package's pytest plugin.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal, cast

import anthropic
import openai
from anthropic.types.messages import MessageBatch
from anthropic.types.messages.batch_create_params import Request
from openai.types import Batch

from airflow_batch_emulator.server import BatchEmulator

CHAT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
EMBEDDINGS: Literal["/v1/embeddings"] = "/v1/embeddings"
OPENAI_TERMINAL = ("completed", "failed", "expired", "cancelled")


def chat_line(
    custom_id: str, content: str = "Hello there", model: str = "gpt-4o-mini", url: str = CHAT, **body: Any
) -> dict[str, Any]:
    """Return one OpenAI batch input line for a chat request."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": model, "messages": [{"role": "user", "content": content}], **body},
    }


def to_jsonl(rows: list[Any]) -> bytes:
    """Serialise rows as newline-terminated JSONL."""
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def submit(client: openai.OpenAI, rows: list[Any] | bytes, endpoint: str = CHAT, **kwargs: Any) -> Batch:
    """Upload ``rows`` as a batch file and create a batch on it."""
    data = rows if isinstance(rows, bytes) else to_jsonl(rows)
    uploaded = client.files.create(file=("input.jsonl", data), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
        **kwargs,
    )


def wait_openai(client: openai.OpenAI, batch_id: str, timeout: float = 15.0) -> Batch:
    """Poll until the batch reaches a terminal status."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in OPENAI_TERMINAL:
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status} after {timeout}s")
        time.sleep(0.02)


def wait_anthropic(client: anthropic.Anthropic, batch_id: str, timeout: float = 15.0) -> MessageBatch:
    """Poll until the message batch has ended."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"message batch {batch_id} still {batch.processing_status} after {timeout}s")
        time.sleep(0.02)


def wait_held(emulator: BatchEmulator, batch_id: str, timeout: float = 15.0) -> dict[str, Any]:
    """Wait (reading the control listing, which counts no poll) until a finished batch is held for polls."""
    deadline = time.monotonic() + timeout
    while True:
        row = next(b for b in emulator.batches() if b["id"] == batch_id)
        if row["held"]:
            return row
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} not held after {timeout}s: {row}")
        time.sleep(0.02)


def read_jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """Download a file and parse it as JSONL, checking the framing the real service uses."""
    if file_id is None:
        return []
    raw = client.files.content(file_id).content
    assert raw.endswith(b"\n")
    assert b"\n\n" not in raw
    assert b"\r" not in raw
    return [json.loads(line) for line in raw.splitlines()]


def anthropic_request(custom_id: str, content: str = "Hello", **params: Any) -> Request:
    """Return one Anthropic batch request."""
    request: Any = {
        "custom_id": custom_id,
        "params": {
            "model": "claude-haiku-4-5",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": content}],
            **params,
        },
    }
    return cast(Request, request)
