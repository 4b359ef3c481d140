"""Provider name → hook: the batch backends' hooks, and the local-results hooks of self-hosted runs.

Chunk descriptors name their provider (``"openai"``, ``"anthropic"``, ...); operators, the sensor
and the trigger turn that name into a hook here. Batch backends are found through the
``airflow_batch_provider.backends`` entry-point group
(:mod:`airflow_batch_provider.backends.registry`); the self-hosted runs (vLLM in the worker, an
OpenAI-compatible server) write their results as local files and have a hook but no backend, so
they are listed here. Either way a hook's module is imported only when its provider is used, and
a backend whose SDK is not installed fails here with AirflowOptionalProviderFeatureException
naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import Any

from airflow_batch_provider.backends.registry import backend_names, get_backend, require_sdk
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.hooks.base import BatchHook

#: Self-hosted runs' provider name → ``"module:Class"`` of the hook that reads their local results.
LOCAL_RESULTS_HOOKS: dict[str, str] = {
    "vllm": "airflow_batch_provider.hooks.local_results:VLLMResultsHook",
    "server": "airflow_batch_provider.hooks.local_results:ServerResultsHook",
}


def provider_names() -> list[str]:
    """Return every provider name a chunk descriptor may carry, sorted."""
    return sorted({*backend_names(), *LOCAL_RESULTS_HOOKS})


def hook_class_for(provider: str) -> type[BatchHook]:
    """Return the hook class that serves ``provider``, importing its module now."""
    target = LOCAL_RESULTS_HOOKS.get(provider) if isinstance(provider, str) else None
    if target is None:
        if provider not in backend_names():
            raise InvalidInputError(
                f"Unknown provider {provider!r}; choose one of {provider_names()} "
                "(docs/contributing.md, 'Adding a backend', says how to add one)."
            )
        return require_sdk(get_backend(provider)).hook_class()
    module_name, _, class_name = target.partition(":")
    hook_class = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(hook_class, type) and issubclass(hook_class, BatchHook)):
        raise TypeError(f"LOCAL_RESULTS_HOOKS[{provider!r}] = {target!r} is not a BatchHook subclass")
    return hook_class


def get_batch_hook(provider: str, conn_id: str | None = None, **kwargs: Any) -> BatchHook:
    """Build the hook for ``provider`` on ``conn_id`` (the hook's default connection when None)."""
    return hook_class_for(provider)(conn_id=conn_id, **kwargs)
