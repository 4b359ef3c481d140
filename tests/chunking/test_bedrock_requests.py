"""Bedrock request lines and limits at chunk time: model families, params, record ids, the per-job minimum."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.backends.bedrock import BEDROCK_LIMITS
from airflow_batch_provider.backends.bedrock.bodies import ANTHROPIC_VERSION, to_record_line
from airflow_batch_provider.chunking.chunks import build_chunks
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.cost.tokens import request_parts
from airflow_batch_provider.exceptions import InvalidInputError
from tests.chunking.reference import render

CLAUDE = "anthropic.claude-3-5-haiku-20241022-v1:0"
SCHEMA = {"title": "answer", "type": "object", "properties": {"label": {"type": "string"}}}


def _spec(model: str = CLAUDE, **kw) -> RequestSpec:
    params = kw.pop("params", {"max_tokens": 16})
    return RequestSpec(provider="bedrock", model=model, params=params, **kw)


def test_anthropic_body_is_the_bedrock_messages_format():
    line = renderer_for(
        _spec(system_prompt="Be brief.", response_schema=SCHEMA, params={"max_tokens": 16, "stop": "x"})
    )
    record = orjson.loads(render(line, "p1", "Classify: lamp\u2028x"))
    assert list(record) == ["custom_id", "modelInput"]
    body = record["modelInput"]
    assert body["anthropic_version"] == ANTHROPIC_VERSION and "model" not in body
    assert body["system"] == "Be brief." and body["messages"] == [{"role": "user", "content": "Classify: lamp\u2028x"}]
    assert body["stop_sequences"] == ["x"]
    assert body["tool_choice"] == {"type": "tool", "name": "answer"}
    assert body["tools"][0]["input_schema"] == SCHEMA


def test_inference_profiles_are_anthropic_too():
    body = renderer_for(_spec("us.anthropic.claude-haiku-4-5-20251001-v1:0")).request_dict("a", "t")["modelInput"]
    assert body["anthropic_version"] == ANTHROPIC_VERSION


def test_nova_body_and_forced_tool():
    spec = _spec(
        "amazon.nova-lite-v1:0", system_prompt="sys", response_schema=SCHEMA, params={"max_tokens": 8, "temperature": 0}
    )
    body = renderer_for(spec).request_dict("a", "hello")["modelInput"]
    assert body["schemaVersion"] == "messages-v1"
    assert body["system"] == [{"text": "sys"}]
    assert body["messages"] == [{"role": "user", "content": [{"text": "hello"}]}]
    assert body["inferenceConfig"] == {"maxTokens": 8, "temperature": 0}
    assert body["toolConfig"]["toolChoice"] == {"tool": {"name": "answer"}}
    assert body["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"] == {"json": SCHEMA}


@pytest.mark.parametrize(
    ("model", "params", "match"),
    [
        ("meta.llama3-1-8b-instruct-v1:0", {"max_tokens": 8}, "not supported for batch inference"),
        (CLAUDE, {}, "require params\\['max_tokens'\\]"),
        (CLAUDE, {"max_tokens": 8, "anthropic_version": "x"}, "writes these itself"),
        ("amazon.nova-lite-v1:0", {"max_tokens": 8, "seed": 1}, "does not take the parameter"),
    ],
)
def test_bad_specs_fail_before_anything_is_written(model, params, match):
    with pytest.raises(InvalidInputError, match=match):
        _spec(model, params=params)


def test_record_line_renames_the_first_key_only():
    line = render(renderer_for(_spec()), "p1", 'says "custom_id"')
    record = orjson.loads(to_record_line(line))
    assert record["recordId"] == "p1" and "custom_id" not in record
    assert record["modelInput"]["messages"][0]["content"] == 'says "custom_id"'
    with pytest.raises(InvalidInputError, match="does not start with a custom_id"):
        to_record_line(b'{"recordId":"x"}')


def test_token_estimate_reads_model_input():
    parts = request_parts(render(renderer_for(_spec()), "p1", "hello there"), "bedrock")
    assert parts.pieces == ("hello there",) and parts.max_output == 16


def _table(tmp_path, rows: int, ids: list[str] | None = None):
    ids = ids or [f"p-{i:06d}" for i in range(rows)]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ids, "title": [f"t{i}" for i in range(rows)]}), path)
    return path


def test_ids_bedrock_does_not_accept_are_derived_alphanumeric(tmp_path):
    result = build_chunks(
        _table(tmp_path, 3, ["ok1", "has-dash", "has space"]), tmp_path / "job", _spec(), "{title}", id_column="id"
    )
    sent = pq.read_table(result.descriptors[0]["rows_path"]).column("custom_id").to_pylist()
    assert sent[0] == "ok1" and result.derived_ids == 2
    assert all(BEDROCK_LIMITS.custom_id_pattern.fullmatch(value) for value in sent)


@pytest.mark.parametrize(
    ("rows", "chunk_size", "expected"),
    [
        (1_030, 500, [500, 530]),  # the 30-row tail joins the chunk before it
        (1_000, 500, [500, 500]),  # nothing short: unchanged
        (60, 500, [60]),  # the whole job is short: one chunk (the hook answers it on demand)
    ],
)
def test_a_short_last_chunk_is_merged(tmp_path, rows, chunk_size, expected):
    result = build_chunks(
        _table(tmp_path, rows), tmp_path / "job", _spec(), "{title}", id_column="id", chunk_size=chunk_size
    )
    assert [d["num_requests"] for d in result.descriptors] == expected
    seen = []
    for d in result.descriptors:
        with open(d["requests_path"], "rb") as handle:
            ids = [orjson.loads(line)["custom_id"] for line in handle]
        assert ids == pq.read_table(d["rows_path"]).column("custom_id").to_pylist()
        assert d["label"].endswith(f"({d['num_requests']:,} req)")
        seen += ids
    assert len(seen) == rows == len(set(seen))
    assert sorted(p.name for p in (tmp_path / "job" / "chunks").iterdir() if p.suffix == ".jsonl") == [
        f"chunk-{i:05d}.jsonl" for i in range(len(expected))
    ]


def test_a_short_tail_after_a_full_chunk_splits_evenly(tmp_path):
    rows = BEDROCK_LIMITS.max_requests + 40
    result = build_chunks(
        _table(tmp_path, rows),
        tmp_path / "job",
        _spec(),
        "{title}",
        id_column="id",
        chunk_size=BEDROCK_LIMITS.max_requests,
    )
    assert [d["num_requests"] for d in result.descriptors] == [rows // 2, rows - rows // 2]
