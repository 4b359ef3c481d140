"""The anchor for ``make bench-anchor``: the example DAG's job done with common-ai's ``LLMBatchOperator``.

Runs only in the anchor's own virtualenv (``apache-airflow-providers-common-ai[openai]``), never in
the project's: it imports nothing from ``airflow_batch_provider``. It does what the project's
``nightly_product_classification`` does: the same prompt, system prompt, model, ``max_tokens``,
temperature and structured output (label from the same eight, confidence 0..1) over the same
parquet table, then the join back onto the source rows that ``LLMBatchOperator`` leaves to its
users (it lands JSONL rows keyed by request ``index``), written as one parquet file.

``LLMBatchOperator`` refuses a ``poll_interval`` under 30 s; the benchmark polls both DAGs every
second on an emulator whose batches finish in seconds, so that floor is lowered here (module
attribute ``_MIN_POLL_INTERVAL``) — the only change made to the anchor.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Literal

from airflow.providers.common.ai.operators import llm_batch
from airflow.providers.common.ai.operators.llm_batch import LLMBatchOperator
from airflow.sdk import DAG, Param, task
from pydantic import BaseModel, Field

llm_batch._MIN_POLL_INTERVAL = 0  # see the module docstring

LABELS = ["electronics", "clothing", "home", "sports", "toys", "beauty", "books", "grocery"]
PROMPT = (
    "Classify this product into exactly one category.\n"
    f"Labels: {', '.join(LABELS)}\n"
    "Product: {title}\n"
    "Description: {description}"
)


class Classification(BaseModel):
    """The structured output the project's example DAG asks for."""

    label: Literal["electronics", "clothing", "home", "sports", "toys", "beauty", "books", "grocery"]
    confidence: float = Field(ge=0, le=1)


with DAG(
    dag_id="anchor_product_classification",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "table": Param("", type="string"),
        "result_path": Param("", type="string"),
        "output_file": Param("", type="string"),
        "poll_interval": Param(1, type="integer"),
    },
) as dag:

    @task
    def prompts(table: str) -> list[str]:
        """Render one prompt per source row, in the table's order (the request index is the row number)."""
        import pyarrow.parquet as pq

        rows = pq.read_table(table, columns=["title", "description"]).to_pylist()
        return [PROMPT.format(title=r["title"], description=r["description"]) for r in rows]

    classify = LLMBatchOperator(
        task_id="classify",
        requests=prompts("{{ params.table }}"),
        result_path="{{ params.result_path }}",
        llm_conn_id="pydanticai_default",
        model_id="openai:gpt-4o-mini",
        system_prompt="You are a careful retail catalogue assistant.",
        output_type=Classification,
        max_tokens=64,
        request_params={"temperature": 0},
        poll_interval=1,
        deferrable=True,
    )

    @task
    def join(manifest: dict, table: str, output_file: str) -> dict[str, int]:
        """Join the landed results onto the source rows by request index; write one parquet file."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        from airflow.sdk import ObjectStoragePath

        source = pq.read_table(table)
        labels: list[str | None] = [None] * source.num_rows
        confidences: list[float | None] = [None] * source.num_rows
        statuses: list[str] = ["missing"] * source.num_rows
        with ObjectStoragePath(manifest["result_uri"]).open("r") as lines:
            for line in lines:
                if not line.strip():
                    continue
                row = json.loads(line)
                statuses[row["index"]] = row["status"]
                if row["status"] == "success":
                    labels[row["index"]] = row["output"]["label"]
                    confidences[row["index"]] = row["output"]["confidence"]
        joined = source.append_column("label", pa.array(labels, pa.string()))
        joined = joined.append_column("confidence", pa.array(confidences, pa.float64()))
        joined = joined.append_column("status", pa.array(statuses, pa.string()))
        pq.write_table(joined, output_file)
        return {"rows": source.num_rows, "succeeded": sum(s == "success" for s in statuses)}

    join(classify.output, "{{ params.table }}", "{{ params.output_file }}")
