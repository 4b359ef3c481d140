"""The pre-flight canary (issue 40 item 4): a few requests answered in real time, against the emulator, before upload.

Real SDKs (openai, anthropic) over HTTP to the emulator's real-time routes; the emulator's stats say
what was sent (real-time requests, file uploads).
"""

from __future__ import annotations

import json
import logging

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.batches.canary import CanaryFailedError, canary_positions
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.operators.chunk import ChunkOperator
from airflow_batch_provider.operators.submit import SubmitBatchOperator
from airflow_batch_provider.progress import STOPPED_KEY
from tests.support import make_context

LABELS_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["electronics", "clothing", "home"]}},
    "required": ["label"],
    "additionalProperties": False,
}
MODELS = {
    "azure": "gpt-4o-mini",
    "openai": "gpt-4o-mini",
    "anthropic": "claude-haiku-4-5",
    "bedrock": "anthropic.claude-3-5-haiku-20241022-v1:0",
}


def _op(tmp_path, provider: str = "openai", rows: int = 40, **kwargs) -> ChunkOperator:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(rows)], "text": [f"item {i}" for i in range(rows)]}), path)
    kwargs.setdefault("request_params", {"max_tokens": 64})
    return ChunkOperator(
        task_id="chunk",
        source=str(path),
        job_dir=str(tmp_path / "job"),
        prompt_template="Classify this product: {text}",
        model=MODELS[provider],
        provider=provider,
        id_column="id",
        chunk_size=15,
        **kwargs,
    )


def _two_rows(tmp_path, template: str, **kwargs) -> ChunkOperator:
    """A two-row job for the cases ``_op``'s fixed model and template do not fit."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"]}), path)
    job_dir = str(tmp_path / "job")
    return ChunkOperator(
        task_id="chunk", source=str(path), job_dir=job_dir, prompt_template=template, id_column="id", **kwargs
    )


def _realtime(emulator) -> int:
    return emulator.stats()["realtime"].get("requests", 0)


def test_positions_are_spread_deterministic_and_distinct():
    assert canary_positions(40, 3) == [6, 20, 33]
    assert canary_positions(2, 3) == [0, 1]
    assert canary_positions(40, 0) == []


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_good_job_passes_the_canary_and_sends_n_realtime_requests(tmp_path, batch_emulator_env, provider, caplog):
    caplog.set_level(logging.INFO, logger="airflow_batch_provider.batches.canary")
    # temperature: a key some SDK versions' typed create() refuses; the canary POSTs the batch body as it is.
    params = {"max_tokens": 64, "temperature": 0}
    op = _op(tmp_path, provider, response_schema=LABELS_SCHEMA, canary_rows=3, request_params=params)
    descriptors = op.execute(make_context())
    assert len(descriptors) == 3
    assert _realtime(batch_emulator_env) == 3
    assert "canary: 3 of 3 real-time answers passed" in caplog.text
    # Each answer is logged beside its request: the rows spread over the job (positions 7, 21, 34).
    for custom_id in ("r6", "r20", "r33"):
        assert f'custom_id "{custom_id}"' in caplog.text


@pytest.mark.parametrize(("provider", "schema"), [("openai", LABELS_SCHEMA), ("anthropic", None)])
def test_max_tokens_that_truncates_every_answer_stops_before_upload(tmp_path, batch_emulator_env, provider, schema):
    """Structured or plain text: an answer cut off at max_tokens fails the canary (the merge would keep a cut text)."""
    op = _op(tmp_path, provider, response_schema=schema, request_params={"max_tokens": 2})
    context = make_context()
    with pytest.raises(CanaryFailedError) as info:
        op.execute(context)
    message = str(info.value)
    assert [value["reason"] for key, value in context["ti"].pushed if key == STOPPED_KEY] == [message]  # the view
    assert "3 of 3 real-time answers failed" in message and "nothing was uploaded" in message
    assert message.count("raise max_tokens") == 3 and 'custom_id "r20"' in message
    stats = batch_emulator_env.stats()
    assert stats["realtime"]["requests"] == 3
    assert stats["openai"].get("files_uploaded", 0) == 0 and stats["anthropic"].get("batches_created", 0) == 0


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_answers_the_model_cuts_off_in_real_time_stop_the_job_before_upload(tmp_path, batch_emulator_env, provider):
    """The emulator's truncate fault at rate 1 cuts every real-time answer, as it would every batch answer."""
    batch_emulator_env.set_faults(truncate_rate=1.0)
    op = _op(tmp_path, provider, response_schema=LABELS_SCHEMA if provider == "openai" else None)
    with pytest.raises(CanaryFailedError, match="3 of 3 real-time answers failed"):
        op.execute(make_context())
    stats = batch_emulator_env.stats()
    assert stats["openai"].get("files_uploaded", 0) == 0 and stats["anthropic"].get("batches_created", 0) == 0


def test_failures_within_the_threshold_pass(tmp_path, batch_emulator_env):
    op = _op(tmp_path, response_schema=LABELS_SCHEMA, request_params={"max_tokens": 2}, canary_max_failures=3)
    assert op.execute(make_context())


def test_a_request_the_provider_rejects_fails_the_canary_with_its_message(tmp_path, batch_emulator_env):
    """The emulator answers 400 for embeddings dimensions out of range, as the API does."""
    op = _two_rows(
        tmp_path,
        "{text}",
        model="text-embedding-3-small",
        endpoint="/v1/embeddings",
        request_params={"dimensions": 9000},
    )
    with pytest.raises(CanaryFailedError, match=r"HTTP 400.*dimensions.*check request_params"):
        op.execute(make_context())


def test_canary_rows_0_sends_none(tmp_path, batch_emulator_env):
    _op(tmp_path, request_params={"max_tokens": 2}, response_schema=LABELS_SCHEMA, canary_rows=0).execute(
        make_context()
    )
    assert _realtime(batch_emulator_env) == 0


def test_after_a_passing_canary_the_chunk_is_uploaded_as_usual(tmp_path, batch_emulator_env):
    descriptors = _op(tmp_path, rows=10, canary_rows=2).execute(make_context())
    SubmitBatchOperator(task_id="submit", chunk=descriptors[0]).execute(make_context())
    stats = batch_emulator_env.stats()
    assert stats["realtime"]["requests"] == 2 and stats["openai"]["files_uploaded"] == 1


def test_a_worker_without_the_connection_skips_the_canary(tmp_path, batch_emulator, caplog, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_OPENAI_BATCH_DEFAULT", raising=False)
    assert _op(tmp_path, request_params={"max_tokens": 2}, response_schema=LABELS_SCHEMA).execute(make_context())
    assert "canary skipped: no connection 'openai_batch_default'" in caplog.text
    assert _realtime(batch_emulator) == 0


@pytest.mark.parametrize("bad", [-1, True, "3"])
def test_bad_canary_arguments_fail_at_construction(tmp_path, bad):
    with pytest.raises(InvalidInputError, match="canary_rows"):
        _op(tmp_path, canary_rows=bad)


def test_bedrock_answers_the_canary_through_invoke_model(tmp_path, bedrock_emulator_env):
    descriptors = _op(tmp_path, "bedrock", response_schema=LABELS_SCHEMA).execute(make_context())
    assert sum(d["num_requests"] for d in descriptors) == 40
    assert bedrock_emulator_env.stats()["bedrock"]["realtime_requests"] == 3


def test_bedrock_truncated_answers_stop_before_upload(tmp_path, bedrock_emulator_env):
    with pytest.raises(CanaryFailedError, match="raise max_tokens"):
        _op(tmp_path, "bedrock", request_params={"max_tokens": 2}).execute(make_context())
    stats = bedrock_emulator_env.stats()["bedrock"]
    assert stats["realtime_requests"] == 3 and "batches_created" not in stats


def test_a_backend_without_a_realtime_call_logs_that_the_canary_is_skipped(tmp_path, batch_emulator_env, caplog):
    caplog.set_level(logging.INFO, logger="airflow_batch_provider.batches.canary")
    op = _two_rows(
        tmp_path, "Classify: {text}", model="gemini-2.5-flash", provider="gemini", request_params={"max_tokens": 2}
    )
    assert op.execute(make_context())
    assert "canary skipped: the gemini backend has no real-time call in this provider yet" in caplog.text


def test_azure_inherits_the_openai_canary_on_its_deployment_routes(tmp_path, batch_emulator, monkeypatch):
    from tests.backends.azure.conftest import azure_connection

    monkeypatch.setenv("AIRFLOW_CONN_AZURE_OPENAI_BATCH_DEFAULT", json.dumps(azure_connection(batch_emulator)))
    with pytest.raises(CanaryFailedError, match="raise max_tokens"):
        _op(tmp_path, "azure", response_schema=LABELS_SCHEMA, request_params={"max_tokens": 2}).execute(make_context())
    assert _realtime(batch_emulator) == 3


@pytest.mark.parametrize(
    ("provider", "answer"),
    [
        (
            "openai",
            {
                "custom_id": "a",
                "response": {
                    "status_code": 200,
                    "body": {
                        "object": "chat.completion",
                        "choices": [
                            {"message": {"content": None, "refusal": "I can't help."}, "finish_reason": "stop"}
                        ],
                    },
                },
            },
        ),
        (
            "anthropic",
            {
                "custom_id": "a",
                "result": {"type": "succeeded", "message": {"content": [], "stop_reason": "refusal"}},
            },
        ),
    ],
)
def test_a_refusal_is_a_failure_that_points_at_what_the_template_renders(provider, answer):
    """The emulator does not refuse, so the answer lines are written here in each provider's shape."""
    from airflow_batch_provider.backends.registry import get_backend
    from airflow_batch_provider.batches.canary import judge

    line = orjson.dumps(answer)
    problem = judge(get_backend(provider).parse_result(line), line, None, 64)
    assert problem is not None and "refused" in problem and "missing value" in problem
