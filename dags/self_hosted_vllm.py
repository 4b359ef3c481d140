"""Self-hosted product classification: the nightly job on your own GPUs, with vLLM or a model server.

table ─► chunk ─► choose_backend ─┬─► vllm_generate   (mapped, queue "gpu": vllm.LLM on the worker's GPUs)
                                  └─► server_generate (mapped: an OpenAI-compatible server, 64 in flight)
                                        ─► collect ─► merge (parquet dataset, same schema as the batch API job)

The ``mode`` Param picks the branch: ``vllm`` loads the model inside each GPU task (offline,
continuous batching over the whole chunk); ``server`` sends the chunk to a running
``vllm serve`` / TGI / llama.cpp endpoint through the ``openai_compatible_default`` connection.
The branch not taken is skipped; ``collect`` and ``merge`` run after whichever ran.

Offline: ``make demo BACKEND=server`` runs the server branch against the bundled emulator. Nothing
here imports vllm: the DAG loads on workers and schedulers without it.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param, task

from airflow_batch_provider.operators.chunk import ChunkOperator
from airflow_batch_provider.operators.merge import MergeResultsOperator
from airflow_batch_provider.operators.server import ServerGenerateOperator
from airflow_batch_provider.operators.vllm import VLLMGenerateOperator

# One folder per run and task under the job_dir Param; empty: ChunkOperator's default under [llm_batch] work_dir.
JOB_DIR = "{{ params.job_dir and (params.job_dir ~ '/' ~ dag.dag_id ~ '/' ~ run_id ~ '/chunk') }}"
LABELS = ["electronics", "clothing", "home", "sports", "toys", "beauty", "books", "grocery"]
DATA_DIR = os.environ.get("BATCH_DEMO_DATA_DIR", "/tmp/airflow-batch-demo")
BRANCHES = {"vllm": "vllm_generate", "server": "server_generate"}

PROMPT = (
    "Classify this product into exactly one category.\n"
    f"Labels: {', '.join(LABELS)}\n"
    "Product: {title}\n"
    "Description: {description}\n"
    "Answer with the label only."
)

with DAG(
    dag_id="self_hosted_vllm",
    description="Classify products on self-hosted GPUs: vLLM offline on the gpu queue, or an OpenAI-compatible server.",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    params={
        "mode": Param("vllm", type="string", enum=sorted(BRANCHES), description="vllm (offline engine) or server."),
        "rows": Param(50_000, type="integer", minimum=1, description="Synthetic products to generate."),
        "model": Param("Qwen/Qwen2.5-1.5B-Instruct", type="string", description="Model id (HF id or path)."),
        "data_dir": Param(DATA_DIR, type="string", description="Where the input table is written."),
        "output_dir": Param("", type="string", description="Output dataset folder; empty: under data_dir."),
        "job_dir": Param(
            "",
            type="string",
            description="Root of the job folders; empty: [llm_batch] work_dir. Workers on several hosts: s3://….",
        ),
        "conn_id": Param("openai_compatible_default", type="string", description="Server connection (server mode)."),
        "chunk_size": Param(10_000, type="integer", minimum=1, description="Requests per generate task."),
    },
    tags=["llm-batch", "example", "self-hosted"],
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

    chunks = ChunkOperator(
        task_id="chunk",
        source=products,
        prompt_template=PROMPT,
        system_prompt="You are a careful retail catalogue assistant.",
        model="{{ params.model }}",
        id_column="product_id",
        job_dir=JOB_DIR,
        request_params={"max_tokens": 5, "temperature": 0},
        # One model load per vLLM task: fewer, larger chunks amortise it.
        chunk_size="{{ params.chunk_size }}",
        canary_rows=0,  # the requests go to our own server, not to a provider's real-time API
    )

    @task.branch
    def choose_backend(mode: str) -> str:
        """Follow the generate step of the chosen mode; the other one is skipped."""
        if mode not in BRANCHES:
            raise ValueError(f"mode must be one of {sorted(BRANCHES)}, got {mode!r}")
        return BRANCHES[mode]

    branch = choose_backend("{{ params.mode }}")
    chunks >> branch

    vllm_batches = VLLMGenerateOperator.partial(
        task_id="vllm_generate",
        max_num_seqs=256,
        gpu_memory_utilization=0.90,
        tensor_parallel_size=1,
    ).expand(chunk=chunks.output)

    server_batches = ServerGenerateOperator.partial(
        task_id="server_generate",
        conn_id="{{ params.conn_id }}",
        max_concurrency=64,
    ).expand(chunk=chunks.output)

    branch >> [vllm_batches, server_batches]

    @task(trigger_rule="none_failed_min_one_success")
    def collect(from_vllm: Any, from_server: Any) -> list[dict[str, Any]]:
        """Return the completed batches of whichever branch ran (the skipped one yields nothing)."""
        return [dict(b) for results in (from_vllm, from_server) if results for b in results if b]

    batches = collect(vllm_batches.output, server_batches.output)

    MergeResultsOperator(
        task_id="merge",
        batches=batches,
        output_dir="{{ params.output_dir or (params.data_dir ~ '/output/' ~ dag.dag_id) }}",
    )
