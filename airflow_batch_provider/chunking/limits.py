"""Per-provider request limits, checked at chunk time before anything is uploaded."""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_batch_provider.backends.gemini import limits as _gemini_limits

MB = 1024 * 1024


@dataclass(frozen=True)
class ProviderLimits:
    """What one provider accepts in a single batch."""

    provider: str
    max_requests: int
    max_bytes: int
    default_byte_cap: int  # the chunk byte cap we use unless told otherwise; safely under max_bytes
    endpoints: frozenset[str]
    custom_id_pattern: re.Pattern[str] | None = None  # None: any non-empty string
    max_custom_id_chars: int | None = None  # None: no length limit beyond the pattern
    # Fewest requests one batch may hold (Bedrock: 100 records per job); see chunking/min_records.py.
    min_requests: int = 1


OPENAI_LIMITS = ProviderLimits(
    provider="openai",
    max_requests=50_000,
    max_bytes=200 * MB,
    default_byte_cap=190 * MB,
    endpoints=frozenset(
        {"/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/responses", "/v1/moderations"}
    ),
    max_custom_id_chars=512,
)

ANTHROPIC_LIMITS = ProviderLimits(
    provider="anthropic",
    max_requests=100_000,
    max_bytes=256 * MB,
    default_byte_cap=240 * MB,
    endpoints=frozenset({"/v1/messages"}),
    custom_id_pattern=re.compile(r"[a-zA-Z0-9_-]{1,64}"),
)

# Amazon Bedrock batch inference (service quotas, default values; some are adjustable per account
# and model): 100 to 50,000 records per job and per input file, 1 GB per input file, 5 GB per job.
# We write one input file per job, so the file caps bind. Record ids: alphanumeric (the docs' own
# examples are 11 characters; longer ones are accepted) -- ids that do not fit are derived as for Anthropic.
BEDROCK_LIMITS = ProviderLimits(
    provider="bedrock",
    max_requests=50_000,
    max_bytes=1024 * MB,
    default_byte_cap=1000 * MB,
    endpoints=frozenset({"/model/invoke"}),
    custom_id_pattern=re.compile(r"[a-zA-Z0-9]{1,64}"),
    min_requests=100,
)

# Google's Gemini Batch API: the backend's own data (backends/gemini/limits.py imports nothing).
GEMINI_LIMITS = ProviderLimits(**_gemini_limits.LIMIT_FIELDS)  # type: ignore[arg-type]

PROVIDER_LIMITS: dict[str, ProviderLimits] = {
    lim.provider: lim for lim in (OPENAI_LIMITS, ANTHROPIC_LIMITS, BEDROCK_LIMITS, GEMINI_LIMITS)
}


def limits_for(provider: str) -> ProviderLimits:
    """Return the limits of ``provider`` or raise naming the known providers."""
    try:
        return PROVIDER_LIMITS[provider]
    except KeyError:
        from airflow_batch_provider.exceptions import InvalidInputError

        raise InvalidInputError(f"Unknown provider {provider!r}; choose one of {sorted(PROVIDER_LIMITS)}.") from None
