"""BedrockBatchHook with real boto3 against the emulator's Bedrock routes and a real S3 endpoint (moto's server)."""

from __future__ import annotations

import asyncio

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.backends.bedrock.common import STATUS_MAP, map_bedrock_status
from airflow_batch_provider.batches.line_retry import is_retryable
from airflow_batch_provider.chunking.chunks import build_chunks
from airflow_batch_provider.chunking.spec import RequestSpec
from airflow_batch_provider.exceptions import InvalidInputError, UnknownBatchStatusError
from airflow_batch_provider.status import BatchStatus
from airflow_batch_provider.utils.retry import RetryPolicy
from tests.conftest import wait_terminal

CLAUDE = "anthropic.claude-3-5-haiku-20241022-v1:0"
NOVA = "amazon.nova-lite-v1:0"
LABELS = ["toys", "garden", "kitchen"]
SCHEMA = {
    "title": "classification",
    "type": "object",
    "properties": {"label": {"type": "string", "enum": LABELS}},
    "required": ["label"],
}
TEMPLATE = "Classify: {title}\nLabels: toys, garden, kitchen"


def _chunks(tmp_path, rows: int, *, model: str = CLAUDE, schema=SCHEMA, chunk_size: int = 5_000):
    table = pa.table({"product_id": [f"p-{i:05d}" for i in range(rows)], "title": [f"item {i}" for i in range(rows)]})
    source = tmp_path / "in.parquet"
    pq.write_table(table, source)
    spec = RequestSpec(provider="bedrock", model=model, params={"max_tokens": 32}, response_schema=schema)
    return build_chunks(source, tmp_path / "job", spec, TEMPLATE, id_column="product_id", chunk_size=chunk_size)


@pytest.fixture
def hook(bedrock_emulator_env):
    from airflow_batch_provider.backends.bedrock.hook import BedrockBatchHook

    return BedrockBatchHook(retry_policy=RetryPolicy(attempts=6, base_delay=0.01, max_delay=0.05))


def _metadata(key: str) -> dict[str, str]:
    return {"airflow_idempotency_key": key, "airflow_dag_id": "nightly_product_classification", "chunk": "chunk 1/1"}


@pytest.mark.parametrize("status", sorted(STATUS_MAP))
def test_every_documented_status_maps(status):
    assert isinstance(map_bedrock_status(status, "arn:job"), BatchStatus)


def test_unknown_status_is_an_error():
    with pytest.raises(UnknownBatchStatusError, match="Archived"):
        map_bedrock_status("Archived", "arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/abc")


def test_job_runs_end_to_end_with_structured_output(hook, bedrock_emulator_env, tmp_path):
    (chunk,) = _chunks(tmp_path, 150).descriptors
    submitted = hook.submit(chunk, metadata=_metadata("a" * 40))
    assert submitted["batch_id"].startswith("arn:aws:bedrock:us-east-1:")
    state = wait_terminal(hook, submitted["batch_id"])
    assert state.status is BatchStatus.COMPLETED and state.provider_status == "Completed"
    assert (state.counts.total, state.counts.completed) == (150, 150)
    results = list(hook.iter_results(state))
    rows = pq.read_table(chunk["rows_path"]).column("custom_id").to_pylist()
    assert sorted(r["custom_id"] for r in results) == sorted(rows)
    assert {orjson.loads(r["response"])["label"] for r in results} <= set(LABELS)
    assert {r["finish_reason"] for r in results} == {"tool_calls"}
    assert all(r["input_tokens"] and r["output_tokens"] for r in results)
    assert hook.read_manifest(state)["successRecordCount"] == 150


def test_create_is_idempotent_on_the_client_request_token(hook, bedrock_emulator_env, tmp_path):
    (chunk,) = _chunks(tmp_path, 120).descriptors
    first = hook.create_batch(chunk, input_file_id=None, metadata=_metadata("b" * 40))
    again = hook.create_batch(chunk, input_file_id=None, metadata=_metadata("b" * 40))
    assert first == again
    stats = bedrock_emulator_env.stats()["bedrock"]
    assert (stats["batches_created"], stats["create_replayed"]) == (1, 1)
    found = hook.find_existing("b" * 40, chunk)
    assert [s.batch_id for s in found] == [first]
    assert hook.find_existing("c" * 40, chunk) == []


def test_a_batch_under_the_minimum_is_answered_on_demand_once(hook, bedrock_emulator_env, tmp_path):
    (chunk,) = _chunks(tmp_path, 7).descriptors
    batch_id = hook.create_batch(chunk, input_file_id=None, metadata=_metadata("d" * 40))
    assert batch_id == "ondemand/" + "d" * 40
    state = hook.get_state(batch_id)
    assert state.status is BatchStatus.COMPLETED and state.counts.completed == 7
    assert len({r["custom_id"] for r in hook.iter_results(state) if r["status"] == "succeeded"}) == 7
    assert hook.create_batch(chunk, input_file_id=None, metadata=_metadata("d" * 40)) == batch_id
    assert [s.batch_id for s in hook.find_existing("d" * 40, chunk)] == [batch_id]
    stats = bedrock_emulator_env.stats()["bedrock"]
    assert stats["realtime_requests"] == 7 and "batches_created" not in stats


def test_small_batches_can_be_refused(bedrock_emulator_env, tmp_path, monkeypatch):
    import json
    import os

    from airflow_batch_provider.backends.bedrock.hook import BedrockBatchHook

    (chunk,) = _chunks(tmp_path, 7).descriptors
    with pytest.raises(InvalidInputError, match="under Bedrock's minimum of 100"):
        BedrockBatchHook(small_batches="refuse").create_batch(chunk, input_file_id=None, metadata=_metadata("e" * 40))
    conn = json.loads(os.environ["AIRFLOW_CONN_BEDROCK_BATCH_DEFAULT"])
    conn["extra"]["small_batches"] = "refuse"
    monkeypatch.setenv("AIRFLOW_CONN_BEDROCK_BATCH_DEFAULT", json.dumps(conn))
    with pytest.raises(InvalidInputError, match="under Bedrock's minimum of 100"):
        BedrockBatchHook().create_batch(chunk, input_file_id=None, metadata=_metadata("e" * 40))
    assert bedrock_emulator_env.stats()["bedrock"].get("realtime_requests", 0) == 0


def test_line_errors_and_expiry(hook, bedrock_emulator_env, tmp_path):
    bedrock_emulator_env.set_faults(line_error_rate=0.2, expire_rate=0.1, seed=3)
    (chunk,) = _chunks(tmp_path, 300).descriptors
    state = wait_terminal(hook, hook.submit(chunk, metadata=_metadata("f" * 40))["batch_id"])
    assert state.status is BatchStatus.EXPIRED and state.provider_status == "Expired"
    results = list(hook.iter_results(state))
    errored = [r for r in results if r["status"] == "errored"]
    assert errored and all(r["http_status"] == 500 and is_retryable(r) for r in errored)
    assert 0 < 300 - len(results) < 300  # expired records have no output line: "missing", retried later
    assert state.counts.completed == len(results) - len(errored)


def test_throttled_calls_are_retried(hook, bedrock_emulator_env, tmp_path):
    bedrock_emulator_env.set_faults(http_429_rate=0.3, http_500_rate=0.1, retry_after=0.01, seed=1)
    (chunk,) = _chunks(tmp_path, 100).descriptors
    state = wait_terminal(hook, hook.submit(chunk, metadata=_metadata("1" * 40))["batch_id"])
    assert state.status is BatchStatus.COMPLETED
    assert len(list(hook.iter_results(state))) == 100
    http = bedrock_emulator_env.stats()["http"]
    assert http["injected_429"] + http["injected_500"] > 0


def test_failed_validation_reports_the_message(hook, bedrock_emulator_env, tmp_path):
    bedrock_emulator_env.set_faults(fail_validation="invalid_json_line")
    (chunk,) = _chunks(tmp_path, 100).descriptors
    state = wait_terminal(hook, hook.submit(chunk, metadata=_metadata("2" * 40))["batch_id"])
    assert state.status is BatchStatus.FAILED
    assert "invalid_json_line" in state.errors[0]["message"]


def test_stop_and_async_calls(hook, bedrock_emulator_env, tmp_path):
    bedrock_emulator_env.set_faults(slow=30)
    (chunk,) = _chunks(tmp_path, 100).descriptors
    arn = hook.submit(chunk, metadata=_metadata("3" * 40))["batch_id"]
    assert asyncio.run(hook.aget_state(arn)).status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
    asyncio.run(hook.acancel(arn))
    assert wait_terminal(hook, arn).status is BatchStatus.CANCELLED


def test_nova_family(hook, bedrock_emulator_env, tmp_path):
    (chunk,) = _chunks(tmp_path, 100, model=NOVA, schema=None).descriptors
    with open(chunk["requests_path"], "rb") as handle:
        assert b'"schemaVersion":"messages-v1"' in handle.readline()
    state = wait_terminal(hook, hook.submit(chunk, metadata=_metadata("4" * 40))["batch_id"])
    results = list(hook.iter_results(state))
    assert len(results) == 100 and {r["response"] for r in results} <= set(LABELS)
    assert {r["finish_reason"] for r in results} == {"stop"}
