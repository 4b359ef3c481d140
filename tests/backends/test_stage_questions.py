"""What the stages ask a backend about its provider: retryable line errors, capacity refusals, model kinds.

A backend from another package (installed here through the entry-point group, as a wheel would)
declares its own vocabulary and the stages follow it, with no change to the stages.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_batch_provider.backends.registry import ENTRY_POINT_GROUP, forget_backends, get_backend
from airflow_batch_provider.batches.line_retry import is_final_error_code, is_retryable, output_error_code
from airflow_batch_provider.batches.token_budget import is_token_limit_refusal
from airflow_batch_provider.chunking.spec import RequestSpec
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.status import BatchState, BatchStatus
from tests.support import write_distribution

QUEUE = """
from airflow_batch_provider.backends.base import Backend
from airflow_batch_provider.chunking.limits import ProviderLimits


class QueueBackend(Backend):
    name = "queue"
    title = "Queue Batch"
    limits = ProviderLimits("queue", max_requests=10, max_bytes=10_000, default_byte_cap=9_000,
                            endpoints=frozenset({"/v1/chat/completions"}))
    endpoints = ("/v1/chat/completions",)
    hook_class_path = "queue_backend:QueueBackend"
    connection_type = "queue_batch"
    default_model = "qchat-1"
    retryable_line_errors = frozenset({"queue_busy"})
    capacity_refusal_codes = frozenset({"queue_full"})

    def model_kind(self, model):
        if model.startswith("qchat-"):
            return "chat"
        return "embedding" if model.startswith("qvec-") else None

    def check_params(self, spec):
        pass

    def renderer(self, spec):
        raise NotImplementedError

    def parse_result(self, line):
        raise NotImplementedError
"""


@pytest.fixture
def queue_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (tmp_path / "queue_backend.py").write_text(textwrap.dedent(QUEUE))
    write_distribution(tmp_path, "queue-backend", {ENTRY_POINT_GROUP: {"queue": "queue_backend:QueueBackend"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_backends()
    yield
    forget_backends()
    sys.modules.pop("queue_backend", None)


def _errored(code: str) -> dict:
    return {"custom_id": "a", "status": "errored", "error_code": code, "http_status": None, "error": "e"}


def _failed(provider: str, *codes: str) -> BatchState:
    errors = tuple({"code": code, "line": None, "message": "m", "param": None} for code in codes)
    return BatchState("b", provider, BatchStatus.FAILED, "failed", errors=errors)


def test_a_backends_retryable_codes_make_its_lines_go_again(queue_backend: None) -> None:
    assert is_retryable(_errored("queue_busy"))
    assert not is_final_error_code("queue_busy")  # a merged row with it is sent again on the next run
    assert output_error_code({**_errored("queue_busy"), "http_status": 503}) == "queue_busy"
    assert not is_retryable(_errored("queue_denied"))


def test_without_the_backend_its_codes_are_final() -> None:
    forget_backends()
    assert not is_retryable(_errored("queue_busy"))
    assert is_final_error_code("queue_busy")
    assert not is_final_error_code("overloaded_error") and not is_final_error_code("server_error")  # built-ins'


def test_a_capacity_refusal_is_what_the_batchs_backend_says(queue_backend: None) -> None:
    assert is_token_limit_refusal(_failed("queue", "queue_full"))
    assert not is_token_limit_refusal(_failed("queue", "token_limit_exceeded"))  # OpenAI's word, not this one's
    assert not is_token_limit_refusal(_failed("queue", "queue_full", "bad_line"))
    assert not is_token_limit_refusal(_failed("openai", "queue_full"))
    assert is_token_limit_refusal(_failed("openai", "token_limit_exceeded"))
    assert not is_token_limit_refusal(_failed("anthropic", "token_limit_exceeded"))  # no enqueued-token cap


def test_a_backend_says_what_kind_of_model_a_name_is(queue_backend: None) -> None:
    with pytest.raises(InvalidInputError, match="'qchat-1' is a chat model"):
        RequestSpec(provider="openai", model="qchat-1", endpoint="/v1/embeddings")
    with pytest.raises(InvalidInputError, match="'qvec-1' is an embedding model"):
        RequestSpec(provider="queue", model="qvec-1")
    assert RequestSpec(provider="openai", model="qother-1", endpoint="/v1/embeddings").model == "qother-1"


def test_an_unknown_name_is_not_checked() -> None:
    forget_backends()
    assert get_backend("gemini").model_kind("qchat-1") is None  # the default: no opinion
    assert RequestSpec(provider="openai", model="qchat-1", endpoint="/v1/embeddings").model == "qchat-1"
