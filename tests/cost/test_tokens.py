"""Token counts: tiktoken when its BPE file is on disk, a documented approximation otherwise.

tiktoken downloads its BPE files on first use and the test machines have no internet, so the
exact-count test runs only where ``o200k_base``/``cl100k_base`` can be loaded offline (a warm
tiktoken cache, ``[llm_batch] tiktoken_dir`` or the ``bpe-openai`` wheel). The pinned counts
below were produced with tiktoken 0.14 from files whose sha256 matched tiktoken's; the
approximation tests always run and are checked against hand-computed values and, in aggregate,
against those pinned counts. No test can download: ``tiktoken.load.read_file`` refuses URLs here.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from airflow_batch_provider import settings
from airflow_batch_provider.backends.openai import encoding_name_for
from airflow_batch_provider.cost import encodings, tokens
from airflow_batch_provider.cost.answers import DEFAULT_OUTPUT_TOKENS
from airflow_batch_provider.cost.tokens import (
    TokenCounter,
    count_request_tokens,
    estimate_input_tokens,
    request_parts,
)
from airflow_batch_provider.exceptions import InvalidInputError

# text, o200k_base tokens, cl100k_base tokens (tiktoken 0.14)
PINNED = [
    pytest.param("Hello, world!", 4, 4, id="greeting"),
    pytest.param(
        "Classify: Stainless steel water bottle, 750 ml, keeps drinks cold for 24 hours.\nLabels: kitchen, sports, toys",
        27,
        27,
        id="classification-prompt",
    ),
    pytest.param("The quick brown fox jumps over the lazy dog.", 10, 10, id="pangram"),
    pytest.param(
        "Batch inference is boring infrastructure — and it's how teams afford LLM features at scale.",
        17,
        18,
        id="em-dash-prose",
    ),
    pytest.param("def add(a: int, b: int) -> int:\n    return a + b\n", 19, 19, id="code"),
    pytest.param("Zürich, São Paulo, Kraków: 3 cities, 12.5% growth, $1,234.56 in 2024-07-18.", 36, 36, id="numbers"),
    pytest.param("", 0, 0, id="empty"),
]
SYSTEM = "You are a retail catalogue assistant."  # 7 o200k tokens


@pytest.fixture(autouse=True)
def _never_download(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    try:
        import tiktoken.load
    except ImportError:
        yield
        return
    real = tiktoken.load.read_file

    def offline(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise AssertionError(f"a test tried to download {blobpath}")
        return real(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    yield


@pytest.fixture
def no_encodings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No BPE file anywhere: an empty tiktoken cache, no local folder, no bpe-openai."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(settings.env_var("tiktoken_dir"), raising=False)
    monkeypatch.setattr(encodings.importlib.util, "find_spec", lambda name: None)
    encodings.load_encoding.cache_clear()
    yield tmp_path
    encodings.load_encoding.cache_clear()


def _offline_encoding(name: str) -> Any | None:
    encodings.load_encoding.cache_clear()
    return encodings.load_encoding(name)


@pytest.mark.parametrize(("text", "o200k", "cl100k"), PINNED)
def test_tiktoken_counts_on_fixed_strings(text: str, o200k: int, cl100k: int) -> None:
    if _offline_encoding("o200k_base") is None or _offline_encoding("cl100k_base") is None:
        pytest.fail("tiktoken's BPE files did not load: install the test extra (tiktoken + bpe-openai)")
    assert estimate_input_tokens([text], "gpt-4o-mini") == o200k
    assert estimate_input_tokens([text], "gpt-4.1-2025-04-14") == o200k
    assert estimate_input_tokens([text], "text-embedding-3-small") == cl100k
    assert TokenCounter("gpt-4o").method == "tiktoken o200k_base"


def test_tiktoken_chat_overhead_follows_openai_accounting() -> None:
    if _offline_encoding("o200k_base") is None:
        pytest.fail("tiktoken's o200k_base did not load: install the test extra (tiktoken + bpe-openai)")
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello, world!"}]}
    # OpenAI's accounting: 3 per message + the role (1 token) + the content, and 3 to prime the reply.
    assert estimate_input_tokens([body], "gpt-4o-mini") == (3 + 1 + 7) + (3 + 1 + 4) + 3


@pytest.mark.parametrize(
    ("model", "text", "expected"),
    [
        pytest.param("gpt-4o-mini", "Hello, world!", 4, id="openai-13-chars"),
        pytest.param("gpt-4o-mini", "The quick brown fox jumps over the lazy dog.", 11, id="openai-44-chars"),
        pytest.param("gpt-4o-mini", "", 0, id="openai-empty"),
        pytest.param("llama-3.1-8b", "abcde", 2, id="unknown-model-chars/4"),
        pytest.param("claude-haiku-4-5", "Hello, world!", 4, id="claude-13/3.5"),
        pytest.param("claude-haiku-4-5", "The quick brown fox jumps over the lazy dog.", 13, id="claude-44/3.5"),
        pytest.param("claude-sonnet-5", "The quick brown fox jumps over the lazy dog.", 17, id="claude5-44/2.7"),
    ],
)
def test_approximation_counts(model: str, text: str, expected: int) -> None:
    assert estimate_input_tokens([text], model, exact=False) == expected
    assert TokenCounter(model, exact=False).count(text) == expected


def test_approximation_is_within_a_quarter_of_tiktoken_on_the_pinned_strings() -> None:
    texts = [p.values[0] for p in PINNED]
    true_total = sum(p.values[1] for p in PINNED)  # 113
    approx = estimate_input_tokens(texts, "gpt-4o-mini", exact=False)  # 98
    assert abs(approx - true_total) / true_total < 0.25


def test_chat_request_parts_and_overhead() -> None:
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-4o-mini",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello, world!"}],
            "max_tokens": 5,
        },
    }
    parts = request_parts(line)
    assert parts.pieces == (SYSTEM, "Hello, world!")
    assert (parts.overhead, parts.max_output) == (2 * 4 + 3, 5)
    # chars/4 per piece: ceil(37/4) + ceil(13/4) = 10 + 4, plus the overhead; the same as JSONL bytes.
    expected = 10 + 4 + 11
    assert estimate_input_tokens([line], "gpt-4o-mini", exact=False) == expected
    assert estimate_input_tokens([orjson.dumps(line)], "gpt-4o-mini", exact=False) == expected


def test_anthropic_line_with_blocks_and_tools() -> None:
    line = {
        "custom_id": "a",
        "params": {
            "model": "claude-haiku-4-5",
            "max_tokens": 16,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello, world!"}]}],
            "tools": [{"name": "t", "input_schema": {"type": "object"}}],
        },
    }
    parts = request_parts(line, provider="openai")  # the line's shape says Anthropic
    tools_json = '[{"name":"t","input_schema":{"type":"object"}}]'
    assert parts.pieces == ("Be brief.", "Hello, world!", tools_json)
    assert (parts.overhead, parts.max_output) == (3, 16)
    tally = count_request_tokens([line], "claude-haiku-4-5", exact=False)
    assert tally.input_tokens == math.ceil(9 / 3.5) + math.ceil(13 / 3.5) + math.ceil(len(tools_json) / 3.5) + 3
    assert (tally.output_tokens, tally.output_basis) == (16, "max_tokens")


def test_embeddings_have_no_output_and_token_id_inputs_count_by_length() -> None:
    texts = {"model": "text-embedding-3-small", "input": ["abcd", "abcdefgh"]}
    ids = {"model": "text-embedding-3-small", "input": [101, 102, 103]}
    tally = count_request_tokens([texts, ids], "text-embedding-3-small", exact=False, expected_output_tokens=9)
    assert (tally.requests, tally.input_tokens, tally.output_tokens) == (2, 1 + 2 + 3, 0)
    assert tally.output_basis == "none (embeddings)"


@pytest.mark.parametrize(
    ("body", "expected", "output", "basis"),
    [
        pytest.param({"prompt": "abcd", "max_tokens": 7}, None, 7, "max_tokens", id="max_tokens"),
        pytest.param({"prompt": "abcd", "max_completion_tokens": 9}, None, 9, "max_tokens", id="max_completion"),
        pytest.param({"prompt": "abcd", "max_tokens": 7}, 2, 7, "max_tokens", id="expectation-keeps-the-bound"),
        pytest.param({"prompt": "abcd"}, None, DEFAULT_OUTPUT_TOKENS, "default 256/request", id="default"),
    ],
)
def test_output_tokens(body: dict[str, Any], expected: int | None, output: int, basis: str) -> None:
    tally = count_request_tokens([body], "gpt-4o-mini", expected_output_tokens=expected, exact=False)
    assert tally.output_tokens == output
    assert tally.output_basis.startswith(basis)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "5"], ids=["negative", "float", "bool", "string"])
def test_bad_expected_output_tokens(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="expected_output_tokens"):
        count_request_tokens(["x"], "gpt-4o-mini", expected_output_tokens=bad, exact=False)


@pytest.mark.parametrize(
    "item",
    [pytest.param({"body": {"model": "m"}}, id="no-text"), pytest.param(b"[1, 2]", id="json-array")],
)
def test_requests_without_text_are_rejected(item: Any) -> None:
    with pytest.raises(InvalidInputError, match="Cannot"):
        request_parts(item)


def test_without_any_bpe_file_counts_are_approximate(no_encodings: Path) -> None:
    assert encodings.load_encoding("o200k_base") is None
    assert TokenCounter("gpt-4o-mini").method == "approximation chars/4"
    with pytest.raises(InvalidInputError, match=settings.env_var("tiktoken_dir")):
        TokenCounter("gpt-4o-mini", exact=True)
    with pytest.raises(InvalidInputError, match="No offline tokenizer"):
        TokenCounter("claude-haiku-4-5", exact=True)


def test_a_file_with_the_wrong_hash_is_ignored(no_encodings: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = no_encodings / "bpe"
    folder.mkdir()
    (folder / "o200k_base.tiktoken.gz").write_bytes(gzip.compress(b"aGVsbG8= 0\n"))
    monkeypatch.setenv(settings.env_var("tiktoken_dir"), str(folder))
    assert encodings.load_encoding("o200k_base") is None
    assert not (no_encodings / "cache").exists()  # nothing was copied into tiktoken's cache


def test_cache_file_name_is_tiktokens(no_encodings: Path) -> None:
    url = encodings.ENCODING_FILES["o200k_base"][0]
    expected = no_encodings / "cache" / hashlib.sha1(url.encode()).hexdigest()
    assert encodings._cache_path("o200k_base") == expected


def test_pinned_urls_and_hashes_match_tiktoken() -> None:
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    import inspect

    source = inspect.getsource(openai_public)
    for url, sha in encodings.ENCODING_FILES.values():
        assert url in source
        assert sha in source


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        pytest.param("gpt-4o-mini-2024-07-18", "o200k_base", id="4o"),
        pytest.param("gpt-4.1-nano", "o200k_base", id="4.1"),
        pytest.param("o4-mini", "o200k_base", id="o4"),
        pytest.param("gpt-5.4-mini", "o200k_base", id="5.4"),
        pytest.param("text-embedding-3-large", "cl100k_base", id="embeddings"),
        pytest.param("claude-haiku-4-5", None, id="claude"),
    ],
)
def test_encoding_names(model: str, encoding: str | None) -> None:
    assert encoding_name_for(model) == encoding


class _WordEncoding:
    """A stand-in tokenizer: one token per space-separated word (to test the sampling arithmetic)."""

    name = "words"

    def encode_ordinary(self, text: str) -> list[int]:
        return [0] * len(text.split())

    def encode_ordinary_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode_ordinary(t) for t in texts]


def test_large_inputs_are_sampled_and_repeats_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = TokenCounter("gpt-4o-mini", exact=False)
    counter.encoding = _WordEncoding()
    texts = [f"w{i} " * (1 + i % 7) for i in range(3_000)] + ["same prompt"] * 1_000
    truth = sum(len(t.split()) for t in texts)
    assert counter.count_total(texts) == truth  # under EXACT_LIMIT distinct texts: exact
    monkeypatch.setattr(tokens, "EXACT_LIMIT", 500)
    monkeypatch.setattr(tokens, "SAMPLE_SIZE", 300)
    sampled = counter.count_total(texts)
    assert sampled != truth
    assert abs(sampled - truth) / truth < 0.05


def test_a_100k_chunk_is_counted_quickly() -> None:
    line = {
        "custom_id": "r",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "system", "content": SYSTEM}], "max_tokens": 5},
    }
    lines = []
    for i in range(100_000):
        line["custom_id"] = f"r{i}"
        line["body"]["messages"] = [  # type: ignore[index]
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Classify product {i}: stainless steel bottle, {i % 997} ml"},
        ]
        lines.append(orjson.dumps(line))
    started = time.monotonic()
    tally = count_request_tokens(lines, "gpt-4o-mini", exact=False)
    elapsed = time.monotonic() - started
    assert tally.requests == 100_000
    assert elapsed < 15, f"counting 100k requests took {elapsed:.1f}s"
