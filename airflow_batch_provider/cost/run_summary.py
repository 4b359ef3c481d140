"""The cost keys of a run summary: the pre-submit estimate beside the actual cost and the real-time price.

The merge writes them (:func:`cost_summary`) from the usage its result lines report; the summary table,
the demo and the run report show them (:func:`cost_rows`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_batch_provider.cost.caching import cache_rows
from airflow_batch_provider.cost.estimate import CostEstimate
from airflow_batch_provider.cost.money import usd


def comparison_line(estimate: CostEstimate) -> str:
    """Return the one-line batch vs real-time comparison for a run summary."""
    if estimate.batch_usd is None or estimate.realtime_usd is None:
        return f"batch vs real-time: no price known for {estimate.model}"
    saving = estimate.realtime_usd - estimate.batch_usd
    share = f", {saving / estimate.realtime_usd:.0%}" if estimate.realtime_usd else ""
    return (
        f"batch vs real-time: {usd(estimate.batch_usd)} with the batch API vs {usd(estimate.realtime_usd)} "
        f"in real time for the same {estimate.requests:,} requests to {estimate.model} "
        f"(saved {usd(saving)}{share})"
    )


def cost_summary(
    actual: CostEstimate, upper_bound: float | None = None, expected: float | None = None
) -> dict[str, Any]:
    """Return the cost keys of a run summary: the pre-submit figures next to the actual cost, and real time.

    ``upper_bound`` and ``expected`` are the batch USD estimated before submission (e.g. summed
    from the chunks); None when unknown.
    """
    return {
        "cost_expected_usd": expected,
        "cost_upper_bound_usd": upper_bound,
        "actual_cost_usd": actual.batch_usd,
        "realtime_cost_usd": actual.realtime_usd,
        "saved_usd": actual.saving_usd,
        "uncached_cost_usd": actual.uncached_batch_usd,  # the same batch without prompt caching
        "cache_saved_usd": actual.cache_saving_usd,
        "cost_models": actual.model,
        "cost_comparison": comparison_line(actual),
    }


def cost_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Return (label, value) rows for the run summary table from :func:`cost_summary` keys."""
    if "actual_cost_usd" not in summary:
        return []
    return [
        ("expected cost", f"{usd(summary.get('cost_expected_usd'))} (before submission)"),
        ("cost upper bound", f"{usd(summary.get('cost_upper_bound_usd'))} (every answer at max_tokens)"),
        ("actual cost", f"{usd(summary.get('actual_cost_usd'))} (usage the provider reported)"),
        ("real-time cost", usd(summary.get("realtime_cost_usd"))),
        ("batch vs real-time", str(summary.get("cost_comparison", "")).removeprefix("batch vs real-time: ")),
        *cache_rows(summary),
    ]
