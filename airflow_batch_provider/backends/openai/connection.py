"""The ``openai_batch`` connection type as Airflow's providers manager lists it (plain data)."""

from __future__ import annotations

from typing import Any

_FIELDS: dict[str, Any] = {
    "organization": {
        "label": "Organization",
        "schema": {"type": ["string", "null"]},
        "description": "Optional OpenAI organization id.",
    },
    "project": {
        "label": "Project",
        "schema": {"type": ["string", "null"]},
        "description": "Optional OpenAI project id.",
    },
    "base_url": {
        "label": "Base URL",
        "schema": {"type": ["string", "null"]},
        "description": "API base URL ending in /v1 (e.g. http://127.0.0.1:8089/v1 for the emulator). "
        "Empty means https://api.openai.com/v1. The Host field is used when this is empty.",
    },
}

CONNECTION_INFO: dict[str, Any] = {
    "hook-class-name": "airflow_batch_provider.backends.openai.hook.OpenAIBatchHook",
    "hook-name": "OpenAI Batch",
    "connection-type": "openai_batch",
    "ui-field-behaviour": {
        "hidden-fields": ["schema", "port", "login"],
        "relabeling": {"password": "API Key", "host": "Base URL"},
        "placeholders": {"host": "https://api.openai.com/v1"},
    },
    "conn-fields": _FIELDS,
}
