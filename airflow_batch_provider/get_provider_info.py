"""Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``).

Airflow calls it while its own configuration is still loading, so the module imports nothing
but the version and the ``[llm_batch]`` section's description (neither imports Airflow); the
function loads the backends' import-light modules (:mod:`airflow_batch_provider.backends`), which
bring their own hook modules and connection types — an installed third-party backend included.
"""

from __future__ import annotations

from typing import Any

from airflow_batch_provider import __version__
from airflow_batch_provider.settings import PROVIDER_CONFIG

_OPENAI_COMPATIBLE_FIELDS: dict[str, Any] = {
    "base_url": {
        "label": "Base URL",
        "schema": {"type": ["string", "null"]},
        "description": "Server base URL, e.g. http://vllm-server:8000/v1 (vllm serve, TGI, llama.cpp server). "
        "The Host field (and Port) is used when this is empty; a URL without a path gets /v1.",
    },
    "timeout": {
        "label": "Request timeout (s)",
        "schema": {"type": ["number", "null"], "minimum": 1},
        "description": "Seconds to wait for one response (default 600).",
    },
    "headers": {
        "label": "Extra headers",
        "schema": {"type": ["string", "null"]},
        "description": 'Extra HTTP headers sent with every request, as a JSON object (e.g. {"X-Team": "ml"}); '
        "their values are masked in logs.",
    },
}

#: The self-hosted servers' connection type (ServerGenerateOperator, streaming intake): the openai SDK.
_OPENAI_COMPATIBLE_CONNECTION: dict[str, Any] = {
    "hook-class-name": "airflow_batch_provider.hooks.openai_compatible.OpenAICompatibleHook",
    "hook-name": "OpenAI-compatible server",
    "connection-type": "openai_compatible",
    "ui-field-behaviour": {
        "hidden-fields": ["schema", "login"],
        "relabeling": {"password": "API Key (optional)", "host": "Base URL"},
        "placeholders": {"host": "http://vllm-server:8000/v1", "password": "vllm serve --api-key value"},
    },
    "conn-fields": _OPENAI_COMPATIBLE_FIELDS,
}


def get_provider_info() -> dict[str, Any]:
    """Return the provider description Airflow registers (hooks, triggers, connection types)."""
    # Imported here, not above: the backends import the package's exceptions, which import
    # Airflow, which may be loading its providers (this function) at that very moment.
    from airflow_batch_provider.backends.registry import all_backends, module_available, sdk_installed

    # Hooks and connection types only where their SDK extra is installed: Airflow imports every hook it
    # is told of and warns for each that fails. A job naming such a backend still fails with the extra
    # to install (backends/registry.py: require_sdk).
    backends = [backend for backend in all_backends() if sdk_installed(backend)]
    servers = [_OPENAI_COMPATIBLE_CONNECTION] if module_available("openai") else []
    return {
        "package-name": "airflow-batch-provider",
        "name": "LLM Batch Inference",
        "description": "Batch LLM inference through provider batch APIs "
        f"({', '.join(backend.title for backend in all_backends())}) and self-hosted vLLM.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "LLM Batch Inference",
                "external-doc-url": "https://platform.openai.com/docs/guides/batch",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "LLM Batch Inference",
                "python-modules": [
                    "airflow_batch_provider.hooks.base",
                    *(backend.hook_class_path.partition(":")[0] for backend in backends),
                    *(connection["hook-class-name"].rpartition(".")[0] for connection in servers),
                    "airflow_batch_provider.hooks.local_results",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "LLM Batch Inference",
                "python-modules": [
                    "airflow_batch_provider.operators.chunk",
                    "airflow_batch_provider.operators.submit",
                    "airflow_batch_provider.operators.merge",
                    "airflow_batch_provider.operators.vllm",
                    "airflow_batch_provider.operators.server",
                    "airflow_batch_provider.operators.intake",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "LLM Batch Inference",
                "python-modules": ["airflow_batch_provider.sensors.batch", "airflow_batch_provider.sensors.intake"],
            }
        ],
        "triggers": [
            {
                "integration-name": "LLM Batch Inference",
                "python-modules": ["airflow_batch_provider.triggers.batch", "airflow_batch_provider.triggers.intake"],
            }
        ],
        # The [llm_batch] section `airflow config list` shows (airflow_batch_provider.settings).
        "config": PROVIDER_CONFIG,
        "extra-links": ["airflow_batch_provider.links.BatchConsoleLink", "airflow_batch_provider.links.RunReportLink"],
        "connection-types": [
            *(backend.connection_info() for backend in backends),
            *servers,
        ],
    }
