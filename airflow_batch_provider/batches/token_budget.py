"""Keep the input tokens a job has enqueued at the provider under a per-model budget.

OpenAI caps the input tokens *enqueued* per model (batches validating, in progress or
finalizing); a batch that would pass the cap fails validation with ``token_limit_exceeded``.
Two layers keep a DAG from failing on it:

1. **A gate before submitting** — ``SubmitBatchOperator(token_budget=...)``: the chunk's input
   tokens are estimated (:func:`estimate_file_tokens`) and recorded in the batch metadata
   (``airflow_chunk_tokens``, ``airflow_model``); before creating a batch the operator lists the
   provider's non-terminal batches that carry those keys, sums their tokens for the same model
   and, while this chunk would push the sum over the budget, waits deferred (no worker held)
   and checks again. Chunks that are submitted at the same moment can still overshoot together
   (check, then act, with no lock in between) — the second layer catches that.
2. **Waiting out a refusal** — BatchCompleteSensor: a batch that failed *only* with its
   backend's ``capacity_refusal_codes`` (OpenAI's ``token_limit_exceeded``) is not an error yet.
   The sensor waits ``token_limit_retry_interval`` and submits the same lines again, until
   ``token_limit_max_wait`` has passed since the first refusal; only then does it raise
   BatchFailedError.

Without the gate, an Airflow pool can play the same role: make a pool per model whose slots are
token units (say 1 slot = 10,000 tokens, slots = the provider's cap / 10,000, with
``include_deferred=True`` so deferred sensors keep holding their slots) and give the *sensor*
``pool=...`` and ``pool_slots`` = the chunk's expected tokens / 10,000. Anthropic has no
enqueued-token cap and its batches carry no metadata: the gate is skipped there (with a log line).
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batch_provider.backends.registry import find_backend
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.status import BatchState, BatchStatus
from airflow_batch_provider.utils.storage import to_path

log = logging.getLogger(__name__)

CHUNK_TOKENS_KEY = "airflow_chunk_tokens"
MODEL_KEY = "airflow_model"
CHARS_PER_TOKEN = 4


def _lines(path: str) -> Iterator[bytes]:
    with to_path(path).open("rb") as handle:
        for line in handle:
            if line.strip():
                yield line


def estimate_file_tokens(path: str, model: str, provider: str | None = None) -> int:
    """Estimate the input tokens of a requests file (``tokens.estimate_input_tokens``, else chars / 4)."""
    try:
        from airflow_batch_provider.cost.tokens import estimate_input_tokens

        return int(estimate_input_tokens(_lines(path), model, provider=provider, exact=False))
    except Exception as exc:  # an odd line or a missing module must not block submitting
        log.info("token estimate of %s falls back to bytes / %d (%s)", path, CHARS_PER_TOKEN, exc)
        size = sum(len(line) for line in _lines(path))
        return math.ceil(size / CHARS_PER_TOKEN)


def token_metadata(tokens: int, model: str) -> dict[str, str]:
    """Return the batch metadata pairs that let later gates count this batch's tokens."""
    return {CHUNK_TOKENS_KEY: str(int(tokens)), MODEL_KEY: model[:512]}


def tokens_from_metadata(metadata: Mapping[str, Any] | None, model: str) -> int | None:
    """Return the tokens a batch's metadata records for ``model``, or None when it records none."""
    if not metadata or metadata.get(MODEL_KEY) != model:
        return None
    try:
        return int(metadata[CHUNK_TOKENS_KEY])
    except (KeyError, TypeError, ValueError):
        return None


def budget_for(budget: int | Mapping[str, int] | None, model: str) -> int | None:
    """Return the token budget that applies to ``model`` (an int applies to every model)."""
    if budget is None:
        return None
    if isinstance(budget, Mapping):
        value = budget.get(model)
        return None if value is None else int(value)
    return int(budget)


def check_budget_value(budget: int | Mapping[str, int] | None) -> int | Mapping[str, int] | None:
    """Return ``budget`` or raise InvalidInputError unless it is None, a positive int, or model → positive int."""
    if budget is None:
        return None
    values = list(budget.values()) if isinstance(budget, Mapping) else [budget]
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in values):
        raise InvalidInputError(
            f"token_budget must be a positive integer or a mapping of model → positive integer, got {budget!r}."
        )
    return budget


@dataclass(frozen=True)
class BudgetCheck:
    """One look at the budget: this chunk's tokens, what is already in flight, and the budget."""

    tokens: int
    in_flight: int
    budget: int

    @property
    def fits(self) -> bool:
        """True when the chunk may go now (a chunk over the budget on its own goes when nothing is in flight)."""
        return self.in_flight == 0 or self.in_flight + self.tokens <= self.budget

    def describe(self, model: str) -> str:
        """Return a log line about the check."""
        return (
            f"{model}: {self.in_flight:,} tokens in flight + {self.tokens:,} for this chunk "
            f"{'<=' if self.fits else '>'} budget {self.budget:,}"
        )


def is_token_limit_refusal(state: BatchState) -> bool:
    """Return True for a batch the provider failed only because its enqueued-token cap was reached.

    What such a refusal looks like is the backend's: its ``capacity_refusal_codes``.
    """
    backend = find_backend(state.provider)
    refusals = backend.capacity_refusal_codes if backend is not None else frozenset()
    codes = {str(e.get("code")) for e in state.errors}
    return state.status is BatchStatus.FAILED and bool(codes) and codes <= refusals


class RefusalStep(enum.StrEnum):
    """What to do about a batch refused for the enqueued-token cap."""

    WAIT = "wait"
    RESUBMIT = "resubmit"
    GIVE_UP = "give_up"


def refusal_step(wait: dict[str, float], *, now: float, interval: float, max_wait: float) -> RefusalStep:
    """Decide what to do about a ``token_limit_exceeded`` refusal; ``wait`` (JSON-able) is updated in place.

    ``wait`` holds ``since`` (the first refusal of this attempt) and, while waiting, ``resubmit_at``.
    Returns GIVE_UP once ``max_wait`` has passed since the first refusal, WAIT until
    ``resubmit_at`` (set to ``now + interval`` on the first look), then RESUBMIT.
    """
    wait.setdefault("since", now)
    if now - wait["since"] >= max_wait:
        return RefusalStep.GIVE_UP
    resubmit_at = wait.setdefault("resubmit_at", now + interval)
    if now < resubmit_at:
        return RefusalStep.WAIT
    del wait["resubmit_at"]
    return RefusalStep.RESUBMIT
