"""The cost estimate counts a line with the chunk's own backend, not the first backend whose shape it fits.

OpenAI's line shape (``{custom_id, method, url, body}``) is also Azure's and any OpenAI-compatible
backend's; a backend installed from another package whose name sorts first used to claim every
such line, with its own per-message overhead, even for an OpenAI chunk.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_batch_provider.backends.registry import ENTRY_POINT_GROUP, backend_names, forget_backends
from airflow_batch_provider.cost.tokens import request_parts
from tests.support import write_distribution

# Named to sort before every built-in; claims OpenAI-shaped lines with a large chat overhead.
LOOKALIKE = """
from airflow_batch_provider.backends.base import Backend, CountableRequest
from airflow_batch_provider.chunking.limits import ProviderLimits


class LookalikeBackend(Backend):
    name = "aaa-lookalike"
    title = "OpenAI-shaped lookalike"
    limits = ProviderLimits("aaa-lookalike", max_requests=10, max_bytes=10_000, default_byte_cap=9_000,
                            endpoints=frozenset({"/v1/chat/completions"}))
    endpoints = ("/v1/chat/completions",)
    hook_class_path = "lookalike_backend:LookalikeBackend"
    connection_type = "lookalike"
    default_model = "look-1"

    def check_params(self, spec):
        pass

    def renderer(self, spec):
        raise NotImplementedError

    def parse_result(self, line):
        raise NotImplementedError

    def countable_request(self, line):
        body = line.get("body")
        return CountableRequest(body, 1000, 1000) if isinstance(body, dict) else None
"""

LINE = {
    "custom_id": "r-1",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
}


@pytest.fixture
def lookalike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (tmp_path / "lookalike_backend.py").write_text(textwrap.dedent(LOOKALIKE))
    targets = {"aaa-lookalike": "lookalike_backend:LookalikeBackend"}
    write_distribution(tmp_path, "lookalike-backend", {ENTRY_POINT_GROUP: targets})
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_backends()
    yield
    forget_backends()
    sys.modules.pop("lookalike_backend", None)


def test_each_backend_counts_its_own_lines(lookalike: None) -> None:
    assert backend_names()[0] == "aaa-lookalike"
    openai = request_parts(LINE, "openai")
    assert openai.overhead < 20  # OpenAI's own 4 per message + 3 to prime the reply
    assert request_parts(LINE, "aaa-lookalike").overhead >= 2000  # the lookalike's, for its own chunks


def test_a_line_its_backend_does_not_claim_is_still_counted_by_the_others(lookalike: None) -> None:
    """Anthropic's backend does not claim an OpenAI-shaped line: another backend's rules count it."""
    assert request_parts(LINE, "anthropic").max_output == 5
