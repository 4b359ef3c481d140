"""Apache Airflow provider for LLM batch inference (OpenAI, Anthropic, self-hosted vLLM)."""

from __future__ import annotations

__version__ = "0.1.0"
