"""Merging results back onto source rows: correctness, error lines, idempotent reruns."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_batch_provider.exceptions import ResultsError, TooManyFailuresError
from airflow_batch_provider.operators.merge import MergeResultsOperator
from tests.conftest import wait_terminal
from tests.support import make_context, write_chunk


def _complete(hook, chunk):
    submitted = hook.submit(chunk, metadata={})
    state = wait_terminal(hook, submitted["batch_id"])
    return {**submitted, "state": state.to_dict()}


def _rows(n: int, start: int = 0, prefix: str = "m"):
    return [{"custom_id": f"{prefix}{i}", "text": f"item {i}", "sku": i} for i in range(start, start + n)]


def _read(folder):
    return pq.read_table(folder).to_pylist()


def test_join_is_row_by_row_correct(openai_hook, tmp_path):
    rows_a, rows_b = _rows(40), _rows(30, start=40)
    batches = [
        _complete(openai_hook, write_chunk(tmp_path / "j", rows_a, index=0, num_chunks=2)),
        _complete(openai_hook, write_chunk(tmp_path / "j", rows_b, index=1, num_chunks=2)),
    ]
    out = tmp_path / "out"
    summary = MergeResultsOperator(task_id="merge", batches=batches, output_dir=str(out)).execute(make_context())
    assert summary["rows"] == 70 and summary["succeeded"] == 70 and summary["chunks"] == 2
    merged = _read(out)
    assert [r["custom_id"] for r in merged] == [r["custom_id"] for r in rows_a + rows_b]  # source order kept
    expected_batch = {r["custom_id"]: b["batch_id"] for b, rows in zip(batches, (rows_a, rows_b)) for r in rows}
    # the emulator answers deterministically per prompt: look each answer up independently
    answers = {
        r["custom_id"]: r for b in batches for r in openai_hook.iter_results(openai_hook.get_state(b["batch_id"]))
    }
    for row in merged:
        assert row["sku"] == int(row["custom_id"][1:])
        assert row["batch_id"] == expected_batch[row["custom_id"]]
        assert row["status"] == "succeeded" and row["response"] == answers[row["custom_id"]]["response"]
        assert row["input_tokens"] == answers[row["custom_id"]]["input_tokens"]
        assert row["finish_reason"] in ("stop", "length")
        assert row["error"] is None
    assert (out / "_SUMMARY.json").exists()


def test_error_file_lines_and_missing_results(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(invalid_line_rate=0.5, seed=3)
    rows = _rows(40)
    batch = _complete(openai_hook, write_chunk(tmp_path / "j", rows))
    # a row with no request at all must still appear once, as "missing"
    extra = write_chunk(tmp_path / "k", [*rows, {"custom_id": "ghost", "text": "x", "sku": -1}], lines=[])
    batch = {**batch, "rows_path": extra["rows_path"]}
    out = tmp_path / "out"
    op = MergeResultsOperator(task_id="merge", batches=[batch], output_dir=str(out), max_failure_ratio=None)
    summary = op.execute(make_context())
    merged = {r["custom_id"]: r for r in _read(out)}
    assert len(merged) == 41
    assert {r["attempts"] for r in merged.values()} == {1}
    assert merged["ghost"]["status"] == "missing" and batch["batch_id"] in merged["ghost"]["error"]
    errored = [r for r in merged.values() if r["status"] == "errored"]
    assert errored and all(r["error"] and r["response"] is None for r in errored)
    assert summary["statuses"]["errored"] == len(errored)
    assert summary["succeeded"] + len(errored) + 1 == 41


def test_rerun_rewrites_the_same_files(openai_hook, tmp_path):
    batch = _complete(openai_hook, write_chunk(tmp_path / "j", _rows(20)))
    out = tmp_path / "out"
    op = MergeResultsOperator(task_id="merge", batches=[batch], output_dir=str(out))
    op.execute(make_context())
    first = _read(out)
    op.execute(make_context())
    assert _read(out) == first
    assert sorted(p.name for p in out.iterdir()) == ["_REPORT.html", "_SUMMARY.json", "part-00000.parquet"]


def test_stale_parts_of_a_larger_earlier_run_are_removed(openai_hook, tmp_path):
    out = tmp_path / "out"
    (out).mkdir()
    (out / "part-00007.parquet").write_bytes(b"old")
    batch = _complete(openai_hook, write_chunk(tmp_path / "j", _rows(5)))
    MergeResultsOperator(task_id="merge", batches=[batch], output_dir=str(out)).execute(make_context())
    assert not (out / "part-00007.parquet").exists()
    assert len(_read(out)) == 5


def test_source_column_named_like_a_result_column_is_refused(openai_hook, tmp_path):
    rows = [{"custom_id": "x1", "text": "t", "status": "active"}]
    batch = _complete(openai_hook, write_chunk(tmp_path / "j", rows))
    with pytest.raises(ResultsError, match="'status'"):
        MergeResultsOperator(task_id="merge", batches=[batch], output_dir=str(tmp_path / "o")).execute(make_context())


def test_no_batches_is_a_clear_error(tmp_path):
    with pytest.raises(ResultsError, match="no batches"):
        MergeResultsOperator(task_id="merge", batches=[], output_dir=str(tmp_path)).execute(make_context())


def test_too_many_failures_raise_after_every_part_is_written(openai_conn, openai_hook, tmp_path):
    good = _complete(openai_hook, write_chunk(tmp_path / "j", _rows(20), index=0, num_chunks=2))
    openai_conn.set_faults(invalid_line_rate=0.5, seed=3)
    bad = _complete(openai_hook, write_chunk(tmp_path / "j", _rows(20, start=20), index=1, num_chunks=2))
    out = tmp_path / "out"
    op = MergeResultsOperator(task_id="merge", batches=[good, bad], output_dir=str(out), max_failure_ratio=0.1)
    with pytest.raises(TooManyFailuresError) as info:
        op.execute(make_context())
    # A verdict on the data: Airflow fails the task at once instead of merging again on each retry.
    assert isinstance(info.value, AirflowFailException)
    message = str(info.value)
    failed = sum(1 for r in _read(out) if r["status"] != "succeeded")
    assert failed > 2
    assert "1 of 2 chunk(s)" in message and "chunk 2/2" in message and "chunk 1/2" not in message
    assert f"{failed} of 20 rows failed" in message
    assert "invalid_request_error" in message  # the top error code, with its message
    assert [c["label"] for c in info.value.chunks] == [bad["label"]]
    # what succeeded is kept: both parts and the summary were written before the error
    assert sorted(p.name for p in out.iterdir()) == [
        "_REPORT.html",
        "_SUMMARY.json",
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    assert len(_read(out)) == 40


def test_max_failure_ratio_is_checked():
    with pytest.raises(ValueError, match="max_failure_ratio"):
        MergeResultsOperator(task_id="merge", batches=[], output_dir="x", max_failure_ratio=1.5)


def test_merge_upserts_each_part_into_sql_once(openai_hook, tmp_path, monkeypatch):
    """MergeResultsOperator(sink=SqlUpsertSink(...)): rerunning the merge leaves one row per custom_id."""
    import sqlite3

    from airflow_batch_provider.sinks.sql import SqlUpsertSink

    db = tmp_path / "results.db"
    monkeypatch.setenv("AIRFLOW_CONN_RESULTS_DB", f'{{"conn_type": "sqlite", "host": "{db}"}}')
    batch = _complete(openai_hook, write_chunk(tmp_path / "j", _rows(30)))
    op = MergeResultsOperator(
        task_id="merge", batches=[batch], output_dir=str(tmp_path / "o"), sink=SqlUpsertSink("results_db", "answers")
    )
    op.execute(make_context())
    op.execute(make_context())
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT custom_id, status, response FROM answers ORDER BY custom_id").fetchall()
    assert len(rows) == 30 and len({r[0] for r in rows}) == 30
    assert {r[1] for r in rows} == {"succeeded"} and all(r[2] for r in rows)


def _embedding_lines(rows, encoding_format):
    return [
        {
            "custom_id": r["custom_id"],
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": r["text"], "encoding_format": encoding_format},
        }
        for r in rows
    ]


def test_base64_embeddings_merge_as_the_same_float_vectors(openai_hook, tmp_path):
    """encoding_format "base64" (what the openai SDK asks for by default) crashed the merge after paying."""
    rows = _rows(12)
    merged = {}
    for encoding in ("float", "base64"):
        lines = _embedding_lines(rows, encoding)
        chunk = write_chunk(tmp_path / encoding, rows, lines=lines, endpoint="/v1/embeddings")
        batch = _complete(openai_hook, chunk)
        out = tmp_path / f"out-{encoding}"
        MergeResultsOperator(task_id="merge", batches=[batch], output_dir=str(out)).execute(make_context())
        merged[encoding] = {r["custom_id"]: r for r in _read(out)}
    for cid, row in merged["base64"].items():
        assert row["status"] == "succeeded" and len(row["response"]) > 8
        assert row["response"] == merged["float"][cid]["response"]  # float32 both ways: exactly equal


def test_an_unparsable_result_is_a_results_error_naming_chunk_batch_and_line(openai_hook, tmp_path):
    """A result the merge cannot read (here: an embedding that is neither floats nor base64) names where it is."""
    from airflow_batch_provider.results.merge import collect_attempts
    from airflow_batch_provider.results.table import EMBEDDING, openai_result_table

    good = b'{"custom_id": "a", "response": {"status_code": 200, "body": {"object": "list", "data": [{"embedding": [0.5]}]}}}'
    bad = b'{"custom_id": "b", "response": {"status_code": 200, "body": {"object": "list", "data": [{"embedding": "%%"}]}}}'
    with pytest.raises(ResultsError, match=r"custom_id 'b'.*not base64") as info:
        openai_result_table(b"\n".join([good, good.replace(b'"a"', b'"c"'), bad]), EMBEDDING)
    assert info.value.line == 3

    from airflow_batch_provider.hooks.local_results import ServerResultsHook

    results = tmp_path / "results.jsonl"  # a self-hosted chunk's result file, read by its real hook
    results.write_bytes(b"\n".join([good, good.replace(b'"a"', b'"c"'), bad]) + b"\n")
    chunk = write_chunk(tmp_path / "j", _rows(2), endpoint="/v1/embeddings")
    state = {
        "batch_id": "batch_x",
        "provider": "server",
        "status": "completed",
        "provider_status": "completed",
        "output_file_id": str(results),
    }
    batch = {**chunk, "batch_id": "batch_x", "state": state}
    with pytest.raises(ResultsError) as info:
        collect_attempts(ServerResultsHook(), batch)
    message = str(info.value)
    assert message.startswith("chunk 1/1") and "batch batch_x" in message and "at result line 3" in message
    assert "clear the merge task" in message
