"""Anthropic message synthesis and the message-batch lifecycle.

in_progress → ended (or in_progress → canceling → ended). Request counts move out of
``processing`` only at the end, as the real API does. ``params`` problems surface as
``errored`` results, never at create time. Under the ``polls_before_done`` fault a batch that
would end is held ``in_progress`` until its status has been retrieved that many times
(:meth:`AnthropicRunner.polled`).
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from typing import Any

import orjson

from airflow_batch_emulator.faults import Faults, cut_short, line_fate
from airflow_batch_emulator.prompt_cache import (
    MIN_PREFIX_TOKENS,
    TTL_SECONDS,
    PromptCache,
    anthropic_prefix,
    best_effort_miss,
)
from airflow_batch_emulator.records import AnthropicBatch
from airflow_batch_emulator.schema import schema_instance
from airflow_batch_emulator.store import Store
from airflow_batch_emulator.synth import (
    ParamError,
    answer_text,
    claude_prompt_tokens,
    claude_tokens,
    content_text,
    cut_anthropic_answer,
    estimate_tokens,
    messages_text,
    request_key,
    rng_for,
    structured_text,
    truncate,
    unique_id,
)


def _forced_tool(params: dict[str, Any]) -> dict[str, Any] | None:
    """Return the tool that ``tool_choice`` forces (type ``tool`` or ``any``), or None."""
    choice = params.get("tool_choice")
    tools = [t for t in params.get("tools") or [] if isinstance(t, dict)]
    if not isinstance(choice, dict):
        return None
    if choice.get("type") == "any" and tools:
        return tools[0]
    if choice.get("type") != "tool":
        return None
    for tool in tools:
        if tool.get("name") == choice.get("name"):
            return tool
    raise ParamError(f"tool_choice.name: tool {choice.get('name')!r} is not defined in tools")


def message(params: Any, cache: PromptCache | None = None, force_miss: bool = False) -> dict[str, Any]:
    """Answer one Messages request; raise ``ParamError`` for what the API would reject.

    With a ``cache``, a prefix marked with ``cache_control`` is read from it or written to it (see
    :mod:`.prompt_cache`; ``force_miss``: a best-effort miss), and the usage says which.
    """
    if not isinstance(params, dict):
        raise ParamError("params: Input should be an object")
    model = params.get("model")
    if not isinstance(model, str) or not model:
        raise ParamError("model: Field required")
    max_tokens = params.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ParamError("max_tokens: Field required (a positive integer)")
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ParamError("messages: Field required (a non-empty list)")
    system = params.get("system")
    key = request_key(model.encode(), orjson.dumps(system), orjson.dumps(messages, option=orjson.OPT_SORT_KEYS))
    texts = messages_text(messages)
    tools = params.get("tools")
    input_tokens = claude_prompt_tokens(
        model, content_text(system) if system is not None else "", orjson.dumps(tools).decode() if tools else "", texts
    )
    if system is not None:
        texts.insert(0, content_text(system))
    tool = _forced_tool(params)
    if tool is not None:
        tool_input = schema_instance(tool.get("input_schema", {}), rng_for(key))
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": "toolu_" + key.hex()[:24], "name": tool.get("name"), "input": tool_input}
        ]
        stop_reason, output_tokens = "tool_use", estimate_tokens(orjson.dumps(tool_input).decode())
    else:
        output_format = (params.get("output_config") or {}).get("format")
        text = structured_text(output_format, key) or answer_text(key, "\n".join(texts))
        text, output_tokens, cut = truncate(text, max_tokens)
        content = [{"type": "text", "text": text}]
        stop_reason = "max_tokens" if cut else "end_turn"
    return {
        "id": "msg_" + key.hex()[24:48],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": _usage(params, input_tokens, output_tokens, cache, force_miss),
    }


def _usage(
    params: dict[str, Any], input_tokens: int, output_tokens: int, cache: PromptCache | None, force_miss: bool
) -> dict[str, Any]:
    """Return a message's usage: ``input_tokens`` are the uncached ones, as Anthropic reports them."""
    read = written = 0
    ttl_name = "5m"
    prefix = anthropic_prefix(params) if cache is not None else None
    if cache is not None and prefix is not None:
        key, text, ttl = prefix
        tokens = min(claude_tokens(params["model"], text), input_tokens)
        ttl_name = "1h" if ttl > TTL_SECONDS["5m"] else "5m"
        if tokens >= MIN_PREFIX_TOKENS:
            if cache.use(key, ttl, time.time(), force_miss=force_miss):
                read = tokens
            else:
                written = tokens
    return {
        "input_tokens": input_tokens - read - written,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": written if ttl_name == "5m" else 0,
            "ephemeral_1h_input_tokens": written if ttl_name == "1h" else 0,
        },
    }


def _errored(kind: str, message_text: str) -> dict[str, Any]:
    return {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": message_text}}}


def run_request(
    batch_id: str, custom_id: str, params: Any, faults: Faults, cache: PromptCache | None = None, line: int = 0
) -> tuple[str, bytes]:
    """Execute one batch request (the batch's 0-based ``line``); return (result type, JSONL record)."""
    fate = line_fate(faults, custom_id, batch_id)
    result: dict[str, Any]
    if fate == "expired":
        result = {"type": "expired"}
    elif fate == "server_error":
        result = _errored("api_error", "Internal server error (emulator fault line_error_rate).")
    elif fate == "invalid":
        result = _errored("invalid_request_error", "Invalid request (emulator fault invalid_line_rate).")
    else:
        try:
            answer = message(params, cache, best_effort_miss(faults.cache_miss_rate, line))
            unique_id(answer, hashlib.blake2b(f"{batch_id}:{custom_id}".encode(), digest_size=12).hexdigest())
            if cut_short(faults, custom_id):
                cut_anthropic_answer(answer)
            result = {"type": "succeeded", "message": answer}
        except ParamError as exc:
            result = _errored("invalid_request_error", exc.message)
    return result["type"], orjson.dumps({"custom_id": custom_id, "result": result})


class AnthropicRunner:
    """Advances Anthropic message batches; called by the worker thread."""

    def __init__(self, store: Store, latency: float, slice_size: int) -> None:
        self.store = store
        self.latency = latency
        self.slice_size = slice_size
        self.cache = PromptCache()  # one per emulator: batches of one job share their prefixes

    def _live(self, batch: AnthropicBatch) -> bool:
        return self.store.anthropic_batches.get(batch.id) is batch

    def step(self, batch: AnthropicBatch, now: float) -> float | None:
        """Do the next piece of work for ``batch``; return seconds until it wants the next step."""
        if batch.held is not None:  # finished; a status retrieve ends it (see ``conclude``)
            return None
        if batch.status == "canceling":
            if now < batch.due:
                return batch.due - now
            self._end(batch)
            return None
        if batch.status != "in_progress":
            return None
        if now < batch.due:
            return batch.due - now
        return self._progress(batch, now)

    def _progress(self, batch: AnthropicBatch, now: float) -> float | None:
        pace = self.latency + batch.faults.slow
        total = len(batch.requests)
        with self.store.lock:
            start = batch.cursor
            target = total if pace <= 0 else min(total, math.ceil(total * (now - batch.phase_start) / pace))
            stop = min(target, start + self.slice_size)
            if batch.cancel_at_line is not None:
                stop = min(stop, batch.cancel_at_line)
        done = [
            run_request(batch.id, cid, params, batch.faults, self.cache, line)
            for line, (cid, params) in enumerate(batch.requests[start:stop], start)
        ]
        with self.store.lock:
            if not self._live(batch):
                return None
            counters = self.store.counters["anthropic"]
            for kind, line in done:
                batch.results.append(line)
                batch.counts[kind] += 1
                counters[f"requests_{kind}"] += 1
            counters["requests_processed"] += len(done)
            batch.cursor = max(batch.cursor, stop)
            if batch.status != "in_progress":
                return 0.0
            if batch.cancel_at_line is not None and batch.cursor >= batch.cancel_at_line:
                self.cancel(batch, now, provider_side=True)
                return 0.0
            if batch.cursor < total:
                return max(0.0, batch.phase_start + pace * (batch.cursor + 1) / total - now)
            if now < batch.phase_start + pace:
                return batch.phase_start + pace - now
        self.conclude(batch)
        return None

    def conclude(self, batch: AnthropicBatch) -> None:
        """End ``batch`` now, or hold it ``in_progress`` for ``polls_before_done``.

        ``held`` marks a held batch; the status retrieve that makes ``polls`` reach
        ``polls_before_done`` ends it.
        """
        with self.store.lock:
            if not self._live(batch) or batch.status != "in_progress":
                return  # canceled meanwhile: the worker ends it
            if batch.polls < batch.faults.polls_before_done:
                batch.held = "ended"
                self.store.counters["anthropic"]["batches_held_for_polls"] += 1
                return
        self._end(batch)

    def polled(self, batch: AnthropicBatch) -> None:
        """Count one status retrieve of ``batch``; end a held batch once there were enough."""
        with self.store.lock:
            batch.polls += 1
            if not batch.held or batch.polls < batch.faults.polls_before_done:
                return
            batch.held = ""  # claimed: not None keeps the worker off, "" keeps other retrieves off
        self._end(batch)

    def cancel(self, batch: AnthropicBatch, now: float, provider_side: bool = False) -> None:
        """Start canceling (caller holds the lock); unprocessed requests end as ``canceled``."""
        if batch.status != "in_progress":
            return
        if batch.held:  # a held batch is still in progress for its clients: cancel it like one
            batch.held = None
        batch.set_status("canceling", time.time())
        batch.due = now + self.latency
        self.store.counters["anthropic"]["batches_cancelled"] += 1
        if provider_side:
            self.store.counters["anthropic"]["batches_cancelled_by_provider"] += 1
        self.store.wakeup.set()

    def _end(self, batch: AnthropicBatch) -> None:
        with self.store.lock:
            if not self._live(batch) or batch.status == "ended":
                return
            lines = batch.results
            counters = self.store.counters["anthropic"]
            for custom_id, _ in batch.requests[batch.cursor :]:
                lines.append(orjson.dumps({"custom_id": custom_id, "result": {"type": "canceled"}}))
                batch.counts["canceled"] += 1
                counters["requests_canceled"] += 1
            batch.cursor = len(batch.requests)
            batch.results = []
        random.Random(batch.id).shuffle(lines)
        blob = b"".join(line + b"\n" for line in lines)
        with self.store.lock:
            if self._live(batch):
                batch.results_blob = blob
                batch.held = None
                batch.set_status("ended", time.time())
