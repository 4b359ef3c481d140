"""The columnar result path: OpenAI lines read by Arrow agree with the line parser; ranking and the join."""

from __future__ import annotations

import io

import orjson
import pyarrow as pa
import pytest

from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.results.merge import ChunkResults, _tagged, join_results, rank_results
from airflow_batch_provider.results.parse import parse_openai_line
from airflow_batch_provider.results.table import (
    EMBEDDING,
    RESULT_FIELDS,
    TEXT,
    openai_result_table,
    read_blocks,
    records_to_table,
)


def _line(custom_id: str, *, response: object = None, error: object = None) -> bytes:
    return orjson.dumps({"id": "batch_req_1", "custom_id": custom_id, "response": response, "error": error})


def _ok(custom_id: str, content: object = "books", **body: object) -> bytes:
    message = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    full = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 2, "total_tokens": 52},
        **body,
    }
    return _line(custom_id, response={"status_code": 200, "request_id": "req", "body": full})


# Every kind of line the output and error files hold, and the odd ones the fast path must hand over.
LINES = [
    _ok("plain"),
    _ok("empty-answer", content=""),
    _ok("unicode", content='caf\u00e9 \u2603 \U0001f600 "quoted" \\ back\nslash'),
    _ok("tool-call", content=None).replace(
        b'"content":null', b'"content":null,"tool_calls":[{"function":{"arguments":"{\\"a\\":1}"}}]'
    ),
    _ok("refusal", content=None).replace(b'"refusal":null', b'"refusal":"I cannot help"'),
    _ok("no-choices", choices=[]),
    _ok("no-usage", usage=None),
    _ok(
        "responses-api", object="response", choices=None, output=[{"content": [{"type": "output_text", "text": "hi"}]}]
    ),
    _line("http-400", response={"status_code": 400, "body": {"error": {"message": "bad model", "code": "nope"}}}),
    _line("http-500", response={"status_code": 500, "body": {}}),
    _line("expired", error={"code": "batch_expired", "message": "This request could not be executed"}),
    _line("cancelled", error={"code": "batch_cancelled", "message": "cancelled"}),
    _line("neither"),
    _line("bare-error", error="the server had an error"),
    _ok("cached", usage={"prompt_tokens": 50, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 32}}),
    _ok("extra-fields", system_fingerprint="fp", service_tier="default", choices_extra={"deep": [1, {"x": None}]}),
]


def _by_parser(lines: list[bytes], response_type: pa.DataType = TEXT) -> list[dict[str, object]]:
    return records_to_table([parse_openai_line(line) for line in lines], response_type).to_pylist()


def test_every_kind_of_line_gives_what_the_line_parser_gives():
    block = b"\n".join(LINES) + b"\n"
    table = openai_result_table(block)
    assert table.column_names == list(RESULT_FIELDS)
    assert table.to_pylist() == _by_parser(LINES)  # same records, in file order
    statuses = dict(zip(table.column("custom_id").to_pylist(), table.column("status").to_pylist(), strict=True))
    assert statuses["expired"] == "expired" and statuses["http-400"] == "errored" and statuses["plain"] == "succeeded"


def test_a_block_of_common_lines_is_read_without_the_line_parser(monkeypatch):
    def refuse(line: bytes) -> None:
        raise AssertionError(f"the line parser was called for {line[:40]!r}")

    monkeypatch.setattr("airflow_batch_provider.results.table.parse_openai_line", refuse)
    lines = [_ok(f"id-{i}", content=f"answer {i}") for i in range(1000)]
    table = openai_result_table(b"\n".join(lines))
    assert table.num_rows == 1000
    assert table.slice(7, 1).to_pylist() == [
        {
            "custom_id": "id-7",
            "status": "succeeded",
            "response": "answer 7",
            "finish_reason": "stop",
            "error": None,
            "error_code": None,
            "http_status": 200,
            "input_tokens": 50,
            "output_tokens": 2,
            "cached_input_tokens": None,
            "cache_write_tokens": None,
        }
    ]


def test_cached_prompt_tokens_are_read_by_both_paths():
    usage = {"prompt_tokens": 2100, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 2048}}
    lines = [_ok("hit", usage=usage), _ok("miss")]
    table = openai_result_table(b"\n".join(lines))
    assert table.column("cached_input_tokens").to_pylist() == [2048, None]
    assert table.to_pylist() == _by_parser(lines)


def test_a_block_that_does_not_fit_the_schema_is_parsed_line_by_line():
    odd = _line("odd", response={"status_code": 200, "body": {"choices": "none"}})  # a string where a list belongs
    lines = [_ok("a"), odd, _ok("b")]
    table = openai_result_table(b"\n".join(lines))
    assert table.to_pylist() == _by_parser(lines)


def test_blank_lines_and_crlf_endings_are_skipped():
    lines = [_ok("a"), _line("e", error={"code": "batch_expired", "message": "x"}), _ok("b")]
    block = b"\r\n\r\n".join(lines) + b"\r\n   \n"
    table = openai_result_table(block)
    assert table.column("custom_id").to_pylist() == ["a", "e", "b"]
    assert table.to_pylist() == _by_parser(lines)


def test_an_unreadable_line_raises_results_error():
    with pytest.raises(ResultsError, match="Unreadable OpenAI result line"):
        openai_result_table(_ok("a") + b"\n{not json\n")
    with pytest.raises(ResultsError, match="custom_id"):
        openai_result_table(_ok("a") + b'\n{"response": null, "error": null}\n')


def test_embeddings_take_the_line_parser_and_keep_float_lists():
    body = {"object": "list", "data": [{"embedding": [0.5, 0.25]}], "usage": {"prompt_tokens": 4}}
    line = _line("e1", response={"status_code": 200, "body": body})
    table = openai_result_table(line, EMBEDDING)
    assert table.schema.field("response").type == EMBEDDING
    assert table.to_pylist() == _by_parser([line], EMBEDDING)


def test_read_blocks_cuts_after_whole_lines():
    lines = [f'{{"n": {i}, "pad": "{"x" * (i % 7)}"}}'.encode() for i in range(200)]
    data = b"\n".join(lines) + b"\n" + b'{"last": "no newline"}'
    blocks = list(read_blocks(io.BytesIO(data), size=64))
    assert len(blocks) > 10 and all(block.endswith(b"\n") for block in blocks[:-1])
    assert b"".join(blocks) == data


# ------------------------------------------------------------------------- ranking and the join


def _rec(custom_id: str, status: str, response: str | None = None, **fields: object) -> dict[str, object]:
    return {
        "custom_id": custom_id,
        "status": status,
        "response": response,
        "finish_reason": None,
        "error": None if status == "succeeded" else f"{status} here",
        "error_code": None,
        "http_status": 200 if status == "succeeded" else 500,
        "input_tokens": 10,
        "output_tokens": 1 if status == "succeeded" else None,
        **fields,
    }


def _attempt(records: list[dict[str, object]], batch_id: str, number: int) -> pa.Table:
    return _tagged(records_to_table(records), batch_id, number)  # type: ignore[arg-type]


def test_the_latest_attempt_wins_then_the_most_useful_status_then_file_order():
    first = _attempt(
        [_rec("a", "errored"), _rec("b", "succeeded", "b1"), _rec("c", "errored"), _rec("c", "succeeded", "c1")],
        "batch_1",
        1,
    )
    second = _attempt(
        [_rec("a", "succeeded", "a2"), _rec("d", "succeeded", "d-first"), _rec("d", "succeeded", "d2")], "batch_2", 2
    )
    ranked = rank_results(pa.concat_tables([first, second]))
    resent = _attempt([_rec("a", "errored"), _rec("b", "errored")], "batch_2", 2).select(
        ["custom_id", "batch_id", "attempt"]
    )
    rows = pa.table({"custom_id": ["a", "b", "c", "d", "e"], "title": list("vwxyz")})
    table, stats = join_results(rows, ChunkResults(ranked, resent), "batch_1", "/v1/chat/completions")
    out = {r["custom_id"]: r for r in table.to_pylist()}
    assert (out["a"]["response"], out["a"]["batch_id"], out["a"]["attempts"]) == ("a2", "batch_2", 2)
    # b: resent in attempt 2 but not answered there: keeps its first answer, counts the attempt
    assert (out["b"]["response"], out["b"]["batch_id"], out["b"]["attempts"]) == ("b1", "batch_1", 2)
    assert (out["c"]["status"], out["c"]["response"], out["c"]["attempts"]) == ("succeeded", "c1", 1)
    assert out["d"]["response"] == "d-first"  # two equally good results: the first in the file
    assert out["e"]["status"] == "missing" and out["e"]["error"] == "no result line for this custom_id in batch batch_1"
    assert (out["e"]["batch_id"], out["e"]["attempts"]) == ("batch_1", 1)
    assert stats.statuses == {"succeeded": 4, "missing": 1}
    assert (stats.retried_rows, stats.recovered_rows, stats.unmatched_results) == (3, 3, 0)  # a, b, d
    assert stats.input_tokens == 40 and stats.output_tokens == 4
    assert stats.errors == {"missing/-": 1}
    assert stats.top_errors(5) == [["missing/-: no result line for this custom_id in batch batch_1", 1]]


def test_carried_rows_count_as_attempt_zero_and_unmatched_results_are_counted():
    carried = _attempt([_rec("old", "succeeded", "kept")], "batch_old", 0)
    fresh = _attempt([_rec("new", "errored"), _rec("stranger", "succeeded", "?")], "batch_9", 1)
    chunk = ChunkResults(
        rank_results(pa.concat_tables([carried, fresh])), fresh.slice(0, 0).select(["custom_id", "batch_id", "attempt"])
    )
    rows = pa.table({"custom_id": ["old", "new"]})
    table, stats = join_results(rows, chunk, "batch_9", "/v1/chat/completions")
    out = {r["custom_id"]: r for r in table.to_pylist()}
    assert (out["old"]["attempts"], out["old"]["batch_id"], out["old"]["response"]) == (0, "batch_old", "kept")
    assert (out["new"]["status"], out["new"]["attempts"]) == ("errored", 1)
    assert stats.unmatched_results == 1
    assert (stats.input_tokens, stats.new_input_tokens) == (20, 10)  # the carried row was paid for before
    assert stats.errors == {"errored/http_500": 1} and stats.error_messages == {"errored/http_500": "errored here"}
