"""The batch backends by provider name: one line per backend, each hook module imported only when used.

Chunk descriptors name their provider (``"openai"``, ``"anthropic"``, ...); operators, the sensor
and the trigger turn that name into a hook here. The table holds import paths, not classes, so
that choosing one backend never imports another's SDK, and so that the hook modules import
nothing from here (the base class knows no backend).
"""

from __future__ import annotations

import importlib
from typing import Any

from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.hooks.base import BatchHook

#: provider name → ``"module:Class"`` of its :class:`~airflow_batch_provider.hooks.base.BatchHook`.
BACKENDS: dict[str, str] = {
    "openai": "airflow_batch_provider.hooks.openai_batch:OpenAIBatchHook",
    "anthropic": "airflow_batch_provider.hooks.anthropic_batch:AnthropicBatchHook",
    "bedrock": "airflow_batch_provider.hooks.bedrock_batch:BedrockBatchHook",
    "gemini": "airflow_batch_provider.backends.gemini.hook:GeminiBatchHook",
    # Self-hosted: the operator writes results as local files in the OpenAI output format.
    "vllm": "airflow_batch_provider.hooks.local_results:VLLMResultsHook",
    "server": "airflow_batch_provider.hooks.local_results:ServerResultsHook",
}


def hook_class_for(provider: str) -> type[BatchHook]:
    """Return the hook class that serves ``provider``, importing its module now."""
    try:
        target = BACKENDS[provider]
    except KeyError:
        raise InvalidInputError(
            f"Unknown provider {provider!r}; choose one of {sorted(BACKENDS)} "
            "(see the README's 'Adding a backend' to add one)."
        ) from None
    module_name, _, class_name = target.partition(":")
    hook_class = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(hook_class, type) and issubclass(hook_class, BatchHook)):
        raise TypeError(f"BACKENDS[{provider!r}] = {target!r} is not a BatchHook subclass")
    return hook_class


def get_batch_hook(provider: str, conn_id: str | None = None, **kwargs: Any) -> BatchHook:
    """Build the hook for ``provider`` on ``conn_id`` (the hook's default connection when None)."""
    return hook_class_for(provider)(conn_id=conn_id, **kwargs)
