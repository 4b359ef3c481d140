"""skip_unchanged: unchanged rows are carried with their stored result, the rest are sent."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.chunking.incremental import apply_skip_unchanged, load_previous, read_carried
from airflow_batch_provider.job_folder import ChunkFiles
from airflow_batch_provider.results.merge import collect_attempts
from tests.support import write_chunk


def _previous(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "part-00000.parquet")


def _row(cid, fp, status="succeeded", response="old answer"):
    return {
        "custom_id": cid, "request_fingerprint": fp, "status": status, "response": response,
        "finish_reason": "stop", "error": None, "input_tokens": 5, "output_tokens": 2, "batch_id": "batch_old",
    }  # fmt: skip


def _chunk_with_fingerprints(tmp_path, fps):
    rows = [{"custom_id": cid, "text": "t", "request_fingerprint": fp} for cid, fp in fps.items()]
    return write_chunk(tmp_path / "job", rows)


def _skip(tmp_path, chunk, previous):
    """Carry unchanged rows of a chunk written straight into ``job`` (staged and published are the same here)."""
    files = ChunkFiles(tmp_path / "job")
    return apply_skip_unchanged([chunk], previous, files, files)


def test_load_previous_keeps_only_succeeded_rows(tmp_path):
    _previous(tmp_path / "out", [_row("a", "f1"), _row("b", "f2", status="errored", response=None)])
    previous = load_previous(str(tmp_path / "out"))
    assert previous.column("custom_id").to_pylist() == ["a"]
    assert load_previous(str(tmp_path / "missing")) is None


def _with_code(cid, status, code, finish="stop"):
    row = _row(cid, "f-" + cid, status=status, response=None if status == "errored" else "cut")
    return {**row, "error_code": code, "finish_reason": finish}


FINAL_AND_NOT = [
    _with_code("ok", "succeeded", None),
    _with_code("cut", "invalid_output", "truncated", finish="length"),
    _with_code("schema", "invalid_output", "schema"),
    _with_code("bad-request", "errored", "invalid_request_error"),
    _with_code("http-400", "errored", "http_400"),
    _with_code("server", "errored", "server_error"),
    _with_code("http-503", "errored", "http_503"),
    _with_code("rate", "errored", "http_429"),
    _with_code("no-code", "errored", None),
    _with_code("expired", "expired", "batch_expired"),
    _with_code("canceled", "canceled", "batch_cancelled"),
    _with_code("missing", "missing", None),
]


def test_final_results_of_every_status_are_carried_and_retryable_ones_are_not(tmp_path):
    """A truncated (invalid_output) or 400-errored row of the same request is a result: not paid for again."""
    _previous(tmp_path / "out", FINAL_AND_NOT)
    kept = load_previous(str(tmp_path / "out")).column("custom_id").to_pylist()
    assert kept == ["ok", "cut", "schema", "bad-request", "http-400"]
    only_answers = load_previous(str(tmp_path / "out"), ["succeeded"]).column("custom_id").to_pylist()
    assert only_answers == ["ok"]
    chunk = _chunk_with_fingerprints(tmp_path, {r["custom_id"]: r["request_fingerprint"] for r in FINAL_AND_NOT})
    (new,), stats = _skip(tmp_path, chunk, load_previous(str(tmp_path / "out")))
    assert (stats.carried, stats.sent) == (5, 7)
    carried = {r["custom_id"]: r for r in read_carried(new["carry_path"]).to_pylist()}
    assert carried["cut"]["error_code"] == "truncated" and carried["cut"]["http_status"] == 200
    assert carried["bad-request"]["http_status"] is None


@pytest.mark.parametrize("statuses", [["expired"], ["succeeded", "missing"], []])
def test_carry_statuses_refuse_what_can_never_be_a_result(tmp_path, statuses):
    from airflow_batch_provider.exceptions import InvalidInputError
    from airflow_batch_provider.operators.chunk import ChunkOperator

    with pytest.raises(InvalidInputError, match="carry_statuses"):
        ChunkOperator(
            task_id="chunk", source="x.parquet", prompt_template="{text}", model="gpt-4o-mini",
            skip_unchanged=True, previous_output=str(tmp_path), carry_statuses=statuses,
        )  # fmt: skip


def test_unchanged_rows_are_carried_and_dropped_from_the_chunk(tmp_path):
    _previous(tmp_path / "out", [_row("a", "f1"), _row("b", "OLD"), _row("c", "f3", status="errored", response=None)])
    chunk = _chunk_with_fingerprints(tmp_path, {"a": "f1", "b": "f2", "c": "f3", "d": "f4"})
    (new,), stats = _skip(tmp_path, chunk, load_previous(str(tmp_path / "out")))
    assert (stats.rows, stats.carried, stats.sent) == (4, 1, 3)
    sent = [orjson.loads(line)["custom_id"] for line in Path(new["requests_path"]).read_bytes().splitlines()]
    assert sent == ["b", "c", "d"]  # b changed, c failed before, d is new
    assert new["num_requests"] == 3 and new["num_carried"] == 1 and new["fingerprint"] != chunk["fingerprint"]
    assert "1 unchanged" in new["label"]
    (carried,) = read_carried(new["carry_path"]).to_pylist()
    assert carried["custom_id"] == "a" and carried["response"] == "old answer" and carried["batch_id"] == "batch_old"


def test_nothing_to_compare_leaves_chunks_alone(tmp_path):
    chunk = _chunk_with_fingerprints(tmp_path, {"a": "f1"})
    out, stats = _skip(tmp_path, chunk, None)
    assert out == [chunk] and stats.carried == 0


def test_merge_puts_carried_rows_back_with_attempts_zero(tmp_path):
    _previous(tmp_path / "out", [_row("a", "f1"), _row("b", "f2")])
    chunk = _chunk_with_fingerprints(tmp_path, {"a": "f1", "b": "f2"})
    (new,), _ = _skip(tmp_path, chunk, load_previous(str(tmp_path / "out")))
    assert new["num_requests"] == 0
    chunk = collect_attempts(None, {**new, "batch_id": "", "state": None})  # no batch: no hook call
    kept = chunk.results.select(["custom_id", "batch_id", "attempt"]).to_pylist()
    assert sorted(kept, key=lambda r: r["custom_id"]) == [
        {"custom_id": "a", "batch_id": "batch_old", "attempt": 0},
        {"custom_id": "b", "batch_id": "batch_old", "attempt": 0},
    ]


def test_chunk_operator_needs_previous_output(tmp_path):
    from airflow_batch_provider.exceptions import InvalidInputError
    from airflow_batch_provider.operators.chunk import ChunkOperator

    with pytest.raises(InvalidInputError, match="previous_output"):
        ChunkOperator(task_id="c", source="x.parquet", prompt_template="{a}", model="m", skip_unchanged=True)


def test_the_chunk_step_publishes_carried_rows_and_schema_with_a_final_manifest(tmp_path):
    """Carrying and the schema happen before publishing: the manifest lists them, nothing is rewritten after."""
    from airflow_batch_provider.chunking.chunks import build_chunks
    from airflow_batch_provider.chunking.spec import RequestSpec
    from airflow_batch_provider.job_folder import JobFolder

    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["x", "y", "z"]}), source)
    schema = {"type": "object", "properties": {"label": {"type": "string"}}}
    spec = RequestSpec(provider="openai", model="gpt-4o-mini", response_schema=schema)
    first = build_chunks(source, tmp_path / "job1", spec, "{text}", id_column="id").descriptors[0]
    rows = pq.read_table(first["rows_path"]).to_pylist()
    _previous(tmp_path / "out", [_row(r["custom_id"], r["request_fingerprint"]) for r in rows[:2]])

    job = JobFolder(tmp_path / "job2")
    result = build_chunks(source, job.path, spec, "{text}", id_column="id", previous_output=str(tmp_path / "out"))
    (chunk,) = result.descriptors
    assert orjson.loads(job.chunks.manifest.read_bytes()) == result.descriptors
    assert chunk["schema_path"] == str(job.chunks.schema) and orjson.loads(job.chunks.schema.read_bytes()) == schema
    assert chunk["carry_path"] == str(job.chunks.carry(0)) and chunk["num_carried"] == 2
    assert result.skipped is not None and (result.skipped.rows, result.skipped.carried) == (3, 2)
    sent = job.chunks.requests(0).read_bytes()
    assert [orjson.loads(line)["custom_id"] for line in sent.splitlines()] == ["c"]
    assert chunk["num_requests"] == 1 and chunk["num_bytes"] == len(sent)
    assert sorted(p.name for p in job.path.iterdir()) == ["chunks"]  # no staging folder left


@pytest.mark.parametrize(("statuses", "sent"), [(None, []), (["succeeded"], ["b"])])
def test_the_chunk_operator_carries_by_its_carry_statuses(tmp_path, statuses, sent):
    """ChunkOperator's carry_statuses reach the staging step: a truncated answer is kept unless told otherwise."""
    from airflow_batch_provider.chunking.chunks import build_chunks
    from airflow_batch_provider.chunking.spec import RequestSpec
    from airflow_batch_provider.operators.chunk import ChunkOperator

    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"]}), source)
    spec = RequestSpec(provider="openai", model="gpt-4o-mini")
    first = build_chunks(source, tmp_path / "job1", spec, "{text}", id_column="id").descriptors[0]
    a, b = pq.read_table(first["rows_path"]).to_pylist()
    cut = _with_code("b", "invalid_output", "truncated", finish="length")
    _previous(
        tmp_path / "out",
        [_row("a", a["request_fingerprint"]), {**cut, "request_fingerprint": b["request_fingerprint"]}],
    )

    chosen = {} if statuses is None else {"carry_statuses": statuses}
    op = ChunkOperator(
        task_id="chunk", source=str(source), prompt_template="{text}", model="gpt-4o-mini", id_column="id",
        job_dir=str(tmp_path / "job2"), skip_unchanged=True, previous_output=str(tmp_path / "out"), **chosen,
    )  # fmt: skip
    (chunk,) = op.execute({})  # type: ignore[arg-type]
    lines = Path(chunk["requests_path"]).read_bytes().splitlines()
    assert [orjson.loads(line)["custom_id"] for line in lines] == sent
    assert chunk["num_carried"] == 2 - len(sent)
