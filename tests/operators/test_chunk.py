"""ChunkOperator: argument checks at DAG parse time and execute() with a plain context."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk import DAG

from airflow_batch_provider.exceptions import ChunkLimitError, InvalidInputError
from airflow_batch_provider.job_folder import run_folder_name, sanitise_path_part
from airflow_batch_provider.operators.chunk import ChunkOperator

PROMPT = "Classify this product: {title}\nAnswer with {{one}} label."


def _table(tmp_path: Path, n: int = 30) -> str:
    path = tmp_path / "products.parquet"
    pq.write_table(
        pa.table({"product_id": [f"p{i}" for i in range(n)], "title": [f"Product {i}" for i in range(n)]}), path
    )
    return str(path)


def _operator(**kwargs: Any) -> ChunkOperator:
    arguments: dict[str, Any] = {
        "task_id": "chunk",
        "source": "/nowhere.parquet",
        "prompt_template": PROMPT,
        "model": "gpt-4o-mini",
        **kwargs,
    }
    with DAG(dag_id="product_tags", schedule=None):
        return ChunkOperator(**arguments)


def test_execute_writes_chunks_and_returns_descriptors(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    op = _operator(
        source=_table(tmp_path),
        job_dir=str(job_dir),
        id_column="product_id",
        system_prompt="Be brief.",
        request_params={"max_tokens": 5},
        chunk_size=12,
    )
    descriptors = op.execute({})  # type: ignore[arg-type]
    assert [d["num_requests"] for d in descriptors] == [12, 12, 6]
    assert [d["label"] for d in descriptors] == ["chunk 1/3 (12 req)", "chunk 2/3 (12 req)", "chunk 3/3 (6 req)"]
    assert orjson.loads(orjson.dumps(descriptors)) == descriptors
    first = orjson.loads(Path(descriptors[0]["requests_path"]).read_bytes().splitlines()[0])
    assert first["custom_id"] == "p0"
    assert first["body"] == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Classify this product: Product 0\nAnswer with {one} label."},
        ],
        "max_tokens": 5,
    }
    assert Path(descriptors[0]["requests_path"]).parent == job_dir / "chunks"


def test_default_job_dir_comes_from_the_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "work"))
    op = _operator(source=_table(tmp_path, 3), provider="anthropic", request_params={"max_tokens": 10})
    context = {"run_id": "manual__2026-01-01T00:00:00+00:00", "ti": SimpleNamespace(map_index=-1)}
    descriptors = op.execute(context)  # type: ignore[arg-type]
    run_dir = f"manual__2026-01-01T00_00_00_00_00-{run_folder_name('manual__2026-01-01T00:00:00+00:00')[-8:]}"
    expected = tmp_path / "work" / "product_tags" / run_dir / "chunk"
    assert descriptors[0]["job_dir"] == str(expected)
    assert descriptors[0]["endpoint"] == "/v1/messages"
    mapped = op.resolve_job_dir({"run_id": "r", "ti": SimpleNamespace(map_index=4)})  # type: ignore[arg-type]
    assert mapped == str(tmp_path / "work" / "product_tags" / run_folder_name("r") / "chunk-4")


def test_default_work_dir_falls_back_to_airflow_home(monkeypatch: pytest.MonkeyPatch) -> None:
    # [llm_batch] work_dir's declared default, {AIRFLOW_HOME}/batch_jobs (tests/conftest.py sets AIRFLOW_HOME).
    monkeypatch.delenv("AIRFLOW__LLM_BATCH__WORK_DIR", raising=False)
    op = _operator()
    job_dir = op.resolve_job_dir({"dag_run": SimpleNamespace(run_id="scheduled__x")})  # type: ignore[arg-type]
    home = Path(os.environ["AIRFLOW_HOME"])
    assert job_dir == str(home / "batch_jobs" / "product_tags" / run_folder_name("scheduled__x") / "chunk")


def test_bad_input_fails_in_execute_and_leaves_nothing(tmp_path: Path) -> None:
    source = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"product_id": ["a", "a"], "title": ["x", "y"]}), source)
    op = _operator(source=str(source), job_dir=str(tmp_path / "job"), id_column="product_id")
    with pytest.raises(InvalidInputError, match="id 'a' at rows 0 and 1"):
        op.execute({})  # type: ignore[arg-type]
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        pytest.param({"chunk_size": 0}, "chunk_size must be an integer from 1 to 50,000", id="chunk-size-zero"),
        pytest.param({"chunk_size": 60_000}, "got 60000", id="chunk-size-over-openai"),
        pytest.param({"byte_cap": 0}, "byte_cap", id="byte-cap-zero"),
        pytest.param({"provider": "mistral"}, "Unknown provider 'mistral'", id="unknown-provider"),
        pytest.param({"endpoint": "/v1/responses"}, "accepted: /v1/chat/completions", id="unsupported-endpoint"),
        pytest.param({"provider": "anthropic"}, "max_tokens", id="anthropic-without-max-tokens"),
        pytest.param(
            {"endpoint": "/v1/embeddings", "system_prompt": "x"}, "takes no system prompt", id="embeddings-system"
        ),
        pytest.param({"prompt_template": "{0}"}, "positional field", id="positional-template"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidInputError, match=fragment):
        _operator(**kwargs)


def test_template_fields_exclude_the_prompt_template() -> None:
    op = _operator(model="{{ params.model }}", system_prompt="{{ params.system }}")
    assert set(op.template_fields) == {
        "source", "job_dir", "model", "provider", "system_prompt", "id_column", "max_cost_usd", "previous_output",
        "chunk_size", "conn_id",
    }  # fmt: skip
    assert "prompt_template" not in op.template_fields
    assert op.prompt_template == PROMPT


def test_a_templated_chunk_size_is_checked_once_rendered(tmp_path: Path) -> None:
    op = _operator(chunk_size="{{ params.chunk_size }}")  # no parse-time check of a template
    op.chunk_size = "80000"  # what rendering gives: text, over OpenAI's 50,000
    with pytest.raises(InvalidInputError, match=r"80,?000"):
        op._spec("gpt-4o-mini", None)
    op = _operator(source=_table(tmp_path, 30), job_dir=str(tmp_path / "job"), id_column="product_id")
    op.chunk_size = "12"
    assert [d["num_requests"] for d in op.execute({})] == [12, 12, 6]  # type: ignore[arg-type]
    op.chunk_size = "a dozen"
    with pytest.raises(InvalidInputError, match="whole number"):
        op.execute({})  # type: ignore[arg-type]


def test_run_ids_that_clean_to_one_name_get_their_own_job_folders(tmp_path, monkeypatch) -> None:
    """``a:b``, ``a+b``, ``a~b``, ``a/b`` and ``a_b`` are five runs: five folders, each still readable."""
    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path))
    op = _operator()
    run_ids = ["a:b", "a+b", "a~b", "a/b", "a_b"]
    folders = [op.resolve_job_dir({"run_id": r, "ti": SimpleNamespace(map_index=-1)}) for r in run_ids]  # type: ignore[arg-type]
    assert len(set(folders)) == 5
    for folder in folders:
        name = Path(folder).parent.name
        assert re.fullmatch(r"a_b-[0-9a-f]{8}", name), name
        assert Path(folder).parent.parent == tmp_path / "product_tags"
    assert run_folder_name("a:b") == run_folder_name("a:b")  # the same run (a retry) finds its folder again


def test_sanitise_path_part() -> None:
    assert sanitise_path_part("manual__2026-01-01T00:00:00+00:00") == "manual__2026-01-01T00_00_00_00_00"
    assert sanitise_path_part("../..") == "_"
    assert sanitise_path_part("a b/c") == "a_b_c"


def test_templated_provider_is_checked_once_rendered(tmp_path) -> None:
    """A provider chosen by a Param ("{{ params.provider }}") is validated at execute, not parse time."""
    op = _operator(provider="{{ params.provider }}", chunk_size=80_000)  # too big for OpenAI, fine for Anthropic
    op.provider = "openai"  # what rendering "{{ params.provider }}" would give
    with pytest.raises(InvalidInputError, match=r"80,?000"):
        op._spec("gpt-4o-mini", None)


def test_a_literal_model_that_cannot_serve_the_endpoint_fails_at_parse_time() -> None:
    with pytest.raises(InvalidInputError, match="embedding model"):
        _operator(model="text-embedding-3-small")  # on the default /v1/chat/completions
    templated = _operator(model="{{ params.model }}")  # checked once rendered
    assert templated.model == "{{ params.model }}"


def test_more_chunks_than_max_map_length_fail_before_anything_is_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow maps at most [core] max_map_length items: 30 rows in chunks of 10 need a limit of 3."""
    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "2")
    op = _operator(source=_table(tmp_path, 30), job_dir=str(tmp_path / "job"), id_column="product_id", chunk_size=10)
    with pytest.raises(ChunkLimitError) as info:
        op.execute({})  # type: ignore[arg-type]
    message = str(info.value)
    assert "3 chunks of up to 10 requests" in message
    assert "max_map_length = 2" in message
    assert "AIRFLOW__CORE__MAX_MAP_LENGTH to at least 3" in message
    assert "increase chunk_size to at least 15" in message
    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "3")
    assert len(op.execute({})) == 3  # type: ignore[arg-type]
