"""Reprocess a table after a prompt change, paying only for what changed.

Every request carries a fingerprint of what is sent (model, endpoint, rendered prompt). With
``skip_unchanged=True`` the chunk step compares it with the stored output and sends only rows
that are new or whose request changed; the merge keeps the stored result for the others.

* Run it twice with the same Params: the second run sends nothing.
* Raise ``rows`` by 1,000: only the 1,000 new rows are sent.
* Bump ``prompt_version``: the instructions change, so every row is sent again.

``airflow dags test reprocess_after_prompt_change -c '{"rows": 5000, "prompt_version": 2}'``
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, Param, task

from airflow_batch_provider.operators import llm_batch_job

DATA_DIR = os.environ.get("BATCH_DEMO_DATA_DIR", "/tmp/airflow-batch-demo")
OUTPUT_DIR = "{{ params.output_dir or (params.data_dir ~ '/output/' ~ dag.dag_id) }}"

# The versioned instructions live in the (templated) system prompt; the per-row part in the template.
SYSTEM_PROMPTS = {
    1: "You write one-sentence product summaries for a catalogue.",
    2: "You write one-sentence product summaries for a catalogue. Mention the colour first.",
}

with DAG(
    dag_id="reprocess_after_prompt_change",
    description="Re-run a summarisation job after a prompt change; unchanged rows keep their stored result.",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params={
        "rows": Param(5_000, type="integer", minimum=1),
        "prompt_version": Param(1, enum=sorted(SYSTEM_PROMPTS), description="Which instructions to use."),
        "data_dir": Param(DATA_DIR, type="string"),
        "output_dir": Param("", type="string", description="Output dataset folder; empty: under data_dir."),
        "poll_interval": Param(30, type="number", minimum=0.1),
    },
    user_defined_macros={"system_prompts": SYSTEM_PROMPTS},
    tags=["llm-batch", "example"],
) as dag:

    @task
    def products(rows: int, data_dir: str) -> str:
        """Write the synthetic product table (prefix-stable: more rows only add rows)."""
        try:  # the demo's data ships with the emulator distribution, not with the provider
            from airflow_batch_emulator.examples import write_synthetic_products
        except ImportError as exc:
            raise RuntimeError(
                "The synthetic product table comes with airflow-batch-emulator (`pip install ./emulator` in "
                "the provider's repository); to run this DAG on your data, make this task return your table's path."
            ) from exc

        return write_synthetic_products(int(rows), data_dir)

    llm_batch_job(
        "summarise",
        prefix_group_id=False,  # task ids chunk, submit, wait, merge, as before the factory
        source=products("{{ params.rows }}", "{{ params.data_dir }}"),
        prompt_template="Summarise: {title}. {description}",
        system_prompt="{{ system_prompts[params.prompt_version] }}",
        model="gpt-4o-mini",
        id_column="product_id",
        request_params={"max_tokens": 40, "temperature": 0},
        chunk_size=10_000,
        skip_unchanged=True,
        previous_output=OUTPUT_DIR,
        poll_interval="{{ params.poll_interval }}",
        output_dir=OUTPUT_DIR,
    )
