"""Nightly product classification: a table of products → provider batch API → merged parquet.

table ─► chunk (JSONL files, 10,000 requests each) ─► submit (one mapped task per chunk)
      ─► wait (deferred: no worker held while the provider works) ─► merge (parquet dataset)

One ``llm_batch_job`` call builds those four tasks (docs/reference.md lists every argument).

Each answer is structured output — ``{"label": <one of LABELS>, "confidence": 0..1}`` — validated
at merge time and written as the ``label`` and ``confidence`` columns. The same DAG runs on the
OpenAI Batch API, Anthropic Message Batches, Amazon Bedrock, Gemini or any other installed backend:
set the ``provider`` Param; the chunk files, checkpoints and merged schema stay the same.

Run it offline against the bundled emulator with ``make demo`` (``make demo BACKEND=anthropic``,
``make demo BACKEND=bedrock``), or against the real APIs by pointing the ``openai_batch_default`` /
``anthropic_batch_default`` / ``bedrock_batch_default`` connection at them (docs/backends.md).
Unpausing starts a scheduled run of the default 100 rows at once (``catchup=False``: the latest
day), then one a day; larger jobs run only when triggered with a larger ``rows``. Every Param can be overridden with
``airflow dags test nightly_product_classification -c '{"rows": 5000, "provider": "anthropic"}'``.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, Param, task

from airflow_batch_provider.backends.registry import all_backends
from airflow_batch_provider.operators import llm_batch_job

# One folder per run and task under the job_dir Param; empty: ChunkOperator's default under [llm_batch] work_dir.
JOB_DIR = "{{ params.job_dir and (params.job_dir ~ '/' ~ dag.dag_id ~ '/' ~ run_id ~ '/chunk') }}"
LABELS = ["electronics", "clothing", "home", "sports", "toys", "beauty", "books", "grocery"]
# Rows of a run nobody gave a `rows` to: the scheduled ones, which start as soon as the DAG is unpaused.
SCHEDULED_ROWS = 100
DATA_DIR = os.environ.get("BATCH_DEMO_DATA_DIR", "/tmp/airflow-batch-demo")

OUTPUT_DIR = "{{ params.output_dir or (params.data_dir ~ '/output/' ~ dag.dag_id) }}"

# Downstream DAGs can be scheduled on this: schedule=[CLASSIFIED_PRODUCTS].
CLASSIFIED_PRODUCTS = Asset(name="classified_products", uri="file:///llm-batch/classified_products")


def alert_on_failure(context: dict[str, Any]) -> None:
    """Route batch failures: the typed errors say what ended badly (swap the log for a notifier).

    The task SDK's ``RuntimeTaskInstance`` has no ``log`` attribute: a callback logs through a
    standard logger, which Airflow routes to the task's log.
    """
    from airflow_batch_provider.exceptions import BatchEndedBadlyError, CostLimitExceededError, TooManyFailuresError

    error = context.get("exception")
    ti = context["ti"]
    if isinstance(error, BatchEndedBadlyError):
        kind = f"batch {error.batch_id} ended {error.state.get('provider_status', 'badly')}"
    elif isinstance(error, TooManyFailuresError):
        kind = "too many failed rows"
    elif isinstance(error, CostLimitExceededError):
        kind = "cost guard"
    else:
        kind = type(error).__name__
    logging.getLogger("airflow.task").error(
        "ALERT %s.%s[%s]: %s — %s", ti.dag_id, ti.task_id, ti.map_index, kind, error
    )


# Every installed backend names its default model (Backend.default_model), so one installed from another
# package runs in this DAG unedited; tests/test_dags.py checks that each default has a price.
DEFAULT_MODELS = {backend.name: backend.default_model for backend in all_backends()}

PROMPT = (
    "Classify this product into exactly one category.\n"
    f"Labels: {', '.join(LABELS)}\n"
    "Product: {title}\n"
    "Description: {description}"
)

# Structured output: OpenAI gets it as a json_schema response_format, Anthropic as a forced tool call,
# Gemini as responseMimeType application/json with the schema in responseJsonSchema.
CLASSIFICATION = {
    "title": "classification",
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": LABELS},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["label", "confidence"],
    "additionalProperties": False,
}

with DAG(
    dag_id="nightly_product_classification",
    description="Classify products into a fixed label set with a provider batch API (half of real-time price).",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10), "on_failure_callback": alert_on_failure},
    params={
        # Unpausing starts a scheduled run at once (catchup=False: the latest day) with these defaults,
        # against whatever the connection points at: keep it small, so no large job is ever billed
        # unless someone triggers it with a larger rows.
        "rows": Param(
            SCHEDULED_ROWS,
            type="integer",
            minimum=1,
            description=f"Synthetic products to generate. Scheduled runs use the default ({SCHEDULED_ROWS}).",
        ),
        "provider": Param(
            "openai",
            type="string",
            examples=sorted(DEFAULT_MODELS),  # proposed in the trigger form; any installed backend's name runs
            description=f"Batch API to use: an installed backend ({', '.join(sorted(DEFAULT_MODELS))}).",
        ),
        "model": Param(
            "",
            type="string",
            description="Empty: the backend's default model ("
            + ", ".join(f"{name}: {model}" for name, model in sorted(DEFAULT_MODELS.items()))
            + ").",
        ),
        "data_dir": Param(DATA_DIR, type="string", description="Where the input table is written."),
        "output_dir": Param("", type="string", description="Output dataset folder; empty: under data_dir."),
        "job_dir": Param(
            "",
            type="string",
            description="Root of the job folders; empty: [llm_batch] work_dir. Workers on several hosts: s3://….",
        ),
        "conn_id": Param("", type="string", description="Empty: the provider hook's default connection."),
        "max_cost_usd": Param(
            None, type=["null", "number"], description="Fail before uploading if the estimated cost exceeds this."
        ),
        "max_failure_ratio": Param(
            0.05,
            type=["null", "number"],
            minimum=0,
            maximum=1,
            description="Fail the merge when more than this share of a chunk's rows did not succeed; null: never.",
        ),
        "poll_interval": Param(30, type="number", minimum=0.1, description="Seconds between status polls."),
        "chunk_size": Param(
            10_000,
            type="integer",
            minimum=1,
            maximum=100_000,
            description="Requests per batch (OpenAI, Bedrock and Gemini: at most 50,000). "
            "Keep chunks ≤ [core] max_map_length (1,024).",
        ),
    },
    user_defined_macros={"default_models": DEFAULT_MODELS},
    tags=["llm-batch", "example"],
) as dag:

    @task
    def make_products(rows: int, data_dir: str) -> str:
        """Write a deterministic synthetic product table (skipped when it already exists)."""
        try:  # the demo's data ships with the emulator distribution, not with the provider
            from airflow_batch_emulator.examples import write_synthetic_products
        except ImportError as exc:
            raise RuntimeError(
                "The synthetic product table comes with airflow-batch-emulator (`pip install ./emulator` in "
                "the provider's repository); to run this DAG on your data, make this task return your table's path."
            ) from exc

        return write_synthetic_products(int(rows), data_dir)

    products = make_products("{{ params.rows }}", "{{ params.data_dir }}")

    llm_batch_job(
        "classify",
        prefix_group_id=False,  # task ids stay chunk, submit, wait, merge: earlier runs and alerts name them
        source=products,
        prompt_template=PROMPT,
        system_prompt="You are a careful retail catalogue assistant.",
        provider="{{ params.provider }}",
        model="{{ params.model or default_models.get(params.provider, '') }}",
        id_column="product_id",
        request_params={"max_tokens": 64, "temperature": 0},
        response_schema=CLASSIFICATION,
        chunk_size="{{ params.chunk_size }}",
        max_cost_usd="{{ params.max_cost_usd or '' }}",
        skip_unchanged=True,  # reruns pay only for new or changed rows; the rest keep last night's result
        previous_output=OUTPUT_DIR,
        job_dir=JOB_DIR,
        conn_id="{{ params.conn_id }}",  # submit, wait and merge all take it: each gets it
        poll_interval="{{ params.poll_interval }}",
        output_dir=OUTPUT_DIR,
        max_failure_ratio="{{ params.max_failure_ratio }}",
        outlets=[CLASSIFIED_PRODUCTS],
    )
