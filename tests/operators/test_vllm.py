"""VLLMGenerateOperator end to end with a stand-in model over vLLM's real classes.

No GPU here, so vLLM cannot load a model: every test that runs the operator replaces
``airflow_batch_provider.hooks.vllm_engine.create_engine`` with :class:`tests.vllm_stand_in.StandInFactory`,
a stand-in ``vllm.LLM`` that takes vLLM's real ``SamplingParams`` / ``StructuredOutputsParams``
(validated by vLLM itself) and answers with vLLM's real output classes. Each test says so.
"""

from __future__ import annotations

import sys
import types
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.exceptions import BatchProviderError, InvalidInputError
from airflow_batch_provider.hooks import vllm_engine
from airflow_batch_provider.hooks.local_results import VLLMResultsHook
from airflow_batch_provider.hooks.registry import get_batch_hook, hook_class_for
from airflow_batch_provider.hooks.vllm_engine import INSTALL_HINT, EngineUnavailableError, VLLMClasses
from airflow_batch_provider.operators.merge import MergeResultsOperator
from airflow_batch_provider.operators.server import ServerGenerateOperator
from airflow_batch_provider.operators.vllm import VLLMGenerateOperator
from airflow_batch_provider.self_hosted.output_lines import meta_path
from airflow_batch_provider.self_hosted.vllm_requests import RowRejected, sampling_kwargs
from airflow_batch_provider.status import BatchState, BatchStatus
from tests.support import InMemoryTaskStateStore, chat_line, make_context, write_chunk
from tests.vllm_stand_in import LABELS, StandInFactory, StandInLLM, real_classes, stand_in_label

pytestmark = pytest.mark.vllm_classes


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> StandInFactory:
    """The stand-in model over vLLM's real classes, installed in place of the real factory (no GPU here)."""
    factory = StandInFactory()
    monkeypatch.setattr(vllm_engine, "create_engine", factory)
    return factory


# ------------------------------------------------------------------------------------- helpers


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"custom_id": f"p-{i:03d}", "text": f"Product number {i}", "price": float(i)} for i in range(n)]


def _classify_chunk(tmp_path, n: int = 12, **params: Any):
    rows = _rows(n)
    lines = [
        {
            **chat_line(r["custom_id"], r["text"], model="Qwen/Qwen2.5-1.5B-Instruct", max_tokens=5, temperature=0),
        }
        for r in rows
    ]
    for line in lines:
        line["body"]["messages"].insert(0, {"role": "system", "content": "You classify products."})
        line["body"].update(params)
    return write_chunk(tmp_path / "chunks", rows, lines=lines, model="Qwen/Qwen2.5-1.5B-Instruct"), lines


def _op(chunk: Any, **kwargs: Any) -> VLLMGenerateOperator:
    return VLLMGenerateOperator(task_id="vllm_generate", chunk=chunk, **kwargs)


def _output_lines(result: dict[str, Any]) -> list[dict[str, Any]]:
    path = result["state"]["output_file_id"]
    with open(path, "rb") as handle:
        return [orjson.loads(line) for line in handle]


# --------------------------------------------------------------------------------------- tests


def test_whole_chunk_goes_to_one_chat_call_and_comes_back_in_openai_batch_format(engine, tmp_path):
    """Stand-in engine (no GPU/vllm here): one model load, one ``llm.chat`` with every request."""
    chunk, lines = _classify_chunk(tmp_path, n=12)
    result = _op(chunk, max_model_len=4096, download_dir="/models").execute(make_context())

    assert len(engine.loads) == 1
    assert engine.loads[0] == {
        "model": "Qwen/Qwen2.5-1.5B-Instruct",  # no gpu_memory_utilization: vLLM's own default applies
        "tensor_parallel_size": 1,
        "dtype": "auto",
        "max_model_len": 4096,
        "download_dir": "/models",
    }
    assert engine.llm is not None and len(engine.llm.chat_calls) == 1
    conversations, params = engine.llm.chat_calls[0]
    assert conversations == [line["body"]["messages"] for line in lines]
    assert all(type(p).__module__ == "vllm.sampling_params" for p in params)  # vLLM's own class
    assert all((p.n, p.temperature, p.max_tokens, p.structured_outputs) == (1, 0, 5, None) for p in params)

    out = _output_lines(result)
    assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines]
    for line, o in zip(lines, out):
        assert set(o) == {"id", "custom_id", "response", "error"}
        assert o["error"] is None and o["id"].startswith("batch_req_")
        response = o["response"]
        assert response["status_code"] == 200 and response["request_id"]
        body = response["body"]
        assert body["object"] == "chat.completion" and body["model"] == "Qwen/Qwen2.5-1.5B-Instruct"
        choice = body["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": stand_in_label(line["body"]["messages"])}
        assert choice["finish_reason"] == "stop"
        usage = body["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0

    assert result["provider"] == "vllm"
    assert result["batch_id"] == f"vllm-{chunk['fingerprint'][:16]}"
    state = BatchState.from_dict(result["state"])
    assert state.provider == "vllm" and state.status is BatchStatus.COMPLETED
    assert state.output_file_id == str(tmp_path / "chunks" / "results" / "chunk-00000.output.jsonl")
    assert (state.counts.total, state.counts.completed, state.counts.failed) == (12, 12, 0)
    gen = result["generation"]
    assert gen["prompts_per_s"] > 0 and gen["tokens_per_s"] > 0 and gen["output_tokens_per_s"] > 0
    assert gen["gpu"]["gpu_memory_utilization"] is None and gen["gpu"]["tensor_parallel_size"] == 1
    # max_num_seqs was left to vLLM: the value reported is the one the engine chose.
    assert gen["gpu"]["max_num_seqs"] == 1024 and gen["reused"] is False
    orjson.dumps(result)  # XCom-safe


def test_merge_reads_vllm_results_unchanged(engine, tmp_path):
    """Stand-in engine (no GPU/vllm here); the real MergeResultsOperator joins the output onto the rows."""
    chunk, lines = _classify_chunk(tmp_path, n=25)
    result = _op(chunk).execute(make_context())
    out_dir = tmp_path / "merged"
    summary = MergeResultsOperator(task_id="merge", batches=[result], output_dir=str(out_dir)).execute({})
    assert summary["rows"] == 25 and summary["succeeded"] == 25 and summary["unmatched_results"] == 0
    merged = pq.read_table(out_dir).to_pylist()
    assert [r["custom_id"] for r in merged] == [r["custom_id"] for r in _rows(25)]
    for row, line in zip(merged, lines):
        assert row["status"] == "succeeded"
        assert row["response"] == stand_in_label(line["body"]["messages"])
        assert row["finish_reason"] == "stop" and row["input_tokens"] > 0 and row["output_tokens"] == 1
        assert row["batch_id"] == result["batch_id"]
        assert row["price"] == float(row["custom_id"][2:])


def test_a_retry_does_not_regenerate_a_complete_chunk(engine, tmp_path):
    """Stand-in engine (no GPU/vllm here): the second execute loads no model and calls no engine."""
    chunk, _ = _classify_chunk(tmp_path, n=8)
    store = InMemoryTaskStateStore()
    first = _op(chunk).execute(make_context(store))
    output = first["state"]["output_file_id"]
    before = Path(output).read_bytes()
    second = _op(chunk).execute(make_context(store))
    assert len(engine.loads) == 1
    assert second["generation"]["reused"] is True
    assert second["state"] == first["state"] and second["batch_id"] == first["batch_id"]
    assert Path(output).read_bytes() == before
    meta = orjson.loads(Path(meta_path(output)).read_bytes())
    assert meta["fingerprint"] == chunk["fingerprint"] and meta["num_requests"] == 8


def test_an_incomplete_or_foreign_output_is_regenerated(engine, tmp_path):
    """Stand-in engine (no GPU/vllm here): a truncated output or another chunk's sidecar is not trusted."""
    chunk, _ = _classify_chunk(tmp_path, n=6)
    output = _op(chunk).execute(make_context())["state"]["output_file_id"]
    with open(output, "rb") as handle:
        lines = handle.readlines()
    with open(output, "wb") as handle:
        handle.writelines(lines[:3])  # what a half-copied file would look like
    _op(chunk).execute(make_context())
    assert len(engine.loads) == 2
    changed = {**chunk, "fingerprint": "0" * 64}
    _op(changed).execute(make_context())
    assert len(engine.loads) == 3
    _op(changed, overwrite=True).execute(make_context())
    assert len(engine.loads) == 4


@pytest.mark.parametrize(
    ("body", "expected", "structured"),
    [
        ({"temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": ["\n"]}, {"temperature": 0.2, "top_p": 0.9, "seed": 7,
          "stop": ["\n"], "max_tokens": None}, None),
        ({"max_tokens": 5}, {"max_tokens": 5}, None),
        ({"max_tokens": 5, "max_completion_tokens": 9}, {"max_tokens": 9}, None),
        ({"n": 1, "stop": "END"}, {"stop": "END", "max_tokens": None}, None),
        ({"presence_penalty": 0.5, "frequency_penalty": 0.1, "top_k": 20}, {"presence_penalty": 0.5,
          "frequency_penalty": 0.1, "top_k": 20, "max_tokens": None}, None),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}},
         {"max_tokens": None}, {"json": {"type": "object"}}),
        ({"response_format": {"type": "json_object"}}, {"max_tokens": None}, {"json_object": True}),
        ({"response_format": {"type": "text"}}, {"max_tokens": None}, None),
    ],
    ids=["sampling", "max_tokens", "max_completion_tokens_wins", "n_1_and_stop_string", "penalties_top_k",
         "json_schema", "json_object", "text_format"],
)  # fmt: skip
def test_request_params_map_to_sampling_params(body, expected, structured):
    full = {"model": "m", "messages": [{"role": "user", "content": "x"}], **body}
    kwargs, got_structured, ignored = sampling_kwargs(full)
    assert kwargs == {"n": 1, **expected}
    assert got_structured == structured
    assert ignored == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"n": 2}, "'n' must be 1"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool calling"),
        ({"max_tokens": 0}, "positive integer"),
        ({"response_format": {"type": "grammar"}}, "not supported"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "JSON Schema object"),
    ],
    ids=["n_2", "tools", "max_tokens_0", "unknown_format", "schema_missing"],
)
def test_unmappable_requests_are_rejected(body, message):
    with pytest.raises(RowRejected, match=message):
        sampling_kwargs({"model": "m", "messages": [], **body})


def test_unknown_body_keys_are_reported_as_ignored():
    _, _, ignored = sampling_kwargs({"model": "m", "messages": [], "logprobs": True, "metadata": {"a": 1}})
    assert ignored == ["logprobs", "metadata"]


def test_structured_output_uses_guided_decoding_and_bad_rows_become_error_lines(engine, tmp_path):
    """Stand-in engine (no GPU/vllm here): a schema goes through StructuredOutputsParams; a bad row fails alone."""
    rows = _rows(4)
    schema = {"type": "object", "properties": {"label": {"type": "string", "enum": LABELS}}, "required": ["label"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "label", "schema": schema, "strict": True}}
    lines = [chat_line(r["custom_id"], r["text"], model="m", response_format=fmt) for r in rows]
    lines[2]["body"]["n"] = 3  # vLLM offline answers one completion per request
    chunk = write_chunk(tmp_path, rows, lines=lines, model="m")
    result = _op(chunk).execute(make_context())

    _, params = engine.llm.chat_calls[0]  # type: ignore[union-attr]
    assert len(params) == 3
    from vllm.sampling_params import StructuredOutputsParams

    assert all(p.structured_outputs == StructuredOutputsParams(json=schema) for p in params)
    by_id = {o["custom_id"]: o for o in _output_lines(result)}
    bad = by_id["p-002"]["response"]
    assert bad["status_code"] == 400 and "'n' must be 1" in bad["body"]["error"]["message"]
    good = by_id["p-000"]["response"]["body"]["choices"][0]["message"]["content"]
    assert orjson.loads(good)["label"] in LABELS
    assert result["state"]["counts"] == {"total": 4, "completed": 3, "failed": 1}
    summary = MergeResultsOperator(
        task_id="merge", batches=[result], max_failure_ratio=None, output_dir=str(tmp_path / "o")
    ).execute({})
    assert summary["statuses"] == {"errored": 1, "succeeded": 3}


class LegacySamplingParams:
    """vLLM 0.10.x's ``SamplingParams`` keyword for structured output (``guided_decoding``); 0.33 has no such field."""

    def __init__(self, *, guided_decoding: Any = None, **kwargs: Any) -> None:
        from vllm.sampling_params import SamplingParams

        self.guided_decoding = guided_decoding
        self.real = SamplingParams(**kwargs)  # every other field still validated by vLLM
        self.max_tokens = self.real.max_tokens


def test_legacy_guided_decoding_and_no_structured_support(monkeypatch, tmp_path):
    """Stand-in model (no GPU here): vLLM 0.10.x takes ``guided_decoding``; without either, rows error."""
    from vllm.sampling_params import StructuredOutputsParams

    rows = _rows(2)
    fmt = {"type": "json_object"}
    lines = [chat_line(r["custom_id"], r["text"], model="m", response_format=fmt) for r in rows]
    chunk = write_chunk(tmp_path, rows, lines=lines, model="m")
    classes = real_classes()
    legacy_classes = VLLMClasses(
        sampling_params=LegacySamplingParams,
        structured_outputs=("guided_decoding", StructuredOutputsParams),
        client_errors=classes.client_errors,
    )
    legacy = StandInFactory(legacy_classes)
    monkeypatch.setattr(vllm_engine, "create_engine", legacy)
    _op(chunk).execute(make_context())
    _, params = legacy.llm.chat_calls[0]  # type: ignore[union-attr]
    assert params[0].guided_decoding == StructuredOutputsParams(json_object=True)

    bare = StandInFactory(VLLMClasses(sampling_params=classes.sampling_params, structured_outputs=None))
    monkeypatch.setattr(vllm_engine, "create_engine", bare)
    result = _op(chunk, overwrite=True).execute(make_context())
    assert bare.llm is not None and bare.llm.chat_calls == []
    assert all(
        "no structured-output support" in o["response"]["body"]["error"]["message"] for o in _output_lines(result)
    )


def test_embeddings_go_to_one_embed_call(engine, tmp_path):
    """Stand-in engine (no GPU/vllm here): ``/v1/embeddings`` chunks use ``llm.embed`` and merge as vectors."""
    rows = _rows(5)
    lines = [
        {
            "custom_id": r["custom_id"],
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "e5", "input": r["text"]},
        }
        for r in rows
    ]
    chunk = write_chunk(tmp_path, rows, lines=lines, endpoint="/v1/embeddings", model="e5")
    result = _op(chunk, engine_kwargs={"runner": "pooling"}).execute(make_context())
    assert engine.loads[0]["runner"] == "pooling"
    assert engine.llm is not None and engine.llm.embed_calls == [[r["text"] for r in rows]]
    body = _output_lines(result)[0]["response"]["body"]
    assert body["object"] == "list" and len(body["data"][0]["embedding"]) == 8
    MergeResultsOperator(task_id="merge", batches=[result], output_dir=str(tmp_path / "o")).execute({})
    merged = pq.read_table(tmp_path / "o").to_pylist()
    assert all(r["status"] == "succeeded" and len(r["response"]) == 8 for r in merged)


def test_without_vllm_the_task_fails_with_the_install_hint(monkeypatch, tmp_path):
    """The real factory, with ``vllm`` made unimportable: the error names the extra to install."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    chunk, _ = _classify_chunk(tmp_path, n=2)
    with pytest.raises(EngineUnavailableError) as excinfo:
        _op(chunk).execute(make_context())
    assert INSTALL_HINT in str(excinfo.value)
    assert "pip install 'airflow-batch-provider[vllm]'" in str(excinfo.value)
    assert isinstance(excinfo.value, BatchProviderError)
    assert not (tmp_path / "chunks" / "results" / "chunk-00000.output.jsonl").exists()


class _Recorded:
    """A class the fake ``vllm.sampling_params`` module offers; only its identity matters here."""


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, **sampling_module_attrs: Any) -> None:
    """Install a stand-in ``vllm`` package with vLLM's import layout (to test the loader's version detection)."""
    package = types.ModuleType("vllm")
    package.__version__ = "0.0-stand-in"  # type: ignore[attr-defined]
    package.LLM = lambda **kwargs: StandInLLM(engine_args=kwargs)  # type: ignore[attr-defined]
    module = types.ModuleType("vllm.sampling_params")
    module.SamplingParams = _Recorded  # type: ignore[attr-defined]
    for name, value in sampling_module_attrs.items():
        setattr(module, name, value)
    package.sampling_params = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", package)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", module)
    for name in ("vllm.exceptions", "vllm.v1.engine.exceptions", "vllm.distributed.parallel_state"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(
    ("attrs", "keyword"),
    [
        ({"StructuredOutputsParams": dict}, "structured_outputs"),
        ({"StructuredOutputsParams": dict, "GuidedDecodingParams": object}, "structured_outputs"),
        ({"GuidedDecodingParams": dict}, "guided_decoding"),
        ({}, None),
    ],
    ids=["current", "both_prefers_current", "legacy", "none"],
)
def test_factory_detects_the_structured_output_api(monkeypatch, attrs, keyword):
    """The real factory over a stand-in ``vllm`` package (no GPU here): it picks the class this version has."""
    _fake_vllm(monkeypatch, **attrs)
    engine = vllm_engine.create_engine(model="m", max_num_seqs=8)
    assert engine.llm.engine_args == {"model": "m", "max_num_seqs": 8}
    assert engine.classes.sampling_params is _Recorded and engine.version == "0.0-stand-in"
    assert (engine.classes.structured_outputs[0] if engine.classes.structured_outputs else None) == keyword
    # Without vllm.exceptions (0.10.x) request errors are ValueError/TypeError, and nothing is fatal.
    assert engine.classes.client_errors == (ValueError, TypeError) and engine.classes.fatal_errors == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"tensor_parallel_size": 1.5}, "tensor_parallel_size"),
        ({"max_model_len": -1}, "max_model_len"),
    ],
    ids=["util_over_1", "util_0", "seqs_0", "tp_float", "len_negative"],
)
def test_bad_engine_arguments_fail_at_parse_time(kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        _op({"label": "chunk 1/1"}, **kwargs)


def test_unsupported_endpoint_is_refused(engine, tmp_path):
    """Stand-in engine (no GPU/vllm here): /v1/responses chunks are refused before any model load."""
    rows = _rows(1)
    lines = [{"custom_id": "p-000", "method": "POST", "url": "/v1/responses", "body": {"model": "m", "input": "x"}}]
    chunk = write_chunk(tmp_path, rows, lines=lines, endpoint="/v1/responses", model="m")
    with pytest.raises(InvalidInputError, match="/v1/responses"):
        _op(chunk).execute(make_context())
    assert engine.loads == []


def test_gpu_memory_utilization_is_sent_only_when_set(engine, tmp_path):
    """Stand-in engine (no GPU here): an explicit value reaches vllm.LLM; unset, vLLM's default applies."""
    chunk, _ = _classify_chunk(tmp_path, n=2)
    _op(chunk, gpu_memory_utilization=0.5).execute(make_context())
    assert engine.loads[0]["gpu_memory_utilization"] == 0.5
    assert "gpu_memory_utilization" not in _op(chunk).engine_args("m")


def test_the_old_lowercase_name_is_a_deprecated_alias():
    import airflow_batch_provider.operators.vllm as module

    with pytest.warns(DeprecationWarning, match="import VLLMGenerateOperator"):
        from airflow_batch_provider.operators.vllm import vLLMGenerateOperator
    assert vLLMGenerateOperator is VLLMGenerateOperator
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


def test_without_vllm_the_task_fails_at_once_without_retries(monkeypatch):
    """No retry can install vLLM: EngineUnavailableError is an AirflowFailException (final)."""
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(EngineUnavailableError, match=r"pip install") as info:
        vllm_engine.load_classes()
    assert isinstance(info.value, AirflowFailException)


@pytest.mark.parametrize(("version", "refused"), [("0.10.2", True), ("0.11.0", True), ("0.11.1", False), ("x", False)])
def test_vllm_older_than_the_floor_is_refused(version, refused):
    """0.10.2-0.11.0 leave a refused batch's other requests queued (vLLM issue 26081): refused by name."""
    if refused:
        with pytest.raises(EngineUnavailableError, match=rf"vLLM {version} is installed.*26081"):
            vllm_engine.check_version(version)
    else:
        vllm_engine.check_version(version)


def test_mapped_tasks_run_on_the_gpu_queue_and_are_named_by_chunk():
    from airflow.sdk import DAG

    with DAG("t_vllm_partial", schedule=None, start_date=datetime(2026, 1, 1)):
        gpu = VLLMGenerateOperator.partial(task_id="gen").expand(chunk=[{"label": "chunk 1/1"}])
        other = VLLMGenerateOperator.partial(task_id="gen2", queue="gpu-a100").expand(chunk=[{"label": "c"}])
        server = ServerGenerateOperator.partial(task_id="srv").expand(chunk=[{"label": "c"}])
    assert gpu.queue == "gpu" and other.queue == "gpu-a100"
    assert server.queue != "gpu"
    for mapped in (gpu, server):
        assert mapped.partial_kwargs["map_index_template"] == "{{ task.chunk['label'] }}"
    assert _op({"label": "x"}).queue == "gpu"


@pytest.mark.parametrize("provider", ["vllm", "server"])
def test_self_hosted_providers_have_a_results_hook(provider, tmp_path):
    hook_class = hook_class_for(provider)
    hook = get_batch_hook(provider, "any_conn_id")
    assert hook.provider == provider and isinstance(hook, hook_class)
    with pytest.raises(BatchProviderError, match="no batch to submit"):
        hook.get_state(f"{provider}-x")
    with pytest.raises(BatchProviderError, match="no batch to submit"):
        hook.cancel(f"{provider}-x")
    assert issubclass(hook_class_for("vllm"), VLLMResultsHook)


@pytest.fixture(scope="module")
def airflow_db() -> None:
    """Migrate the test metadata DB (``dag.test()`` needs it)."""
    import os
    import subprocess

    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, env=os.environ.copy(), capture_output=True)


@pytest.mark.scenario
def test_example_dag_vllm_mode_end_to_end(airflow_db, engine, tmp_path, monkeypatch):
    """Stand-in engine (no GPU/vllm here): dags/self_hosted_vllm.py with mode=vllm, server branch skipped."""
    from airflow.dag_processing.dagbag import DagBag

    from tests.conftest import REPO_ROOT

    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["self_hosted_vllm"]
    assert dag.get_task("vllm_generate").queue == "gpu"
    out = tmp_path / "out"
    run = dag.test(run_conf={"mode": "vllm", "rows": 300, "data_dir": str(tmp_path / "data"), "output_dir": str(out)})
    assert run.state == "success"
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert states[("server_generate", -1)] == "skipped"
    assert states[("vllm_generate", 0)] == "success" and states[("merge", -1)] == "success"
    assert len(engine.loads) == 1 and engine.loads[0]["model"] == "Qwen/Qwen2.5-1.5B-Instruct"
    merged = pq.read_table(out).to_pylist()
    assert len(merged) == 300 and all(r["status"] == "succeeded" and r["response"] in LABELS for r in merged)
    assert {r["batch_id"][:5] for r in merged} == {"vllm-"}
