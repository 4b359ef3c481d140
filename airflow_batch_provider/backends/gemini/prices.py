"""Gemini list prices (USD per 1M tokens, paid tier, text, prompts up to 200K tokens), as plain data.

Batch mode costs 50% of these (the provider-wide default batch discount of
:mod:`airflow_batch_provider.cost.pricing`). Source: the Gemini Developer API pricing page
(ai.google.dev/gemini-api/docs/pricing); models not listed here need a pricing file.
"""

from __future__ import annotations

#: model: (provider, input USD / 1M tokens, output USD / 1M tokens), real-time list prices.
GEMINI_PRICES: dict[str, tuple[str, float, float]] = {
    "gemini-2.5-pro": ("gemini", 1.25, 10.00),  # prompts over 200K tokens cost twice as much
    "gemini-2.5-flash": ("gemini", 0.30, 2.50),
    "gemini-2.5-flash-lite": ("gemini", 0.10, 0.40),
    "gemini-2.0-flash": ("gemini", 0.10, 0.40),
    "gemini-2.0-flash-lite": ("gemini", 0.075, 0.30),
}
