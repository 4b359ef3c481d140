"""The ``anthropic_batch`` connection type as Airflow's providers manager lists it (plain data)."""

from __future__ import annotations

from typing import Any

CONNECTION_INFO: dict[str, Any] = {
    "hook-class-name": "airflow_batch_provider.backends.anthropic.hook.AnthropicBatchHook",
    "hook-name": "Anthropic Message Batches",
    "connection-type": "anthropic_batch",
    "ui-field-behaviour": {
        "hidden-fields": ["schema", "port", "login"],
        "relabeling": {"password": "API Key", "host": "Base URL"},
        "placeholders": {"host": "https://api.anthropic.com"},
    },
    "conn-fields": {
        "base_url": {
            "label": "Base URL",
            "schema": {"type": ["string", "null"]},
            "description": "API base URL without /v1 (e.g. http://127.0.0.1:8089 for the emulator). "
            "Empty means https://api.anthropic.com. The Host field is used when this is empty.",
        },
    },
}
