"""Requests longer than the model's context window, refused by the chunk step before anything is uploaded.

A request whose prompt and ``max_tokens`` do not fit the model's context window is billed nothing
but fails at the provider after the whole batch ran (OpenAI: ``context_length_exceeded``), so its
row would come back errored a day later. The chunk step counts such a row's tokens the way the cost
estimate does (:mod:`airflow_batch_provider.cost.tokens`: tiktoken when it loads offline, else the
backend's characters-per-token rule) and refuses it, naming the row, its tokens and the window.

Only rows that could possibly be too long are counted: a token is at least one byte of the request
line, so a line of ``n`` bytes holds at most ``n`` tokens; with a 128K window nearly every row is
ruled out by its length alone, at no cost.

:data:`CONTEXT_WINDOWS` lists the windows (input plus output tokens) of the model families the
built-in backends serve, from the providers' model pages; a model it does not name is not checked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from airflow_batch_provider.chunking.problems import RowProblems
    from airflow_batch_provider.chunking.requests import RenderedRequests
    from airflow_batch_provider.contract import SpecFields
    from airflow_batch_provider.cost.tokens import TokenCounter

# (model name pattern, context window in tokens): the first full match wins. Fine-tunes (``ft:``) and
# dated snapshots (``-2024-08-06``) share their base model's window. Bedrock ids may carry a
# cross-region prefix (``us.``, ``eu.``, ``apac.``).
CONTEXT_WINDOWS: tuple[tuple[re.Pattern[str], int], ...] = tuple(
    (re.compile(pattern), tokens)
    for pattern, tokens in (
        (r"(ft:)?gpt-4o(-mini)?([-:].*)?", 128_000),
        (r"(ft:)?gpt-4\.1(-mini|-nano)?([-:].*)?", 1_047_576),
        (r"gpt-5(-mini|-nano)?(-\d{4}-\d\d-\d\d)?", 400_000),
        (r"o[134](-mini)?(-\d{4}-\d\d-\d\d)?", 200_000),
        (r"(ft:)?gpt-3\.5-turbo([-:].*)?", 16_385),
        (r"text-embedding-3-(small|large)|text-embedding-ada-002", 8_191),
        (r"claude-.*", 200_000),
        (r"([a-z]+\.)?anthropic\.claude-.*", 200_000),
        (r"([a-z]+\.)?amazon\.nova-micro-.*", 128_000),
        (r"([a-z]+\.)?amazon\.nova-(lite|pro)-.*", 300_000),
        (r"gemini-(1\.5-flash|2\.0-flash|2\.5-(pro|flash)).*", 1_048_576),
    )
)
_OUTPUT_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def context_window(model: str) -> int | None:
    """Return ``model``'s context window in tokens, or None when :data:`CONTEXT_WINDOWS` does not name it."""
    return next((tokens for pattern, tokens in CONTEXT_WINDOWS if pattern.fullmatch(model)), None)


@dataclass
class ContextCheck:
    """Record the rows whose request (input plus ``max_tokens``) does not fit ``window`` tokens."""

    model: str
    provider: str
    window: int
    max_output: int  # from the spec's params: what rules a line out by its length
    _counter: TokenCounter | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_spec(cls, spec: SpecFields) -> ContextCheck | None:
        """Return the check for ``spec``'s model, or None when its window is not known."""
        window = context_window(spec.model)
        if window is None:
            return None
        return cls(spec.model, spec.provider, window, _max_output(spec.params))

    def check(self, rendered: RenderedRequests, custom_ids: pa.Array, *, offset: int, problems: RowProblems) -> None:
        """Count the tokens of the lines that may not fit; record those that do not, with their tokens."""
        maybe = np.flatnonzero(rendered.sizes + self.max_output > self.window)
        if not maybe.size:
            return
        too_long, details = [], []
        for index in maybe.tolist():
            tokens, output = self._tokens(bytes(rendered.data(index, index + 1)))
            if tokens + output > self.window:
                too_long.append(offset + index)
                details.append(
                    f"row {offset + index} (custom_id {custom_ids[index].as_py()!r}): about {tokens:,} input tokens"
                    + (f" + max_tokens {output:,}" if output else "")
                )
        problems.add(
            f"request longer than the {self.window:,}-token context window of {self.model}",
            too_long,
            advice=f"The provider would fail these rows after the batch ran. Shorten their text, lower max_tokens, "
            f"or use a model with a larger window (tokens counted as the cost estimate does: {self.counter.method}).",
            details=details,
        )

    @property
    def counter(self) -> TokenCounter:
        """The cost estimate's token counter for the model (built on first use: it may load tiktoken)."""
        if self._counter is None:
            from airflow_batch_provider.cost.tokens import TokenCounter

            self._counter = TokenCounter(self.model, self.provider)
        return self._counter

    def _tokens(self, line: bytes) -> tuple[int, int]:
        """Return (input tokens, max output tokens) of one request line."""
        from airflow_batch_provider.cost.tokens import request_parts

        parts = request_parts(line, self.provider)
        return self.counter.count_total(parts.pieces) + parts.overhead, parts.max_output or self.max_output


def _max_output(params: Mapping[str, Any]) -> int:
    """Return the largest output-token limit the params set (0 when none)."""
    values = [params[key] for key in _OUTPUT_KEYS if isinstance(params.get(key), int)]
    return max(values, default=0)
