"""The ``azure_openai_batch`` connection type as Airflow's providers manager lists it (plain data)."""

from __future__ import annotations

from typing import Any

#: The GA data-plane version with the Batch API; a connection's ``api_version`` extra overrides it.
DEFAULT_API_VERSION = "2024-10-21"

_FIELDS: dict[str, Any] = {
    "api_version": {
        "label": "API version",
        "schema": {"type": ["string", "null"]},
        "description": f"The api-version query every request carries (empty: {DEFAULT_API_VERSION}). "
        "Newer models in global batch may need a newer version.",
    },
}

CONNECTION_INFO: dict[str, Any] = {
    "hook-class-name": "airflow_batch_provider.backends.azure.hook.AzureOpenAIBatchHook",
    "hook-name": "Azure OpenAI Batch",
    "connection-type": "azure_openai_batch",
    "ui-field-behaviour": {
        "hidden-fields": ["schema", "port", "login"],
        "relabeling": {"password": "API Key (empty: Microsoft Entra ID)", "host": "Endpoint"},
        "placeholders": {"host": "https://<resource>.openai.azure.com"},
    },
    "conn-fields": _FIELDS,
}
