"""Batch or real time? Cost, completion time and a recommendation for one workload.

The recommendation follows the decision matrix of the batch-inference brief:

- **real time** when a person or a system is waiting on each answer (chat, search, agent
  tools): the batch window is up to 24 hours, which latency-sensitive work cannot take;
- **batch** for async work (nightly summaries, bulk classification, embeddings, eval runs),
  and always from 10,000 requests a day: it costs half and never competes with production
  traffic for rate limits. Below that volume batch still halves the bill, but the saving is
  small; real time is acceptable when simplicity matters more.

Real-time duration is bound by rate limits: tokens (input + output) ÷ tokens-per-minute, or
requests ÷ requests-per-minute when that is slower. Batch jobs are given a 24-hour completion
window and usually finish in minutes to a few hours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from airflow_batch_provider.cost.estimate import CostEstimate, PricingArg, price_usage, usd
from airflow_batch_provider.utils.checks import check_int

BATCH_MIN_REQUESTS_PER_DAY = 10_000
BATCH_WINDOW_HOURS = 24
DEFAULT_TOKENS_PER_MINUTE = 200_000
DEFAULT_CHUNK_SIZE = 10_000


@dataclass(frozen=True)
class Recommendation:
    """Batch or real time, and why."""

    choice: str  # "batch" or "real-time"
    reason: str


@dataclass(frozen=True)
class WorkloadPlan:
    """One workload priced and timed both ways, with the recommendation."""

    rows: int
    prompt_tokens: int
    output_tokens: int
    runs_per_day: int
    estimate: CostEstimate
    tokens_per_minute: int
    requests_per_minute: int | None
    realtime_minutes: float
    chunks: int
    chunk_size: int
    recommendation: Recommendation


def realtime_minutes(
    requests: int, tokens_per_request: int, tokens_per_minute: int, requests_per_minute: int | None = None
) -> float:
    """Return how long real-time calls take when rate limits, not latency, are the bound."""
    minutes = requests * tokens_per_request / tokens_per_minute
    if requests_per_minute:
        minutes = max(minutes, requests / requests_per_minute)
    return minutes


def recommend(
    requests_per_day: int, *, latency_sensitive: bool, saving_usd: float | None = None, realtime_min: float = 0.0
) -> Recommendation:
    """Apply the decision matrix to one workload."""
    if latency_sensitive:
        return Recommendation(
            "real-time",
            f"someone waits on each answer (chat, search, agent tools); a batch can take up to "
            f"{BATCH_WINDOW_HOURS} h, which latency-sensitive work cannot accept.",
        )
    saved = "" if saving_usd is None else f" ({usd(saving_usd)} saved per run)"
    slow = ""
    if realtime_min > BATCH_WINDOW_HOURS * 60:
        slow = f" At your rate limit real time would take longer than the {BATCH_WINDOW_HOURS} h batch window anyway."
    if requests_per_day >= BATCH_MIN_REQUESTS_PER_DAY:
        return Recommendation(
            "batch",
            f"async work at {requests_per_day:,} requests/day (≥ {BATCH_MIN_REQUESTS_PER_DAY:,}): batch halves the "
            f"cost{saved} and keeps the load off the rate limits your real-time traffic needs.{slow}",
        )
    return Recommendation(
        "batch",
        f"the work can wait, so batch still halves the cost{saved}; at {requests_per_day:,} requests/day "
        f"(< {BATCH_MIN_REQUESTS_PER_DAY:,}) the saving is small, so real time is acceptable if simplicity "
        f"matters more.{slow}",
    )


def plan_workload(
    rows: int,
    prompt_tokens: int,
    output_tokens: int,
    model: str,
    *,
    tokens_per_minute: int = DEFAULT_TOKENS_PER_MINUTE,
    requests_per_minute: int | None = None,
    runs_per_day: int = 1,
    latency_sensitive: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    pricing: PricingArg = None,
) -> WorkloadPlan:
    """Price and time ``rows`` requests of ``prompt_tokens`` in and ``output_tokens`` out, both ways."""
    for name, value, minimum in (
        ("rows", rows, 1),
        ("prompt_tokens", prompt_tokens, 0),
        ("output_tokens", output_tokens, 0),
        ("tokens_per_minute", tokens_per_minute, 1),
        ("runs_per_day", runs_per_day, 1),
        ("chunk_size", chunk_size, 1),
        ("requests_per_minute", requests_per_minute if requests_per_minute is not None else 1, 1),
    ):
        check_int(name, value, minimum)
    estimate = price_usage(
        model,
        rows * prompt_tokens,
        rows * output_tokens,
        requests=rows,
        pricing=pricing,
        require_price=True,
        method=f"{prompt_tokens:,} per request (given)",
        output_basis=f"{output_tokens:,} per request (given)",
    )
    minutes = realtime_minutes(rows, prompt_tokens + output_tokens, tokens_per_minute, requests_per_minute)
    return WorkloadPlan(
        rows=rows,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        runs_per_day=runs_per_day,
        estimate=estimate,
        tokens_per_minute=tokens_per_minute,
        requests_per_minute=requests_per_minute,
        realtime_minutes=minutes,
        chunks=math.ceil(rows / chunk_size),
        chunk_size=chunk_size,
        recommendation=recommend(
            rows * runs_per_day,
            latency_sensitive=latency_sensitive,
            saving_usd=estimate.saving_usd,
            realtime_min=minutes,
        ),
    )


def duration(minutes: float) -> str:
    """Format minutes as "45 s", "31 min" or "2.5 h"."""
    if minutes < 1:
        return f"{max(minutes * 60, 1):.0f} s"
    if minutes < 90:
        return f"{minutes:.0f} min"
    return f"{minutes / 60:.1f} h"


def format_plan(plan: WorkloadPlan) -> str:
    """Render a plan as the CLI prints it."""
    est = plan.estimate
    saving = est.saving_usd or 0.0
    share = saving / est.realtime_usd if est.realtime_usd else 0.0
    limit = f"{plan.tokens_per_minute:,} tokens/min"
    if plan.requests_per_minute:
        limit += f", {plan.requests_per_minute:,} requests/min"
    batch_usd, realtime_usd = usd(est.batch_usd), usd(est.realtime_usd)
    money = max(len(batch_usd), len(realtime_usd))
    rows = [
        ("tokens", f"{est.input_tokens:,} input + {est.output_tokens:,} output"),
        # The figures are as good as the averages given: say so, and how to get a bound instead.
        ("costs are", "expected at the average tokens given (pass max_tokens as --output-tokens for an upper bound)"),
        (
            "batch API",
            f"{batch_usd.rjust(money)}  up to {BATCH_WINDOW_HOURS} h (completion window); "
            "usually minutes to a few hours",
        ),
        (
            "real-time API",
            f"{realtime_usd.rjust(money)}  ≈ {duration(plan.realtime_minutes)} at {limit} (rate-limit bound)",
        ),
        ("saving", f"{usd(saving)} per run ({share:.0%}) with batch"),
        ("chunks", f"{plan.chunks:,} request file(s) of up to {plan.chunk_size:,} requests"),
    ]
    if plan.runs_per_day > 1:
        rows.append(("per day", f"{plan.runs_per_day} runs: {usd(saving * plan.runs_per_day)} saved"))
    width = max(len(label) for label, _ in rows)
    head = (
        f"Workload: {plan.rows:,} requests x ({plan.prompt_tokens:,} prompt + {plan.output_tokens:,} output tokens) "
        f"on {est.model} ({est.provider})"
    )
    body = "\n".join(f"  {label.ljust(width)}  {value}" for label, value in rows)
    rec = plan.recommendation
    return f"{head}\n{body}\nRecommendation: {rec.choice.upper()}: {rec.reason}"
