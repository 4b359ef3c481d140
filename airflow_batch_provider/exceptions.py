"""Exceptions raised by airflow-batch-provider.

The hierarchy, drawn once so callers can catch at the right depth::

    BatchProviderError                 base of everything raised here (an AirflowException)
    ├── InvalidInputError              unusable table or parameters; nothing uploaded; never retried
    │   ├── ChunkLimitError            a request or chunk does not fit the provider's limits
    │   └── CostLimitExceededError     the estimated cost is over max_cost_usd
    ├── ProviderCallError              the provider's API refused or could not be reached
    ├── UnknownBatchStatusError        the provider returned a status this package does not know
    ├── BatchPollError                 polling failed too many times in a row
    ├── BatchTimeoutError              the batch did not end within the sensor's timeout
    ├── BatchEndedBadlyError           the batch ended without usable results
    │   ├── BatchFailedError           provider-side validation or processing failure
    │   └── BatchCancelledError        the batch was cancelled; never retried
    ├── ResultsError                   result files could not be read or joined back
    ├── SinkError                      a merged part could not be written to (or read from) a sink
    └── TooManyFailuresError           merged, but some chunk has more failed rows than max_failure_ratio;
                                       never retried
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException


class BatchProviderError(AirflowException):
    """Base class of every error raised by this package."""


class InvalidInputError(BatchProviderError, AirflowFailException):
    """Reject input that cannot be turned into batch requests; nothing was uploaded.

    An AirflowFailException too: retrying the same input cannot succeed, so the task fails
    at once instead of burning its retries.
    """

    def __init__(self, message: str, rows: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.rows = list(rows)


class ChunkLimitError(InvalidInputError):
    """Reject a request or chunk that exceeds the provider's count or byte limits."""


class CostLimitExceededError(InvalidInputError):
    """Reject a job whose estimated batch cost exceeds ``max_cost_usd``; nothing was uploaded."""

    def __init__(
        self, message: str, *, estimate_usd: float, limit_usd: float, estimate: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.estimate_usd = estimate_usd
        self.limit_usd = limit_usd
        self.estimate = estimate or {}


class ProviderCallError(BatchProviderError):
    """Report a provider API call that failed after the SDK's and our own retries."""


class UnknownBatchStatusError(BatchProviderError):
    """Report a provider status string that the status mapping does not know."""


class BatchPollError(BatchProviderError):
    """Report that polling a batch failed more times in a row than allowed."""


class BatchTimeoutError(BatchProviderError):
    """Report that a batch did not end within the allowed time."""


class BatchEndedBadlyError(BatchProviderError):
    """Report a batch that ended failed or cancelled; carries the provider's messages.

    An expired batch is not an error: what finished is kept and what expired is sent again
    (see BatchCompleteSensor).
    """

    def __init__(
        self, message: str, batch_id: str, errors: Sequence[dict[str, Any]] = (), state: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.batch_id = batch_id
        self.errors = list(errors)
        self.state = state or {}


class BatchFailedError(BatchEndedBadlyError):
    """Report a batch the provider failed (validation errors, token limits, ...)."""


class BatchCancelledError(BatchEndedBadlyError, AirflowFailException):
    """Report a batch that was cancelled, by us or by someone else.

    An AirflowFailException too: a cancel by someone else is a decision, and a cancel by this
    task means the task is being killed; a retry would only poll the same cancelled batch again,
    so the task fails at once. Clearing the task sends the lines again (see BatchCompleteSensor).
    """


class ResultsError(BatchProviderError):
    """Report result files that cannot be read or joined back onto the source rows.

    ``line`` is the 1-based line of the result block or file at fault, when one is known.
    """

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


class SinkError(BatchProviderError):
    """A merged part could not be written to (or read from) the sink; the message names table and chunk."""


class TooManyFailuresError(BatchProviderError, AirflowFailException):
    """Report chunks whose failed rows exceed ``max_failure_ratio``; every part file was still written.

    A verdict on the data, like InvalidInputError: merging the same results again gives the same
    answer, so the task fails at once instead of downloading everything again on each retry.

    ``chunks`` holds one dict per offending chunk: ``label``, ``chunk_index``, ``rows``, ``failed``,
    ``ratio`` and ``top_errors`` (``[(description, count), ...]``).
    """

    def __init__(
        self, message: str, chunks: Sequence[dict[str, Any]] = (), summary: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.chunks = list(chunks)
        self.summary = summary or {}
