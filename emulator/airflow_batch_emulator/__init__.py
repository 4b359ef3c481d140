"""A local emulator of the OpenAI Batch and Anthropic Message Batches APIs (stdlib HTTP server).

The real ``openai`` and ``anthropic`` SDKs work against it unchanged. Exports load lazily so
the pytest plugin living in this package stays cheap to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_batch_emulator.config import EmulatorConfig
    from airflow_batch_emulator.faults import Faults
    from airflow_batch_emulator.server import BatchEmulator

__all__ = ["BatchEmulator", "EmulatorConfig", "Faults"]

_HOMES = {
    "BatchEmulator": "airflow_batch_emulator.server",
    "EmulatorConfig": "airflow_batch_emulator.config",
    "Faults": "airflow_batch_emulator.faults",
}


def __getattr__(name: str) -> Any:
    """Import an export on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)
