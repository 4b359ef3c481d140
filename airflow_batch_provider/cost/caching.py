"""Prompt caching in the cost figures: the hit rate an estimate assumes, and the summary's cache rows.

Before a job runs, nobody knows how many of its requests will find their shared prefix in the
provider's cache (Anthropic calls hits inside Message Batches best-effort). The estimate assumes
:data:`CACHE_HIT_RATE` of the tokens in prefixes marked for the cache are read from it and the
rest written to it (each miss writes the prefix again), and says so. After the run, the usage each
provider reported per line gives the real split (docs/cost.md, "Prompt caching").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_batch_provider.cost.money import usd

CACHE_HIT_RATE = 0.9


def assumed_split(cacheable_tokens: int) -> tuple[int, int, str]:
    """Return (tokens read from the cache, tokens written to it, the assumption) for an estimate."""
    cached = round(cacheable_tokens * CACHE_HIT_RATE)
    return (
        cached,
        cacheable_tokens - cached,
        f"assuming {CACHE_HIT_RATE:.0%} of requests hit the cache, the rest write it",
    )


def cache_note(basis: str, cached: int, written: int, batch_usd: float | None, uncached_usd: float | None) -> str:
    """Return "" when nothing is cached, else what caching reads and writes and the price without it."""
    if not (cached or written):
        return ""
    return (
        f"prompt caching ({basis}): {cached:,} input tokens read from the cache, {written:,} written: "
        f"{usd(batch_usd)} batch vs {usd(uncached_usd)} without caching"
    )


def cache_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Return the prompt-cache rows of the run summary table (none when nothing was cached)."""
    read, written = int(summary.get("cached_input_tokens") or 0), int(summary.get("cache_write_tokens") or 0)
    if not (read or written):
        return []
    saved = (
        f"{usd(summary.get('cache_saved_usd'))} beyond the batch discount "
        f"({usd(summary.get('uncached_cost_usd'))} without caching)"
    )
    return [
        ("cached input tokens", f"{read:,} read from the prompt cache, {written:,} written to it"),
        ("prompt caching saved", saved),
    ]
