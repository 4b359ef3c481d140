"""Per-provider request limits, checked at chunk time before anything is uploaded."""

from __future__ import annotations

import re
from dataclasses import dataclass

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

PROVIDER_LIMITS: dict[str, ProviderLimits] = {lim.provider: lim for lim in (OPENAI_LIMITS, ANTHROPIC_LIMITS)}


def limits_for(provider: str) -> ProviderLimits:
    """Return the limits of ``provider`` or raise naming the known providers."""
    try:
        return PROVIDER_LIMITS[provider]
    except KeyError:
        from airflow_batch_provider.exceptions import InvalidInputError

        raise InvalidInputError(f"Unknown provider {provider!r}; choose one of {sorted(PROVIDER_LIMITS)}.") from None
