"""Gemini list prices (USD per 1M tokens, paid tier, text, prompts up to 200K tokens), as plain data.

Batch mode costs 50% of these (:attr:`GeminiBackend.batch_discount
<airflow_batch_provider.backends.gemini.GeminiBackend>`); models not listed here need a pricing
file.
"""

from __future__ import annotations

PRICES_SOURCE = "Gemini Developer API pricing page (ai.google.dev/gemini-api/docs/pricing)"

#: model: (input USD / 1M tokens, output USD / 1M tokens), real-time list prices.
GEMINI_PRICES: dict[str, tuple[float, float]] = {
    "gemini-2.5-pro": (1.25, 10.00),  # prompts over 200K tokens cost twice as much
    "gemini-2.5-flash": (0.30, 2.50),
    "gemini-2.5-flash-lite": (0.10, 0.40),
    "gemini-2.0-flash": (0.10, 0.40),
    "gemini-2.0-flash-lite": (0.075, 0.30),
}
