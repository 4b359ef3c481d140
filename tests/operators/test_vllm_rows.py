"""One bad row never sinks a vLLM chunk: parameters, prompt lengths, engine errors, shutdown.

vLLM cannot load a model without a GPU (none here), so the model is stood in for
(:mod:`tests.vllm_stand_in`), but everything around it is vLLM's own: ``SamplingParams`` and
``StructuredOutputsParams`` validate the parameters, ``VLLMValidationError`` is what a too-long
prompt raises, and the outputs are vLLM's ``RequestOutput`` / ``EmbeddingRequestOutput``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from airflow_batch_provider.exceptions import BatchProviderError
from airflow_batch_provider.hooks import vllm_engine
from airflow_batch_provider.operators.vllm import VLLMGenerateOperator
from airflow_batch_provider.self_hosted.vllm_answers import MAX_FAILURES_BEFORE_ANY_SUCCESS
from tests.support import chat_line, make_context, write_chunk
from tests.vllm_stand_in import TEMPLATE_TOKENS, StandInFactory

pytestmark = pytest.mark.vllm_classes


def _chunk(tmp_path, bodies: list[dict[str, Any]], endpoint: str = "/v1/chat/completions"):
    rows = [{"custom_id": f"r-{i:04d}", "text": f"row {i}"} for i in range(len(bodies))]
    url = endpoint
    lines = [{"custom_id": r["custom_id"], "method": "POST", "url": url, "body": b} for r, b in zip(rows, bodies)]
    return write_chunk(tmp_path, rows, lines=lines, endpoint=endpoint, model="m")


def _chat(text: str, **params: Any) -> dict[str, Any]:
    return chat_line("x", text, model="m", **params)["body"]


def _run(monkeypatch, tmp_path, bodies, endpoint="/v1/chat/completions", **llm_options) -> tuple[dict, StandInFactory]:
    factory = StandInFactory(**llm_options)
    monkeypatch.setattr(vllm_engine, "create_engine", factory)
    chunk = _chunk(tmp_path, bodies, endpoint)
    result = VLLMGenerateOperator(task_id="gen", chunk=chunk, max_model_len=64).execute(make_context())
    with open(result["state"]["output_file_id"], "rb") as handle:
        lines = {o["custom_id"]: o for o in map(orjson.loads, handle)}
    assert len(lines) == len(bodies)  # one line per row, whatever happened
    return {"result": result, "lines": lines}, factory


def _error(line: dict[str, Any]) -> tuple[int, str, str]:
    response = line["response"]
    assert response["status_code"] != 200, line
    error = response["body"]["error"]
    return response["status_code"], error["code"], error["message"]


# Each value vLLM's own SamplingParams refuses, with words from vLLM's message.
REJECTED = [
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"stop": [""]}, "empty string"),
    ({"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids"),
]


@pytest.mark.parametrize(
    ("params", "word"), REJECTED, ids=[next(iter(p)) + f"_{i}" for i, (p, _) in enumerate(REJECTED)]
)
def test_each_parameter_vllm_rejects_is_an_error_line_for_that_row_only(monkeypatch, tmp_path, params, word):
    """Stand-in model (no GPU here), vLLM's real SamplingParams: the bad row gets a final 400, the others run."""
    bodies = [_chat("good one"), _chat("bad one", **params), _chat("good two")]
    run, factory = _run(monkeypatch, tmp_path, bodies)
    status, code, message = _error(run["lines"]["r-0001"])
    assert (status, code) == (400, "invalid_request_error")
    assert "vLLM rejected the sampling parameters" in message and word in message
    assert run["lines"]["r-0000"]["response"]["status_code"] == 200
    assert run["lines"]["r-0002"]["response"]["status_code"] == 200
    assert factory.llm is not None and len(factory.llm.chat_calls) == 1 and len(factory.llm.chat_calls[0][0]) == 2
    assert run["result"]["state"]["counts"] == {"total": 3, "completed": 2, "failed": 1}


def test_an_over_long_prompt_in_a_1000_row_chunk_fails_alone(monkeypatch, tmp_path):
    """Stand-in model (no GPU here): the tokenizer check keeps the long row out of the one engine call."""
    bodies = [_chat(f"short product description {i}") for i in range(1000)]
    bodies[537] = _chat(" ".join(["word"] * 64))  # 64 words + the template's tokens > max_model_len 64
    run, factory = _run(monkeypatch, tmp_path, bodies)
    status, code, message = _error(run["lines"]["r-0537"])
    assert (status, code) == (400, "context_length_exceeded")
    assert f"{64 + TEMPLATE_TOKENS} tokens" in message and "max_model_len=64" in message
    ok = [line for cid, line in run["lines"].items() if cid != "r-0537"]
    assert len(ok) == 999 and all(line["response"]["status_code"] == 200 for line in ok)
    assert factory.llm is not None and [len(c[0]) for c in factory.llm.chat_calls] == [999]
    assert run["result"]["generation"]["failures"] == {"400 context_length_exceeded": 1}


def test_a_prompt_of_exactly_max_model_len_is_refused_like_vllm_does(monkeypatch, tmp_path):
    """Stand-in model (no GPU here): a generating model needs room for one output token."""
    exact = _chat(" ".join(["w"] * (64 - TEMPLATE_TOKENS)))
    below = _chat(" ".join(["w"] * (63 - TEMPLATE_TOKENS)))
    run, _ = _run(monkeypatch, tmp_path, [exact, below])
    assert _error(run["lines"]["r-0000"])[1] == "context_length_exceeded"
    assert run["lines"]["r-0001"]["response"]["status_code"] == 200


def test_when_the_engine_raises_the_offending_rows_are_isolated(monkeypatch, tmp_path):
    """Stand-in model (no GPU here): the pre-check is off (no tokenizer), so vLLM's own check raises on the
    whole call; the chunk is bisected until the two long rows are alone, and only they fail."""
    bodies = [_chat(f"row {i}") for i in range(40)]
    for bad in (3, 29):
        bodies[bad] = _chat(" ".join(["word"] * 80))
    monkeypatch.setattr(vllm_engine, "_prompt_counter", lambda llm: None)
    run, factory = _run(monkeypatch, tmp_path, bodies)
    for bad in ("r-0003", "r-0029"):
        status, code, message = _error(run["lines"][bad])
        assert (status, code) == (400, "invalid_request_error")
        assert "VLLMValidationError" in message and "maximum model length" in message
    assert sum(line["response"]["status_code"] == 200 for line in run["lines"].values()) == 38
    answered = [len(c[0]) for c in factory.llm.chat_calls]  # type: ignore[union-attr]
    assert sum(answered) == 38 and len(answered) < 20  # halves, not one call per row


def test_an_engine_that_fails_on_every_row_fails_the_task(monkeypatch, tmp_path):
    """Stand-in model (no GPU here): a broken engine is not blamed on the rows; the task fails to be retried."""
    bodies = [_chat(f"row {i}") for i in range(50)]
    factory = StandInFactory(raise_on={"row": RuntimeError("CUDA error: an illegal memory access")})
    monkeypatch.setattr(vllm_engine, "create_engine", factory)
    op = VLLMGenerateOperator(task_id="gen", chunk=_chunk(tmp_path, bodies))
    with pytest.raises(BatchProviderError, match=f"failed on {MAX_FAILURES_BEFORE_ANY_SUCCESS} requests"):
        op.execute(make_context())
    assert factory.llm is not None and factory.llm.engine_core.shutdowns == 1  # shut down all the same


def test_bad_rows_at_the_front_do_not_fail_a_healthy_chunk(monkeypatch, tmp_path):
    """Stand-in model (no GPU here): more request errors than the engine-fault limit, all before any success,
    are each a 400 line; only engine errors count towards failing the task."""
    from vllm.exceptions import VLLMValidationError

    bad = MAX_FAILURES_BEFORE_ANY_SUCCESS + 4
    bodies = [_chat(f"refused {i}") for i in range(bad)] + [_chat(f"row {i}") for i in range(30)]
    run, _ = _run(monkeypatch, tmp_path, bodies, raise_on={"refused": VLLMValidationError("bad request")})
    codes = [line["response"]["status_code"] for _, line in sorted(run["lines"].items())]
    assert codes == [400] * bad + [200] * 30


def test_a_dead_engine_is_not_bisected(monkeypatch, tmp_path):
    """Stand-in model (no GPU here) raising vLLM's real EngineDeadError: one call, then the task fails."""
    from vllm.v1.engine.exceptions import EngineDeadError

    factory = StandInFactory(raise_on={"row": EngineDeadError()})
    monkeypatch.setattr(vllm_engine, "create_engine", factory)
    op = VLLMGenerateOperator(task_id="gen", chunk=_chunk(tmp_path, [_chat(f"row {i}") for i in range(16)]))
    with pytest.raises(EngineDeadError):
        op.execute(make_context())
    assert factory.llm is not None and factory.llm.engine_core.shutdowns == 1


def test_engine_reported_error_and_abort_are_error_lines(monkeypatch, tmp_path):
    """Stand-in model (no GPU here) answering with vLLM's RequestOutput and finish reasons error/abort."""
    schema = {"type": "object", "properties": {"label": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "l", "schema": schema}}
    bodies = [_chat("fine"), _chat("kv ERRORED"), _chat("ABORTED"), _chat("GRAMMAR", response_format=fmt)]
    finish = {"ERRORED": "error", "ABORTED": "abort", "GRAMMAR": "error"}
    run, factory = _run(monkeypatch, tmp_path, bodies, finish_reasons=finish)
    lines = run["lines"]
    assert lines["r-0000"]["response"]["status_code"] == 200
    assert _error(lines["r-0001"])[:2] == (500, "server_error")  # retryable
    assert _error(lines["r-0002"])[:2] == (503, "engine_aborted")  # retryable
    status, code, message = _error(lines["r-0003"])  # a grammar that did not compile: final
    assert (status, code) == (400, "invalid_request_error") and "compile" in message
    assert run["result"]["state"]["counts"] == {"total": 4, "completed": 1, "failed": 3}
    # The two retryable rows were sent once more while the model was loaded; the final one was not.
    assert [len(c[0]) for c in factory.llm.chat_calls] == [4, 2]  # type: ignore[union-attr]


def test_a_retryable_failure_that_passes_on_the_second_try_is_an_answer(monkeypatch, tmp_path):
    """Stand-in model (no GPU here) whose error/abort outputs happen on the first call only."""
    bodies = [_chat("fine"), _chat("kv ERRORED"), _chat("ABORTED")]
    finish = {"ERRORED": "error", "ABORTED": "abort"}
    run, _ = _run(monkeypatch, tmp_path, bodies, finish_reasons=finish, faults_once=True)
    assert all(line["response"]["status_code"] == 200 for line in run["lines"].values())
    bodies = [{"model": "m", "input": "POOLFAIL once"}]
    run, _ = _run(monkeypatch, tmp_path / "e", bodies, endpoint="/v1/embeddings", runner_type="pooling",
                  embedding_errors={"POOLFAIL"}, faults_once=True)  # fmt: skip
    assert run["lines"]["r-0000"]["response"]["status_code"] == 200


def test_an_errored_embedding_is_an_error_line(monkeypatch, tmp_path):
    """Stand-in model (no GPU here) answering with vLLM's EmbeddingRequestOutput: an empty vector is a failure."""
    bodies = [{"model": "m", "input": "good text"}, {"model": "m", "input": ["fine", "POOLFAIL here"]}]
    bodies.append({"model": "m", "input": " ".join(["w"] * 65)})  # pooling takes up to max_model_len
    run, _ = _run(monkeypatch, tmp_path, bodies, endpoint="/v1/embeddings", runner_type="pooling",
                  embedding_errors={"POOLFAIL"})  # fmt: skip
    lines = run["lines"]
    assert len(lines["r-0000"]["response"]["body"]["data"][0]["embedding"]) == 8
    status, code, message = _error(lines["r-0001"])
    assert (status, code) == (500, "server_error") and "pooler failed" in message
    assert _error(lines["r-0002"])[1] == "context_length_exceeded"


def test_the_engine_is_shut_down_after_success_and_failure(monkeypatch, tmp_path):
    """Stand-in model (no GPU here): the V1 engine core's shutdown() runs in a finally."""
    _, factory = _run(monkeypatch, tmp_path, [_chat("one"), _chat("two")])
    assert factory.llm is not None and factory.llm.engine_core.shutdowns == 1
    assert factory.engine is not None and factory.engine.llm is None  # the task drops its reference too

    failing = StandInFactory(raise_on={"boom": KeyboardInterrupt()})
    monkeypatch.setattr(vllm_engine, "create_engine", failing)
    op = VLLMGenerateOperator(task_id="gen", chunk=_chunk(tmp_path / "b", [_chat("boom")]), overwrite=True)
    with pytest.raises(KeyboardInterrupt):
        op.execute(make_context())
    assert failing.llm is not None and failing.llm.engine_core.shutdowns == 1


def test_generation_config_defaults_fill_unset_keys_like_vllm_serve(monkeypatch, tmp_path):
    """Stand-in model (no GPU here) whose generation_config says temperature 0.7, top_p 0.8, max_new_tokens 9."""
    defaults = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_tokens": 9}
    bodies = [_chat("plain"), _chat("explicit", temperature=0.2, max_tokens=3)]
    bodies[0].pop("max_tokens", None)
    _, factory = _run(monkeypatch, tmp_path, bodies, generation_defaults=defaults)
    plain, explicit = factory.llm.chat_calls[0][1]  # type: ignore[union-attr]
    assert (plain.temperature, plain.top_p, plain.top_k, plain.max_tokens) == (0.7, 0.8, 20, 9)
    assert (explicit.temperature, explicit.top_p, explicit.top_k, explicit.max_tokens) == (0.2, 0.8, 20, 3)


def test_max_num_seqs_none_leaves_vllms_default(monkeypatch, tmp_path):
    """Stand-in model (no GPU here): no max_num_seqs argument reaches vllm.LLM unless one is given."""
    factory = StandInFactory()
    monkeypatch.setattr(vllm_engine, "create_engine", factory)
    chunk = _chunk(tmp_path, [_chat("x")])
    VLLMGenerateOperator(task_id="a", chunk=chunk).execute(make_context())
    VLLMGenerateOperator(task_id="b", chunk=chunk, max_num_seqs=64, overwrite=True).execute(make_context())
    assert "max_num_seqs" not in factory.loads[0] and factory.loads[1]["max_num_seqs"] == 64


def test_shutdown_prefers_llm_shutdown_where_vllm_has_it():
    """A stand-in LLM with a ``shutdown()`` method (what newer vLLM may add): it is called, not the engine core."""
    calls: list[str] = []

    class WithShutdown:
        llm_engine = None

        def shutdown(self) -> None:
            calls.append("LLM.shutdown")

    engine = vllm_engine.VLLMEngine(
        llm=WithShutdown(), classes=StandInFactory().classes, cleanup=lambda: calls.append("cleanup")
    )
    vllm_engine.shutdown_engine(engine)
    vllm_engine.shutdown_engine(engine)  # a second call (e.g. from a finally) is harmless
    assert calls == ["LLM.shutdown", "cleanup"] and engine.llm is None


def test_the_real_cleanup_runs_vllms_teardown_on_the_cpu_build():
    """vLLM's real ``cleanup_dist_env_and_memory`` on vLLM's CPU build: the whole teardown runs (the
    accelerator-cache step is the CPU platform's), twice without harm; no GPU here to check CUDA memory."""
    from vllm.platforms import current_platform

    assert current_platform.is_cpu()
    vllm_engine._release_gpu_memory()
    vllm_engine._release_gpu_memory()
