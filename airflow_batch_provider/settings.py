"""The provider's settings: the ``[llm_batch]`` section of Airflow's configuration, read in one place.

Airflow learns the section from ``get_provider_info()["config"]`` (:data:`PROVIDER_CONFIG`), so
``airflow config list`` shows it with its defaults and descriptions. Each option is set like any
Airflow option: in ``airflow.cfg`` under ``[llm_batch]``, or as ``AIRFLOW__LLM_BATCH__<OPTION>``
(e.g. ``AIRFLOW__LLM_BATCH__WORK_DIR``) on the workers, the triggerer and the api-server alike.

Whether the batch sensor defers follows Airflow's own ``[operators] default_deferrable``, as every
deferrable operator does; a task's ``deferrable=`` argument overrides it.

``get_provider_info`` imports this module while Airflow's configuration is still loading, so
Airflow is imported only inside the functions that read a value.
"""

from __future__ import annotations

import os
from typing import Any

SECTION = "llm_batch"


def _option(description: str, default: str, example: str | None = None) -> dict[str, Any]:
    return {"description": description, "version_added": None, "type": "string", "example": example, "default": default}


#: The ``[llm_batch]`` section as Airflow's provider configuration schema describes one.
PROVIDER_CONFIG: dict[str, Any] = {
    SECTION: {
        "description": "Settings of airflow-batch-provider (LLM batch inference): where job folders, run "
        "reports, price overrides and tokenizer files live, and how self-hosted vLLM engines are built.\n",
        "options": {
            "work_dir": _option(
                "Root of the ChunkOperator's job folders when a task names no job_dir (chunks, results, "
                "checkpoints). Workers on several hosts need a shared disk or an object store URL.\n",
                "{AIRFLOW_HOME}/batch_jobs",
                "s3://my-bucket/batch_jobs",
            ),
            "report_dir": _option(
                "Root of the published run reports the 'LLM batches' view serves; set it on the workers and "
                "the api-server alike. Empty: <work_dir>/reports.\n",
                "",
                "s3://my-bucket/batch_reports",
            ),
            "pricing_file": _option(
                "JSON or YAML file of price overrides, read by every cost estimate on top of the built-in "
                "table (see docs/cost.md). Empty: the built-in prices only.\n",
                "",
                "/opt/airflow/prices.yaml",
            ),
            "tiktoken_dir": _option(
                "Folder holding tiktoken BPE files (o200k_base.tiktoken, ...) for exact OpenAI token counts "
                "on workers without internet. Empty: tiktoken's cache and the bpe-openai wheel only.\n",
                "",
                "/opt/airflow/tiktoken",
            ),
            "vllm_engine_factory": _option(
                "Dotted path of a function that builds the vLLM engine VLLMGenerateOperator uses on this "
                "worker, called with the operator's engine arguments. Empty: vllm.LLM.\n",
                "",
                "my_package.engines.create_engine",
            ),
        },
    }
}


def env_var(option: str) -> str:
    """Return the environment variable that sets ``option`` (``AIRFLOW__LLM_BATCH__<OPTION>``)."""
    return f"AIRFLOW__{SECTION.upper()}__{option.upper()}"


def describe(option: str) -> str:
    """Return how a message names ``option`` to a user: ``[llm_batch] work_dir (AIRFLOW__LLM_BATCH__WORK_DIR)``."""
    return f"[{SECTION}] {option} ({env_var(option)})"


def _get(option: str) -> str:
    from airflow.configuration import conf

    return conf.get(SECTION, option, fallback="") or ""


def work_dir() -> str:
    """Return ``[llm_batch] work_dir`` (default, and when set empty: ``$AIRFLOW_HOME/batch_jobs``)."""
    from airflow.configuration import AIRFLOW_HOME

    return _get("work_dir") or os.path.join(AIRFLOW_HOME, "batch_jobs")


def report_dir() -> str:
    """Return ``[llm_batch] report_dir``, else ``<work_dir>/reports``."""
    return _get("report_dir") or os.path.join(work_dir(), "reports")


def pricing_file() -> str:
    """Return ``[llm_batch] pricing_file`` ("" when unset)."""
    return _get("pricing_file")


def tiktoken_dir() -> str:
    """Return ``[llm_batch] tiktoken_dir`` ("" when unset)."""
    return _get("tiktoken_dir")


def vllm_engine_factory() -> str:
    """Return ``[llm_batch] vllm_engine_factory`` ("" when unset)."""
    return _get("vllm_engine_factory")


def default_deferrable() -> bool:
    """Return Airflow's ``[operators] default_deferrable``: whether a sensor that is not told defers."""
    from airflow.configuration import conf

    return conf.getboolean("operators", "default_deferrable", fallback=False)
