"""VLLMGenerateOperator on the real engine: vLLM's CPU build, the default engine factory, a tiny model.

No stand-in and no mock: ``vllm_engine.create_engine`` builds a real ``vllm.LLM`` from the session's
tiny random Llama (meaningless answers). Each test that needs an engine builds one through the
operator, as a worker would; the chunks are few and mixed so that the lane stays within minutes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from airflow_batch_provider.hooks import vllm_engine
from airflow_batch_provider.operators.vllm import VLLMGenerateOperator
from tests.support import make_context, write_chunk

pytestmark = pytest.mark.vllm_engine

CHOICES = ["electronics", "clothing", "home"]
JSON_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": CHOICES}, "sure": {"type": "boolean"}},
    "required": ["label", "sure"],
    "additionalProperties": False,
}
# A lookbehind: no grammar backend vLLM ships compiles it (xgrammar refuses the pattern).
UNCOMPILABLE = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}, "required": ["a"]}


def _schema_format(schema: dict[str, Any], name: str = "answer") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _chat(text: str, **params: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 8, **params}


# custom_id -> (body, expected status, expected error code or None)
MIXED: dict[str, tuple[dict[str, Any], int, str | None]] = {
    "chat-0": (_chat("Classify: red cotton shirt"), 200, None),
    "chat-1": (_chat("Classify: steel kettle", temperature=0.7, top_p=0.9, seed=1), 200, None),
    "schema": (_chat("Label it", max_tokens=40, response_format=_schema_format(JSON_SCHEMA)), 200, None),
    "choice": (
        _chat("One word", max_tokens=20, response_format=_schema_format({"type": "string", "enum": CHOICES})),
        200,
        None,
    ),
    "blank": (_chat(""), 200, None),  # a blank message still has the chat template's tokens: answered
    "n-two": (_chat("Two answers", n=2), 400, "invalid_request_error"),
    "top-p-0": (_chat("Refused parameter", top_p=0), 400, "invalid_request_error"),
    "too-long": (_chat(" ".join(["lamp"] * 600)), 400, "context_length_exceeded"),
    "uncompilable": (_chat("Bad schema", response_format=_schema_format(UNCOMPILABLE)), 400, "invalid_request_error"),
    "chat-2": (_chat("Classify: wooden chair"), 200, None),
}


def _chunk(folder: Path, bodies: dict[str, dict[str, Any]], endpoint: str = "/v1/chat/completions"):
    rows = [{"custom_id": cid, "text": cid} for cid in bodies]
    lines = [{"custom_id": cid, "method": "POST", "url": endpoint, "body": b} for cid, b in bodies.items()]
    return write_chunk(folder, rows, lines=lines, endpoint=endpoint, model="tiny")


def _lines(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    with open(result["state"]["output_file_id"], "rb") as handle:
        return {line["custom_id"]: line for line in map(orjson.loads, handle)}


class _Loads:
    """Counts the engines the real factory builds (and keeps them, to check their shutdown)."""

    def __init__(self) -> None:
        self.engines: list[vllm_engine.VLLMEngine] = []
        self.real = vllm_engine.create_engine

    def __call__(self, **engine_args: Any) -> vllm_engine.VLLMEngine:
        engine = self.real(**engine_args)
        self.engines.append(engine)
        return engine


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> _Loads:
    """The default engine factory, observed (it still builds the real ``vllm.LLM``)."""
    observed = _Loads()
    monkeypatch.setattr(vllm_engine, "create_engine", observed)
    return observed


def test_a_mixed_chunk_each_bad_row_has_its_status_and_the_rest_succeed(cpu_engine, loads, tmp_path):
    chunk = _chunk(tmp_path / "mixed", {cid: body for cid, (body, _, _) in MIXED.items()})
    op = VLLMGenerateOperator(task_id="gen", chunk=chunk, **cpu_engine)
    children = len(psutil.Process().children(recursive=True))
    result = op.execute(make_context())
    lines = _lines(result)
    for cid, (_, status, code) in MIXED.items():
        response = lines[cid]["response"]
        assert response["status_code"] == status, (cid, response)
        if code is not None:
            assert response["body"]["error"]["code"] == code, (cid, response)
    assert (
        "maximum model length" in str(lines["uncompilable"])
        or "grammar" in str(lines["uncompilable"]).lower()
        or ("schema" in str(lines["uncompilable"]).lower())
    )
    answer = orjson.loads(lines["schema"]["response"]["body"]["choices"][0]["message"]["content"])
    assert answer["label"] in CHOICES and isinstance(answer["sure"], bool)  # the grammar held a random model
    choice = lines["choice"]["response"]["body"]["choices"][0]["message"]["content"]
    assert orjson.loads(choice) in CHOICES
    usage = lines["chat-0"]["response"]["body"]["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 8
    gen = result["generation"]
    assert gen["vllm_version"].startswith("0.") and gen["succeeded"] == 6 and gen["failed"] == 4
    # Shut down: the engine is released (and no engine process is left behind).
    assert len(loads.engines) == 1 and loads.engines[0].llm is None
    assert len(psutil.Process().children(recursive=True)) <= children

    # A retry of the complete chunk generates nothing: no engine is built.
    again = VLLMGenerateOperator(task_id="gen", chunk=chunk, **cpu_engine).execute(make_context())
    assert again["generation"]["reused"] is True and len(loads.engines) == 1
    assert _lines(again) == lines


def test_a_second_operator_in_the_same_process_completions_and_empty_prompt(cpu_engine, loads, tmp_path):
    """A second engine in one process (after the first test's was shut down): legacy completions."""
    bodies = {
        "p-0": {"model": "tiny", "prompt": "Product number 7: red", "max_tokens": 6},
        "p-1": {"model": "tiny", "prompt": [5, 17, 42, 99], "max_tokens": 6, "temperature": 0},
        "empty": {"model": "tiny", "prompt": "", "max_tokens": 6},
        "p-2": {"model": "tiny", "prompt": "Product number 9: blue", "max_tokens": 6, "stop": ["\n"]},
    }
    chunk = _chunk(tmp_path / "completions", bodies, endpoint="/v1/completions")
    result = VLLMGenerateOperator(task_id="gen2", chunk=chunk, **cpu_engine).execute(make_context())
    lines = _lines(result)
    for cid in ("p-0", "p-1", "p-2"):
        body = lines[cid]["response"]["body"]
        assert body["object"] == "text_completion" and isinstance(body["choices"][0]["text"], str), body
    assert lines["p-1"]["response"]["body"]["usage"]["prompt_tokens"] == 4
    assert lines["empty"]["response"]["status_code"] == 400
    assert len(loads.engines) == 1 and loads.engines[0].llm is None


def test_embeddings_on_the_same_tiny_model_as_a_pooling_engine(cpu_engine, loads, tmp_path):
    """The CPU build serves the tiny Llama as an embedding model (runner="pooling", convert="embed")."""
    bodies = {
        "one": {"model": "tiny", "input": "red cotton shirt"},
        "two": {"model": "tiny", "input": ["steel kettle", "wooden chair"]},
        "dims": {"model": "tiny", "input": "lamp", "dimensions": 8},
        "too-long": {"model": "tiny", "input": " ".join(["lamp"] * 600)},
    }
    chunk = _chunk(tmp_path / "embeddings", bodies, endpoint="/v1/embeddings")
    kwargs = {**cpu_engine, "engine_kwargs": {**cpu_engine["engine_kwargs"], "runner": "pooling", "convert": "embed"}}
    lines = _lines(VLLMGenerateOperator(task_id="embed", chunk=chunk, **kwargs).execute(make_context()))
    one, two = lines["one"]["response"]["body"], lines["two"]["response"]["body"]
    assert len(one["data"]) == 1 and len(two["data"]) == 2
    assert len(one["data"][0]["embedding"]) == 128 and one["usage"]["prompt_tokens"] > 0
    assert lines["dims"]["response"]["status_code"] == 400
    assert lines["too-long"]["response"]["body"]["error"]["code"] == "context_length_exceeded"
    assert len(loads.engines) == 1 and loads.engines[0].runner == "pooling" and loads.engines[0].llm is None
