"""The provider's operators; ``llm_batch_job`` builds a whole job from the four batch ones.

``from airflow_batch_provider.operators import llm_batch_job`` (or any of the four operators).
The names load on first use, so importing one operator module does not import the others.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "llm_batch_job": "airflow_batch_provider.operators.batch_job",
    "LLMBatchJob": "airflow_batch_provider.operators.batch_job",
    "ChunkOperator": "airflow_batch_provider.operators.chunk",
    "SubmitBatchOperator": "airflow_batch_provider.operators.submit",
    "BatchCompleteSensor": "airflow_batch_provider.sensors.batch",
    "MergeResultsOperator": "airflow_batch_provider.operators.merge",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
