"""Price a batch job before it is submitted and after it ran, and compare it with real time.

Before: :func:`estimate_chunks_cost` counts the tokens of the chunk files the chunk step wrote
(see :mod:`airflow_batch_provider.cost.tokens` for how) and prices them two ways — a
:class:`JobEstimate` holds the *upper bound* (every answer as long as ``max_tokens`` allows) and
the *expected* cost (answers as long as the response schema or ``expected_output_tokens`` says);
:func:`check_budget` raises :class:`~airflow_batch_provider.exceptions.CostLimitExceededError`
when the one the user chose (``max_cost_basis``) is over ``max_cost_usd``, before anything is
uploaded. After: :class:`UsageTally` adds up the usage the
provider reported per model and :func:`price_usage` prices it. Every estimate carries the
real-time price of the same tokens, so the run summary can say what batch saved
(:mod:`airflow_batch_provider.cost.run_summary`).

A model without a known price gives an estimate whose USD fields are None (cost is optional),
unless ``require_price=True``; :func:`check_budget` always needs a price.

``python -m airflow_batch_provider.cost --help`` is the batch vs real-time decision helper.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from airflow_batch_provider.cost.caching import assumed_split, cache_note
from airflow_batch_provider.cost.money import usd
from airflow_batch_provider.cost.pricing import PricingTable, load_pricing
from airflow_batch_provider.cost.tokens import TokenCounter, TokenTally, count_request_tokens
from airflow_batch_provider.exceptions import CostLimitExceededError, InvalidInputError
from airflow_batch_provider.utils import storage

PricingArg = PricingTable | Mapping[str, Any] | str | os.PathLike[str] | None


@dataclass(frozen=True)
class CostEstimate:
    """Tokens and USD cost of a set of requests, at batch and at real-time prices."""

    model: str
    requests: int
    input_tokens: int
    output_tokens: int
    batch_usd: float | None
    realtime_usd: float | None
    provider: str = ""
    method: str = ""  # how input tokens were counted ("tiktoken o200k_base", "approximation ...", "actual usage")
    output_basis: str = ""  # where output tokens came from ("max_tokens", "expected_output_tokens=5", ...)
    # Of input_tokens: read from and written to the prompt cache (estimated: see cost/caching.py).
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    uncached_batch_usd: float | None = None  # the batch price of the same tokens without prompt caching
    cache_basis: str = ""  # how the cached tokens were obtained (the hit rate assumed, or "actual usage")

    @property
    def priced(self) -> bool:
        """Return True when the model's price was known."""
        return self.batch_usd is not None and self.realtime_usd is not None

    @property
    def cache_saving_usd(self) -> float | None:
        """Return what prompt caching saves on the batch price (negative when writes cost more than reads save)."""
        if self.batch_usd is None or self.uncached_batch_usd is None:
            return None
        return self.uncached_batch_usd - self.batch_usd

    def cache_note(self) -> str:
        """Return "" without cached tokens, else what caching reads and writes and what it saves."""
        written, uncached = self.cache_write_tokens, self.uncached_batch_usd
        return cache_note(self.cache_basis, self.cached_input_tokens, written, self.batch_usd, uncached)

    @property
    def saving_usd(self) -> float | None:
        """Return what batch saves over real time (None when unpriced)."""
        if self.batch_usd is None or self.realtime_usd is None:
            return None
        return self.realtime_usd - self.batch_usd

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict (for XCom and the run summary)."""
        return {**asdict(self), "saving_usd": self.saving_usd, "cache_saving_usd": self.cache_saving_usd}

    def describe(self) -> str:
        """Return one line: requests, tokens and how they were counted, and both prices."""
        tokens = (
            f"{self.requests:,} requests to {self.model}: {self.input_tokens:,} input tokens ({self.method}) "
            f"+ {self.output_tokens:,} output tokens ({self.output_basis})"
        )
        if not self.priced:
            return f"{tokens}; no price known for {self.model}"
        cache = f"; {self.cache_note()}" if self.cache_note() else ""
        return f"{tokens} = {usd(self.batch_usd)} batch, {usd(self.realtime_usd)} real-time{cache}"


COST_BASES = ("upper_bound", "expected")
_BASIS_LABELS = {"upper_bound": "upper bound", "expected": "expected"}


@dataclass(frozen=True)
class JobEstimate:
    """A job's cost before it runs: the upper bound and the expectation (they differ in output tokens only)."""

    upper_bound: CostEstimate
    expected: CostEstimate

    def on(self, basis: str) -> CostEstimate:
        """Return the estimate ``basis`` names (``"upper_bound"`` or ``"expected"``)."""
        return self.upper_bound if check_cost_basis(basis) == "upper_bound" else self.expected

    @property
    def input_tokens(self) -> int:
        """Return the input tokens counted (the same for both figures)."""
        return self.upper_bound.input_tokens

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict (for error details and summaries)."""
        return {"upper_bound": self.upper_bound.to_dict(), "expected": self.expected.to_dict()}

    def describe(self) -> str:
        """Return one line: requests and input tokens, then the expected and upper-bound figures."""
        low, high = self.expected, self.upper_bound
        head = f"{high.requests:,} requests to {high.model}: {high.input_tokens:,} input tokens ({high.method})"
        if not high.priced:
            return f"{head}; no price known for {high.model}"

        def part(label: str, est: CostEstimate) -> str:
            return (
                f"{label} {usd(est.batch_usd)} batch / {usd(est.realtime_usd)} real-time with "
                f"{est.output_tokens:,} output tokens ({est.output_basis})"
            )

        cache = f"; {low.cache_note()}" if low.cache_note() else ""
        return f"{head}; {part('expected', low)}; {part('upper bound', high)}{cache}"


def check_cost_basis(basis: Any) -> str:
    """Return ``basis`` when it names a cost figure the guard can compare, else raise InvalidInputError."""
    if basis not in COST_BASES:
        raise InvalidInputError(
            f"max_cost_basis must be one of {', '.join(map(repr, COST_BASES))}, got {basis!r}: 'upper_bound' "
            "prices every answer at max_tokens (the job cannot cost more), 'expected' at its expected length."
        )
    return str(basis)


def price_usage(
    model: str,
    input_tokens: int,
    output_tokens: int,
    *,
    requests: int = 0,
    pricing: PricingArg = None,
    require_price: bool = True,
    method: str = "actual usage",
    output_basis: str = "actual usage",
    cached: int = 0,
    written: int = 0,
    cache_basis: str = "actual usage",
) -> CostEstimate:
    """Return the batch and real-time cost of the given token counts for ``model``.

    ``cached`` and ``written``: the part of ``input_tokens`` read from and written to the prompt cache.
    """
    table = load_pricing(pricing)
    price = table.lookup(model) if require_price else table.get(model)
    cache = {"cached": cached, "written": written}
    return CostEstimate(
        model=model,
        requests=requests,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        batch_usd=None if price is None else price.cost(input_tokens, output_tokens, batch=True, **cache),
        realtime_usd=None if price is None else price.cost(input_tokens, output_tokens, batch=False, **cache),
        provider="" if price is None else price.provider,
        method=method,
        output_basis=output_basis,
        cached_input_tokens=cached,
        cache_write_tokens=written,
        uncached_batch_usd=None if price is None else price.cost(input_tokens, output_tokens, batch=True),
        cache_basis=cache_basis if cached or written else "",
    )


def _priced(tally: TokenTally, model: str, pricing: PricingTable, require_price: bool) -> JobEstimate:
    cached, written, basis = assumed_split(tally.cacheable_tokens)

    def priced(output_tokens: int, output_basis: str) -> CostEstimate:
        return price_usage(
            model,
            tally.input_tokens,
            output_tokens,
            requests=tally.requests,
            pricing=pricing,
            require_price=require_price,
            method=tally.method,
            output_basis=output_basis,
            cached=cached,
            written=written,
            cache_basis=basis,
        )

    return JobEstimate(
        upper_bound=priced(tally.output_tokens, tally.output_basis),
        expected=priced(tally.expected_output_tokens, tally.expected_basis),
    )


def estimate_cost(
    texts_or_requests: Iterable[str | bytes | Mapping[str, Any]],
    model: str,
    *,
    provider: str | None = None,
    expected_output_tokens: int | None = None,
    pricing: PricingArg = None,
    require_price: bool = False,
    exact: bool | None = None,
) -> JobEstimate:
    """Count the tokens of plain texts or requests (dicts or JSONL lines) and price them both ways."""
    tally = count_request_tokens(
        texts_or_requests, model, provider=provider, expected_output_tokens=expected_output_tokens, exact=exact
    )
    return _priced(tally, model, load_pricing(pricing), require_price)


def estimate_chunks_cost(
    chunks: Sequence[Mapping[str, Any]],
    *,
    expected_output_tokens: int | None = None,
    pricing: PricingArg = None,
    require_price: bool = False,
    exact: bool | None = None,
) -> JobEstimate:
    """Price the requests files of chunk descriptors both ways (one file in memory at a time).

    ``chunks`` are ChunkDescriptor dicts (or anything downstream of them): their
    ``requests_path``, ``model`` and ``provider`` keys are read.
    """
    if not chunks:
        raise InvalidInputError("There are no chunks to estimate the cost of.")
    table = load_pricing(pricing)
    tallies: dict[str, TokenTally] = {}
    counters: dict[str, TokenCounter] = {}
    for chunk in chunks:
        model = chunk["model"]
        counter = counters.get(model) or counters.setdefault(model, TokenCounter(model, chunk["provider"], exact=exact))
        with storage.to_path(chunk["requests_path"]).open("rb") as handle:
            lines = (line for line in handle if line.strip())
            tally = count_request_tokens(lines, model, expected_output_tokens=expected_output_tokens, counter=counter)
        tallies[model] = tallies[model] + tally if model in tallies else tally
    return combine_estimates([_priced(tally, model, table, require_price) for model, tally in tallies.items()])


def combine_estimates(estimates: Sequence[JobEstimate]) -> JobEstimate:
    """Add job estimates (e.g. per chunk, or per model) up into one."""
    return JobEstimate(
        upper_bound=combine_costs([e.upper_bound for e in estimates]),
        expected=combine_costs([e.expected for e in estimates]),
    )


def combine_costs(estimates: Sequence[CostEstimate]) -> CostEstimate:
    """Add estimates of several models up into one (USD is None if any part is unpriced)."""
    if not estimates:
        raise InvalidInputError("There are no cost estimates to combine.")
    if len(estimates) == 1:
        return estimates[0]
    priced = all(e.priced for e in estimates)

    def joined(values: Iterable[str]) -> str:
        return "; ".join(dict.fromkeys(v for v in values if v))

    return CostEstimate(
        model=", ".join(dict.fromkeys(e.model for e in estimates)),
        requests=sum(e.requests for e in estimates),
        input_tokens=sum(e.input_tokens for e in estimates),
        output_tokens=sum(e.output_tokens for e in estimates),
        batch_usd=sum(e.batch_usd or 0.0 for e in estimates) if priced else None,
        realtime_usd=sum(e.realtime_usd or 0.0 for e in estimates) if priced else None,
        provider=", ".join(dict.fromkeys(e.provider for e in estimates if e.provider)),
        method=joined(e.method for e in estimates),
        output_basis=joined(e.output_basis for e in estimates),
        cached_input_tokens=sum(e.cached_input_tokens for e in estimates),
        cache_write_tokens=sum(e.cache_write_tokens for e in estimates),
        uncached_batch_usd=sum(e.uncached_batch_usd or 0.0 for e in estimates) if priced else None,
        cache_basis=joined(e.cache_basis for e in estimates),
    )


class UsageTally:
    """Add up the usage a provider reported, per model, and price it."""

    def __init__(self) -> None:
        self._usage: dict[str, list[int]] = {}

    def add(
        self, model: str, input_tokens: int, output_tokens: int, requests: int = 0, cached: int = 0, written: int = 0
    ) -> None:
        """Add one chunk's (or one result's) usage; ``cached``, ``written``: of the input, the cache's share."""
        totals = self._usage.setdefault(model, [0, 0, 0, 0, 0])
        for at, value in enumerate((input_tokens, output_tokens, requests, cached, written)):
            totals[at] += value

    def cost(self, pricing: PricingArg = None, *, require_price: bool = False) -> CostEstimate:
        """Return the actual cost of everything added (raises if nothing was)."""
        table = load_pricing(pricing)
        return combine_costs(
            [
                price_usage(
                    model, inp, out, requests=req, pricing=table, require_price=require_price, cached=hit, written=put
                )
                for model, (inp, out, req, hit, put) in self._usage.items()
            ]
        )


def parse_max_cost_usd(value: Any) -> float | None:
    """Return ``max_cost_usd`` as a positive float (numbers or numeric strings, e.g. a rendered Param)."""
    if value is None or value == "":
        return None
    try:
        limit = float(value)
    except (TypeError, ValueError):
        limit = math.nan
    if isinstance(value, bool) or not math.isfinite(limit) or limit <= 0:
        raise InvalidInputError(f"max_cost_usd must be a positive number of US dollars, got {value!r}.")
    return limit


def check_budget(estimate: JobEstimate, max_cost_usd: Any, basis: str = "upper_bound") -> None:
    """Raise CostLimitExceededError when the ``basis`` figure of ``estimate`` exceeds ``max_cost_usd`` (None: no limit).

    ``basis``: ``"upper_bound"`` (default: the job cannot cost more, input counting aside) or
    ``"expected"`` (what the job should cost; e.g. a limit set from last night's bill).
    """
    limit = parse_max_cost_usd(max_cost_usd)
    chosen = estimate.on(basis)
    if limit is None:
        return
    if chosen.batch_usd is None:
        raise InvalidInputError(
            f"max_cost_usd={limit:g} is set but no price is known for {chosen.model}, so the job cannot be "
            "checked against it. Add the model to the pricing table (a pricing file or dict), or drop "
            "max_cost_usd. Nothing was uploaded."
        )
    if chosen.batch_usd <= limit:
        return
    label = _BASIS_LABELS[basis]
    other = ""
    expected_usd = estimate.expected.batch_usd
    if basis == "upper_bound" and expected_usd is not None and expected_usd <= limit:
        other = f"; or guard on the expected cost ({usd(expected_usd)}) instead: max_cost_basis='expected'"
    raise CostLimitExceededError(
        f"Batch cost {usd(chosen.batch_usd)} ({label}) exceeds max_cost_usd={usd(limit)}: "
        f"{estimate.describe()}. Nothing was uploaded. To go ahead, raise max_cost_usd to at least "
        f"{usd(chosen.batch_usd)}{other}; or make the job cheaper: fewer rows, a shorter prompt, a lower "
        "max_tokens or expected_output_tokens, or a cheaper model.",
        estimate_usd=chosen.batch_usd,
        limit_usd=limit,
        estimate=estimate.to_dict(),
    )


__all__ = [
    "COST_BASES",
    "CostEstimate",
    "JobEstimate",
    "UsageTally",
    "check_budget",
    "check_cost_basis",
    "combine_costs",
    "combine_estimates",
    "estimate_chunks_cost",
    "estimate_cost",
    "parse_max_cost_usd",
    "price_usage",
    "usd",
]
