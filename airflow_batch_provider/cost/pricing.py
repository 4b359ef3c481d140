"""Model prices (USD per 1M tokens) for cost estimates, with user overrides.

The built-in table is the backends' own price lists (``Backend.prices``: real-time list prices of
common models); batch prices are the list price less the backend's ``batch_discount`` (50% for
OpenAI, Anthropic and Bedrock). Prices change:
:data:`PRICES_AS_OF` says when this table was checked. Override or extend it with

- a JSON or YAML file named by ``[llm_batch] pricing_file``, read on every :func:`load_pricing`;
- a file path or a dict passed to :func:`load_pricing` (for instance from a DAG Param).

Later sources win, per model. The file or dict maps model names to prices::

    {"models": {"my-finetune": {"provider": "openai", "input": 0.30, "output": 1.20}}}

(``{"my-finetune": {...}}`` without the ``models`` level works too). Per model: ``input`` and
``output`` in USD per 1M tokens (required), optional ``batch_discount`` (0 … 1, default 0.5),
or explicit ``batch_input`` / ``batch_output`` prices, and ``provider``.

Lookup is by exact name, then by the longest known name that the model extends with a dated
snapshot suffix (``gpt-4o-mini-2024-07-18``, ``claude-haiku-4-5-20251001``, ``-latest``). Any
other suffix is *not* matched: ``gpt-5.4-pro`` or ``o4-mini-deep-research`` cost several times
their base model, so guessing would be worse than asking. :meth:`PricingTable.lookup` raises
InvalidInputError naming the model and how to add it; :meth:`PricingTable.get` returns None.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from airflow_batch_provider import settings
from airflow_batch_provider.backends.registry import all_backends, backend_for_model, find_backend
from airflow_batch_provider.exceptions import InvalidInputError

DEFAULT_BATCH_DISCOUNT = 0.5
PRICES_AS_OF = "2026-11-30"


def prices_source() -> str:
    """Say where the built-in prices come from (each backend names its own source)."""
    sources = "; ".join(backend.prices_source for backend in all_backends() if backend.prices_source)
    return f"{sources}; standard tier, text tokens, short context; prompt-cache multipliers per provider"


# What may follow a known name: a dated snapshot or an alias, nothing that names another model.
_SNAPSHOT_SUFFIX = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|\d{4}|latest)")


@dataclass(frozen=True)
class ModelPrice:
    """Prices of one model in USD per 1M tokens, real-time and batch."""

    model: str
    provider: str
    input_per_mtok: float
    output_per_mtok: float
    batch_input_per_mtok: float
    batch_output_per_mtok: float
    # Prompt-cache reads and writes as multiples of the input price; the batch discount applies on top.
    cache_read_multiplier: float = 1.0
    cache_write_multiplier: float = 1.0

    def cost(
        self, input_tokens: int, output_tokens: int, *, batch: bool = True, cached: int = 0, written: int = 0
    ) -> float:
        """Return the USD cost of the given token counts, at batch or real-time prices.

        ``cached`` and ``written`` are the part of ``input_tokens`` read from and written to the prompt cache.
        """
        if batch:
            rates = (self.batch_input_per_mtok, self.batch_output_per_mtok)
        else:
            rates = (self.input_per_mtok, self.output_per_mtok)
        uncached = input_tokens - cached - written
        read_and_write = cached * self.cache_read_multiplier + written * self.cache_write_multiplier
        return ((uncached + read_and_write) * rates[0] + output_tokens * rates[1]) / 1_000_000

    def to_dict(self) -> dict[str, Any]:
        """Return the prices in the override-file format."""
        return {
            "provider": self.provider,
            "input": self.input_per_mtok,
            "output": self.output_per_mtok,
            "batch_input": self.batch_input_per_mtok,
            "batch_output": self.batch_output_per_mtok,
            "cache_read_multiplier": self.cache_read_multiplier,
            "cache_write_multiplier": self.cache_write_multiplier,
        }


class PricingTable:
    """Model prices with exact and dated-snapshot lookup; build one with :func:`load_pricing`."""

    def __init__(self, prices: Iterable[ModelPrice], *, sources: Iterable[str] = ()) -> None:
        self._prices = {price.model: price for price in prices}
        self.sources = list(sources)

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.get(model) is not None

    def models(self) -> list[str]:
        """Return the known model names, sorted."""
        return sorted(self._prices)

    def get(self, model: str) -> ModelPrice | None:
        """Return the price of ``model`` (exact name, then dated snapshot of a known name), or None."""
        exact = self._prices.get(model)
        if exact is not None:
            return exact
        best: ModelPrice | None = None
        for name, price in self._prices.items():
            if (
                model.startswith(name)
                and _SNAPSHOT_SUFFIX.fullmatch(model[len(name) :])
                and (best is None or len(name) > len(best.model))
            ):
                best = price
        return best

    def lookup(self, model: str) -> ModelPrice:
        """Return the price of ``model`` or raise InvalidInputError saying how to add it."""
        price = self.get(model)
        if price is None:
            raise InvalidInputError(
                f"No price is known for model {model!r}. Add it with a pricing file named by "
                f"{settings.describe('pricing_file')} or a pricing dict, e.g. "
                f'{{"models": {{"{model}": {{"input": <USD per 1M input tokens>, '
                f'"output": <USD per 1M output tokens>}}}}}}. '
                f"Known models: {', '.join(self.models())}."
            )
        return price

    def extended(self, entries: Mapping[str, Any], *, source: str = "dict") -> PricingTable:
        """Return a new table with ``entries`` (override format) added or replacing models."""
        added = parse_prices(entries, source=source)
        return PricingTable([*self._prices.values(), *added], sources=[*self.sources, source])


def default_pricing() -> PricingTable:
    """Return the built-in table: every backend's list prices less its batch discount (no overrides applied)."""
    return PricingTable(
        (
            _price(model, backend.name, inp, out, backend.batch_discount)
            for backend in all_backends()
            for model, (inp, out) in backend.prices.items()
        ),
        sources=[f"built-in table as of {PRICES_AS_OF}"],
    )


def load_pricing(
    overrides: Mapping[str, Any] | str | os.PathLike[str] | PricingTable | None = None, *, use_settings: bool = True
) -> PricingTable:
    """Return the built-in prices, extended by ``[llm_batch] pricing_file`` and then ``overrides``.

    ``overrides`` is a dict in the override format, a path to a JSON/YAML file, or a ready table
    (returned as is). Raises InvalidInputError for an unreadable file or a malformed entry.
    """
    if isinstance(overrides, PricingTable):
        return overrides
    table = default_pricing()
    configured = settings.pricing_file() if use_settings else ""
    if configured:
        table = table.extended(read_pricing_file(configured), source=f"[llm_batch] pricing_file={configured}")
    if isinstance(overrides, Mapping):
        table = table.extended(overrides)
    elif overrides is not None:
        table = table.extended(read_pricing_file(overrides), source=os.fspath(overrides))
    return table


def read_pricing_file(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    """Read a pricing override file (``.json``, ``.yaml`` or ``.yml``) and return its mapping."""
    file = Path(path).expanduser()
    try:
        raw = file.read_bytes()
    except OSError as err:
        raise InvalidInputError(f"Cannot read the pricing file {file}: {err}") from None
    try:
        if file.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(raw)
        else:
            data = orjson.loads(raw)
    except Exception as err:  # yaml and orjson raise their own error types
        raise InvalidInputError(f"The pricing file {file} is not valid {file.suffix or 'JSON'}: {err}") from None
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"The pricing file {file} must hold a mapping of model names to prices.")
    return data


def parse_prices(entries: Mapping[str, Any], *, source: str = "dict") -> list[ModelPrice]:
    """Validate override entries and return them as ModelPrice objects."""
    if not isinstance(entries, Mapping):
        raise InvalidInputError(f"Pricing from {source} must be a mapping, got {type(entries).__name__}.")
    models = entries.get("models", entries)
    if not isinstance(models, Mapping):
        raise InvalidInputError(f"Pricing from {source} must map model names to prices, got {type(models).__name__}.")
    # A file with a "models" level may set one batch_discount for all of its models.
    default_discount = entries.get("batch_discount", DEFAULT_BATCH_DISCOUNT) if "models" in entries else None
    if default_discount is None:
        default_discount = DEFAULT_BATCH_DISCOUNT
    prices = []
    for model, entry in models.items():
        if not isinstance(model, str) or not model or not isinstance(entry, Mapping):
            raise InvalidInputError(
                f"Pricing from {source}: each entry must be 'model name': {{'input': ..., 'output': ...}}, "
                f"got {model!r}: {entry!r}."
            )
        inp = _number(entry.get("input"), source, model, "input")
        out = _number(entry.get("output"), source, model, "output")
        discount = _number(entry.get("batch_discount", default_discount), source, model, "batch_discount")
        if discount > 1:
            raise InvalidInputError(
                f"Pricing from {source}: batch_discount of {model!r} must be 0 … 1, got {discount}."
            )
        batch_in = entry.get("batch_input")
        batch_out = entry.get("batch_output")
        provider = entry.get("provider") or _guess_provider(model)
        read, write = _cache_multipliers(str(provider))
        prices.append(
            ModelPrice(
                model=model,
                provider=str(provider),
                input_per_mtok=inp,
                output_per_mtok=out,
                batch_input_per_mtok=inp * (1 - discount)
                if batch_in is None
                else _number(batch_in, source, model, "batch_input"),
                batch_output_per_mtok=out * (1 - discount)
                if batch_out is None
                else _number(batch_out, source, model, "batch_output"),
                cache_read_multiplier=_number(entry.get("cache_read_multiplier", read), source, model, "cache_read"),
                cache_write_multiplier=_number(
                    entry.get("cache_write_multiplier", write), source, model, "cache_write"
                ),
            )
        )
    return prices


def _price(model: str, provider: str, inp: float, out: float, discount: float) -> ModelPrice:
    keep = 1 - discount
    return ModelPrice(model, provider, inp, out, inp * keep, out * keep, *_cache_multipliers(provider))


def _cache_multipliers(provider: str) -> tuple[float, float]:
    """Return the provider's prompt-cache (read, write) price multipliers; (1, 1) for one without a cache price."""
    backend = find_backend(provider)
    return backend.cache_price_multipliers if backend is not None else (1.0, 1.0)


def _number(value: Any, source: str, model: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidInputError(
            f"Pricing from {source}: {key!r} of model {model!r} must be a number ≥ 0 "
            f"(USD per 1M tokens for prices), got {value!r}."
        )
    return float(value)


def _guess_provider(model: str) -> str:
    backend = backend_for_model(model)
    return backend.name if backend is not None else "other"
