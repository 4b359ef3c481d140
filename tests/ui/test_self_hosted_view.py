"""Self-hosted runs in the view (issue 38 item 3): a `BACKEND=server` run was missing from the runs list and,
opened by address, showed "0 done" beside "5,000 succeeded" and its chunk "waiting to be submitted".

The XComs are what the self-hosted operators return (self_hosted/output_lines.completed_batch), stored
as Airflow stores them; the real app answers in-process on a real Airflow schema (tests/ui/view_client.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from airflow_batch_provider.self_hosted.output_lines import ResultCounts, completed_batch
from tests.ui.view_client import ViewDB, view_client

DAG, RUN = "self_hosted_vllm", "manual__server"
ROWS = 2_500  # per chunk, two chunks


def _descriptor(index: int) -> dict[str, object]:
    return {"job_dir": "/j", "chunk_index": index, "num_chunks": 2, "label": f"chunk {index + 1}/2 ({ROWS:,} req)",
            "num_requests": ROWS, "provider": "openai", "model": "Qwen/Qwen2.5-1.5B-Instruct",
            "fingerprint": f"{index:064d}", "endpoint": "/v1/chat/completions"}  # fmt: skip


@pytest.fixture
def client() -> Iterator[tuple[ViewDB, object]]:
    db = ViewDB()
    with view_client(db) as test_client:
        yield db, test_client


def _server_run(db: ViewDB, generated: int, merged: bool) -> None:
    """A self_hosted_vllm run in server mode whose first ``generated`` chunks are answered."""
    pk = db.run(DAG, RUN, state="success" if merged else "running")
    chunks = [_descriptor(i) for i in range(2)]
    db.task(DAG, RUN, "chunk", "ChunkOperator")
    db.xcom(pk, DAG, RUN, "chunk", "return_value", chunks)
    for i, chunk in enumerate(chunks):
        db.task(DAG, RUN, "server_generate", "ServerGenerateOperator", map_index=i)
        if i < generated:
            batch = completed_batch(chunk, provider="server", output_path=f"/j/results/chunk-{i:05d}.output.jsonl",
                                    counts=ResultCounts(ROWS, ROWS, 0), generation={"reused": False})  # fmt: skip
            db.xcom(pk, DAG, RUN, "server_generate", "return_value", batch, map_index=i)
    if merged:
        db.task(DAG, RUN, "merge", "MergeResultsOperator")
        merged = {"job_dirs": ["/j"], "chunks": [[0, 0, ROWS, 0, 0], [0, 1, ROWS, 0, 0]]}
        summary = {"rows": 2 * ROWS, "succeeded": 2 * ROWS, "failed": 0, "statuses": {"succeeded": 2 * ROWS},
                   "chunk_counts": merged, "actual_cost_usd": None}  # fmt: skip
        db.xcom(pk, DAG, RUN, "merge", "return_value", summary)


def test_a_server_run_is_in_the_runs_list_with_its_rows_done_and_its_backend(client) -> None:
    db, http = client
    _server_run(db, generated=2, merged=True)
    runs = http.get("/")
    assert runs.status_code == 200 and f">{RUN}</a>" in runs.text
    assert "data-done='5000' data-total='5000'" in runs.text
    assert "server · Qwen/Qwen2.5-1.5B-Instruct" in runs.text  # the backend that answered, not the guessed one


def test_a_server_run_opened_by_address_shows_every_row_done(client) -> None:
    db, http = client
    _server_run(db, generated=2, merged=True)
    page = http.get(f"/runs/{DAG}/{RUN}").text
    assert 'data-testid="total-done"><b>5,000<' in page and 'data-testid="total-completed"><b>5,000<' in page
    assert "waiting to be submitted" not in page
    assert page.count("generate: success") == 2 and page.count('data-done="2500"') == 2


def test_a_chunk_still_generating_says_so(client) -> None:
    db, http = client
    _server_run(db, generated=1, merged=False)
    page = http.get(f"/runs/{DAG}/{RUN}").text
    phases = re.findall(r"<span class='muted phase'>([^<]+)</span>", page)
    assert phases == ["generate: success", "generate: success"]  # db.task adds successful task instances
    assert page.count('data-done="2500"') == 1 and 'data-done="0"' in page
