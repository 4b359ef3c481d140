"""The ``gemini`` connection type: what Airflow's connection form shows for a Gemini API key."""

from __future__ import annotations

from typing import Any

CONN_FIELDS: dict[str, Any] = {
    "base_url": {
        "label": "Base URL",
        "schema": {"type": ["string", "null"]},
        "description": "API base URL without /v1beta (e.g. http://127.0.0.1:8089 for the emulator). "
        "Empty means https://generativelanguage.googleapis.com. The Host field is used when this is empty.",
    },
}

CONNECTION_TYPE: dict[str, Any] = {
    "hook-class-name": "airflow_batch_provider.backends.gemini.hook.GeminiBatchHook",
    "hook-name": "Google Gemini Batch API",
    "connection-type": "gemini",
    "ui-field-behaviour": {
        "hidden-fields": ["schema", "port", "login"],
        "relabeling": {"password": "API Key", "host": "Base URL"},
        "placeholders": {"host": "https://generativelanguage.googleapis.com"},
    },
    "conn-fields": CONN_FIELDS,
}
