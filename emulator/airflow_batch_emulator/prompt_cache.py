"""The providers' prompt cache, as the emulator plays it: a marked prefix seen within its TTL is a hit.

Anthropic caches what comes before a ``cache_control`` breakpoint (tools, then the system prompt)
for the breakpoint's ``ttl`` ("5m" by default, "1h"); a request whose prefix is not cached writes
it (billed 1.25x or 2x input), one whose prefix is cached reads it (0.1x), and each hit refreshes
the entry. Inside Message Batches hits are best-effort: the ``cache_miss_rate`` fault makes that
share of a batch's requests miss (and write) anyway, spread evenly over its lines
(:func:`best_effort_miss`): a steady rate, so a job's bill does not hang on the luck of a few
dozen rolls, each miss costing some twenty reads. A prefix shorter than the model's minimum is not cached; the
emulator uses one minimum for every model (:data:`MIN_PREFIX_TOKENS`, the smallest Anthropic
lists for current models): what is cached is decided by the client's breakpoint, not here.

OpenAI caches by itself: a chat request whose messages before the last one (the system prompt;
the row's text comes last) and response format are 1,024 tokens or more reads them from the cache
when the same prefix was seen within :data:`OPENAI_RETENTION_S`, in 128-token steps, and reports
``usage.prompt_tokens_details.cached_tokens``; nothing is billed for writing.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import orjson

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
MIN_PREFIX_TOKENS = 1024
OPENAI_RETENTION_S = 600.0  # "in memory": 5 to 10 minutes of inactivity
OPENAI_STEP = 128


class PromptCache:
    """Prefix keys and when each expires; thread-safe (batch workers and API threads share one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expires: dict[bytes, float] = {}

    def use(self, key: bytes, ttl: float, now: float, *, force_miss: bool = False) -> bool:
        """Return True when ``key`` is cached (a hit); otherwise write it. Either way it lives ``ttl`` more."""
        with self._lock:
            hit = not force_miss and self._expires.get(key, 0.0) > now
            self._expires[key] = now + ttl
            return hit

    def clear(self) -> None:
        """Forget every prefix (a reset)."""
        with self._lock:
            self._expires.clear()


def best_effort_miss(rate: float, line: int) -> bool:
    """Return True when the batch's 0-based ``line`` misses the cache anyway: every 1/rate-th line."""
    return rate > 0 and math.floor((line + 1) * rate) > math.floor(line * rate)


def _marked(blocks: list[Any]) -> dict[str, Any] | None:
    """Return the ``cache_control`` of the last marked block of a list, or None."""
    marks = [b["cache_control"] for b in blocks if isinstance(b, dict) and isinstance(b.get("cache_control"), dict)]
    return marks[-1] if marks else None


def anthropic_prefix(params: dict[str, Any]) -> tuple[bytes, str, float] | None:
    """Return (the cached prefix's bytes, its text for counting, TTL seconds) of a Messages request, or None.

    The prefix runs through the last breakpoint: the tools, and the system prompt when it is marked.
    """
    tools, system = params.get("tools"), params.get("system")
    system_blocks: list[Any] = system if isinstance(system, list) else []
    mark = _marked(system_blocks)
    tools_mark = _marked(tools) if isinstance(tools, list) else None
    if mark is None and tools_mark is None:
        return None
    ttl = TTL_SECONDS.get(str((mark or tools_mark or {}).get("ttl", "5m")), TTL_SECONDS["5m"])
    parts: list[Any] = [params.get("model"), tools or []]
    text = orjson.dumps(tools).decode() if tools else ""
    if mark is not None:
        parts.append(system)
        text += "".join(b.get("text", "") for b in system_blocks if isinstance(b, dict))
    return orjson.dumps(parts, option=orjson.OPT_SORT_KEYS), text, ttl


def openai_cached_tokens(cache: PromptCache, body: dict[str, Any], prefix_tokens: int, force_miss: bool) -> int:
    """Return the prompt tokens of a chat request that OpenAI would read from its cache (0: a miss)."""
    if prefix_tokens < MIN_PREFIX_TOKENS:
        return 0
    messages = body.get("messages") or []
    key = orjson.dumps([body.get("model"), messages[:-1], body.get("response_format"), body.get("tools")])
    hit = cache.use(key, OPENAI_RETENTION_S, time.time(), force_miss=force_miss)
    return prefix_tokens // OPENAI_STEP * OPENAI_STEP if hit else 0
