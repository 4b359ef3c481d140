"""ServerGenerateOperator against the emulator's realtime routes, with the real openai SDK over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from airflow_batch_emulator.synth import chat_completion
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.operators.merge import MergeResultsOperator
from airflow_batch_provider.operators.server import ServerGenerateOperator
from airflow_batch_provider.status import BatchState, BatchStatus
from airflow_batch_provider.utils.retry import RetryPolicy
from tests.support import InMemoryTaskStateStore, chat_line, make_context, write_chunk

FAST = RetryPolicy(attempts=6, base_delay=0.01, max_delay=0.05)


def _point_connection(monkeypatch: pytest.MonkeyPatch, base_url: str) -> None:
    conn = {"conn_type": "openai_compatible", "host": base_url}  # no key: the hook sends a placeholder
    monkeypatch.setenv("AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT", json.dumps(conn))


@pytest.fixture
def server_conn(batch_emulator, monkeypatch):
    """Point ``openai_compatible_default`` at the emulator's realtime routes; return the emulator."""
    _point_connection(monkeypatch, batch_emulator.openai_base_url)
    return batch_emulator


@pytest.fixture(scope="module")
def slow_emulator() -> Iterator[Any]:
    """An emulator that sleeps 50 ms inside every realtime request, so concurrent requests overlap."""
    from airflow_batch_emulator.config import EmulatorConfig
    from airflow_batch_emulator.server import BatchEmulator

    emulator = BatchEmulator(EmulatorConfig(realtime_delay=0.05)).start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def slow_server_conn(slow_emulator, monkeypatch):
    slow_emulator.reset()
    _point_connection(monkeypatch, slow_emulator.openai_base_url)
    return slow_emulator


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"custom_id": f"row-{i:04d}", "text": f"Classify product {i}", "position": i} for i in range(n)]


def _chunk(tmp_path, n: int, **params: Any):
    rows = _rows(n)
    lines = [chat_line(r["custom_id"], r["text"], model="served-model", max_tokens=8, **params) for r in rows]
    return write_chunk(tmp_path / "chunks", rows, lines=lines, model="served-model"), lines


def _op(chunk: Any, **kwargs: Any) -> ServerGenerateOperator:
    kwargs.setdefault("request_retry_policy", FAST)
    return ServerGenerateOperator(task_id="server_generate", chunk=chunk, **kwargs)


def _output(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    with open(result["state"]["output_file_id"], "rb") as handle:
        return {o["custom_id"]: o for o in map(orjson.loads, handle)}


def _merge(result: dict[str, Any], out_dir) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = MergeResultsOperator(
        task_id="merge", batches=[result], max_failure_ratio=None, output_dir=str(out_dir)
    ).execute({})
    return summary, pq.read_table(out_dir).to_pylist()


def test_chunk_is_answered_and_merged_back_in_source_order(server_conn, tmp_path):
    chunk, lines = _chunk(tmp_path, 60)
    result = _op(chunk).execute(make_context())

    assert result["provider"] == "server" and result["batch_id"] == f"server-{chunk['fingerprint'][:16]}"
    state = BatchState.from_dict(result["state"])
    assert state.status is BatchStatus.COMPLETED and state.provider == "server"
    assert (state.counts.total, state.counts.completed, state.counts.failed) == (60, 60, 0)
    output = _output(result)
    assert set(output) == {line["custom_id"] for line in lines}
    for line in lines:
        o = output[line["custom_id"]]
        assert o["error"] is None and o["response"]["status_code"] == 200
        assert o["response"]["body"]["object"] == "chat.completion"
    assert server_conn.stats()["realtime"]["requests"] == 60

    summary, merged = _merge(result, tmp_path / "merged")
    assert summary["rows"] == 60 and summary["succeeded"] == 60
    assert [r["position"] for r in merged] == list(range(60))
    for row, line in zip(merged, lines):
        # The emulator's answer is a pure function of the request: each row got its own request's answer.
        expected = chat_completion(line["body"], 0)["choices"][0]["message"]["content"]
        assert row["custom_id"] == line["custom_id"] and row["response"] == expected
        assert row["status"] == "succeeded" and row["input_tokens"] > 0 and row["batch_id"] == result["batch_id"]
    gen = result["generation"]
    assert gen["requests"] == 60 and gen["prompts_per_s"] > 0 and gen["status_codes"] == {"200": 60}


@pytest.mark.parametrize("max_concurrency", [1, 4, 12], ids=lambda n: f"max{n}")
def test_requests_in_flight_never_exceed_max_concurrency(slow_server_conn, tmp_path, max_concurrency):
    chunk, _ = _chunk(tmp_path, 36)
    result = _op(chunk, max_concurrency=max_concurrency).execute(make_context())
    seen = slow_server_conn.stats()["realtime"]["realtime_max_concurrency"]
    assert seen <= max_concurrency
    assert result["generation"]["max_in_flight"] <= max_concurrency
    if max_concurrency > 1:
        assert seen > 1  # requests really overlap: the bound is what limits them
    assert result["state"]["counts"]["completed"] == 36


def test_429_500_and_dropped_connections_are_retried_to_success(server_conn, tmp_path):
    server_conn.set_faults(seed=5, http_429_rate=0.15, http_500_rate=0.15, drop_rate=0.05, retry_after=0.01)
    chunk, _ = _chunk(tmp_path, 60)
    # Every attempt is the hook's own (no SDK retries underneath): 12, as the SDK's 3 x FAST's 4 were.
    policy = RetryPolicy(attempts=12, base_delay=0.01, max_delay=0.05)
    result = _op(chunk, max_concurrency=8, request_retry_policy=policy).execute(make_context())
    http = server_conn.stats()["http"]
    assert http["injected_429"] > 0 and http["injected_500"] > 0 and http["dropped"] > 0
    assert result["state"]["counts"] == {"total": 60, "completed": 60, "failed": 0}
    summary, _ = _merge(result, tmp_path / "merged")
    assert summary["statuses"] == {"succeeded": 60}


def test_a_row_that_fails_for_good_becomes_an_error_line(server_conn, tmp_path):
    chunk, lines = _chunk(tmp_path, 10)
    lines[3]["body"]["messages"] = []  # the server rejects it with 400: not retried
    chunk = write_chunk(tmp_path / "chunks", _rows(10), lines=lines, model="served-model")
    result = _op(chunk).execute(make_context())
    bad = _output(result)["row-0003"]
    assert bad["error"] is None
    assert bad["response"]["status_code"] == 400
    assert "messages" in bad["response"]["body"]["error"]["message"]
    assert server_conn.stats()["http"]["requests"] == 10  # one call per row: a 400 is not retried
    assert result["state"]["counts"] == {"total": 10, "completed": 9, "failed": 1}
    summary, merged = _merge(result, tmp_path / "merged")
    assert summary["statuses"] == {"errored": 1, "succeeded": 9}
    assert merged[3]["status"] == "errored" and "messages" in merged[3]["error"]


def test_retries_exhausted_give_error_lines_not_a_failed_chunk(server_conn, tmp_path):
    server_conn.set_faults(http_500_rate=1.0)
    chunk, _ = _chunk(tmp_path, 3)
    result = _op(chunk, request_retry_policy=RetryPolicy(attempts=1, base_delay=0.01)).execute(make_context())
    output = _output(result)
    assert all(o["response"]["status_code"] == 500 for o in output.values())
    assert all("http_500_rate" in o["response"]["body"]["error"]["message"] for o in output.values())
    assert result["generation"]["status_codes"] == {"500": 3}
    summary, _ = _merge(result, tmp_path / "merged")
    assert summary["statuses"] == {"errored": 3}


def test_a_retry_does_not_resend_a_complete_chunk(server_conn, tmp_path):
    chunk, _ = _chunk(tmp_path, 12)
    store = InMemoryTaskStateStore()
    first = _op(chunk).execute(make_context(store))
    second = _op(chunk).execute(make_context(store))
    assert server_conn.stats()["realtime"]["requests"] == 12
    assert second["generation"]["reused"] is True and second["state"] == first["state"]


def test_model_override_and_embeddings(server_conn, tmp_path):
    rows = _rows(4)
    lines = [
        {
            "custom_id": r["custom_id"],
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "a", "input": r["text"]},
        }
        for r in rows
    ]
    chunk = write_chunk(tmp_path, rows, lines=lines, endpoint="/v1/embeddings", model="a")
    result = _op(chunk, model="text-embedding-3-small").execute(make_context())
    body = next(iter(_output(result).values()))["response"]["body"]
    assert body["model"] == "text-embedding-3-small" and body["object"] == "list"
    _, merged = _merge(result, tmp_path / "merged")
    assert all(r["status"] == "succeeded" and len(r["response"]) > 0 for r in merged)


def test_an_unreadable_chunk_line_fails_the_task_naming_the_line(server_conn, tmp_path):
    chunk, _ = _chunk(tmp_path, 3)
    with open(chunk["requests_path"], "ab") as handle:
        handle.write(b'{"custom_id": "broken", "body": \n')
    with pytest.raises(InvalidInputError, match=r"chunk 1/1 \(3 req\): line 4 of .*chunk-00000.jsonl"):
        _op(chunk).execute(make_context())


def test_priority_reaches_the_server_in_every_request_body_and_none_sends_no_field(server_conn, tmp_path):
    """The emulator counts the ``priority`` field each request body carried, as the server received it."""
    chunk, _ = _chunk(tmp_path / "with", 12)
    _op(chunk, priority=10).execute(make_context())
    assert server_conn.stats()["realtime"]["requests_by_priority"] == {"10": 12}
    chunk, _ = _chunk(tmp_path / "without", 5)
    _op(chunk).execute(make_context())  # None: vLLM without --scheduling-policy priority refuses a non-zero one
    assert server_conn.stats()["realtime"]["requests_by_priority"] == {"10": 12, "absent": 5}


@pytest.mark.parametrize("value", [0, -1, 2.5, True], ids=["zero", "negative", "float", "bool"])
def test_max_concurrency_must_be_a_positive_integer(value):
    with pytest.raises(InvalidInputError, match="max_concurrency"):
        ServerGenerateOperator(task_id="s", chunk={"label": "c"}, max_concurrency=value)


def test_defaults():
    op = ServerGenerateOperator(task_id="s", chunk={"label": "c"})
    assert op.max_concurrency == 64
    assert op.map_index_template == "{{ task.chunk['label'] }}"
    assert op.retry_policy is None  # Airflow's task retry policy is untouched by the request policy


@pytest.fixture(scope="module")
def airflow_db() -> None:
    """Migrate the test metadata DB (``dag.test()`` needs it)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, env=os.environ.copy(), capture_output=True)


@pytest.mark.scenario
def test_example_dag_server_mode_end_to_end(airflow_db, server_conn, tmp_path, monkeypatch):
    """dags/self_hosted_vllm.py with mode=server: the vLLM branch is skipped, merge runs after the server branch."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_batch_emulator.examples import synthetic_products
    from tests.conftest import REPO_ROOT

    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["self_hosted_vllm"]
    out = tmp_path / "out"
    run = dag.test(run_conf={"mode": "server", "rows": 400, "data_dir": str(tmp_path / "data"), "output_dir": str(out)})
    assert run.state == "success"
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert states[("vllm_generate", -1)] == "skipped"
    assert states[("server_generate", 0)] == "success" and states[("merge", -1)] == "success"
    merged = pq.read_table(out).to_pylist()
    assert [r["product_id"] for r in merged] == [r["product_id"] for r in synthetic_products(400).to_pylist()]
    assert all(r["status"] == "succeeded" and r["response"] for r in merged)
    assert server_conn.stats()["realtime"]["requests"] == 400


def test_a_server_that_admits_8_gets_every_row_with_64_in_flight(slow_server_conn, tmp_path, caplog):
    """429s shrink the in-flight limit (and retries are jittered): no row is left errored, the log stays short."""
    slow_server_conn.set_faults(realtime_max_in_flight=8, retry_after=0.02)
    chunk, _ = _chunk(tmp_path, 240)
    caplog.set_level("INFO")
    policy = RetryPolicy(attempts=8, base_delay=0.05, max_delay=0.5)
    result = _op(chunk, max_concurrency=64, request_retry_policy=policy).execute(make_context())
    assert result["state"]["counts"] == {"total": 240, "completed": 240, "failed": 0}
    gen = result["generation"]
    rejected = slow_server_conn.stats()["realtime"]["rejected_over_capacity"]
    assert gen["throttled"] == rejected > 0
    assert gen["lowest_concurrency"] <= 16  # it backed off towards what the server admits
    assert rejected < 3 * 240  # not the storm a fixed 64 in flight keeps up
    assert "Retrying request" not in caplog.text  # the SDK's retries are off; ours log at DEBUG
    assert "turned requests away" in caplog.text  # one summary line


def test_a_retry_resends_only_the_rows_that_failed_retryably(server_conn, tmp_path, caplog):
    chunk, lines = _chunk(tmp_path, 30)
    lines[5]["body"]["messages"] = []  # a 400: final, kept as it is
    chunk = write_chunk(tmp_path / "chunks", _rows(30), lines=lines, model="served-model")
    server_conn.set_faults(seed=3, http_500_rate=0.3)
    first = _op(chunk, max_concurrency=4, request_retry_policy=RetryPolicy(attempts=1)).execute(make_context())
    failed = {cid for cid, o in _output(first).items() if o["response"]["status_code"] != 200}
    assert "row-0005" in failed and len(failed) > 3
    caplog.set_level("WARNING")
    assert "failed for good (500)" in caplog.text  # one line per row that failed, naming it
    server_conn.reset()
    caplog.set_level("INFO")
    again = _op(chunk, max_concurrency=4).execute(make_context())  # the task's retry, or a clear
    assert server_conn.stats()["realtime"]["requests"] == len(failed) - 1  # not the 400, not the answered rows
    output = _output(again)
    assert len(output) == 30 and output["row-0005"]["response"]["status_code"] == 400
    assert all(o["response"]["status_code"] == 200 for cid, o in output.items() if cid != "row-0005")
    assert {cid: o for cid, o in _output(first).items() if cid not in failed} == {
        cid: o for cid, o in output.items() if cid not in failed
    }  # kept lines are byte-for-byte the first run's
    assert again["state"]["counts"] == {"total": 30, "completed": 29, "failed": 1}
    assert again["generation"]["resent"] == len(failed) - 1 and again["generation"]["kept"] == 30 - len(failed) + 1
    third = _op(chunk).execute(make_context())  # nothing retryable left: reused as it is
    assert third["generation"]["reused"] is True and server_conn.stats()["realtime"]["requests"] == len(failed) - 1
