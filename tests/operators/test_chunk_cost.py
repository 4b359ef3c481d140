"""ChunkOperator's cost estimate and max_cost_usd guard (issue 8): stop before anything is uploaded."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.exceptions import CostLimitExceededError, InvalidInputError
from airflow_batch_provider.operators.chunk import ChunkOperator
from tests.support import make_context


def _table(tmp_path, rows: int = 200):
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"id": [f"r{i}" for i in range(rows)], "text": [f"product number {i}" for i in range(rows)]}), path
    )
    return str(path)


def _op(tmp_path, **kwargs) -> ChunkOperator:
    return ChunkOperator(
        task_id="chunk",
        source=_table(tmp_path),
        job_dir=str(tmp_path / "job"),
        prompt_template="Classify: {text}",
        model="gpt-4o-mini",
        id_column="id",
        request_params={"max_tokens": 10},
        **kwargs,
    )


def test_descriptors_carry_the_estimate(tmp_path):
    descriptors = _op(tmp_path, chunk_size=100).execute(make_context())
    assert len(descriptors) == 2
    assert all(d["estimated_cost_usd"] > 0 and d["estimated_input_tokens"] > 0 for d in descriptors)


def test_guard_fails_with_the_estimate_in_the_message(tmp_path):
    with pytest.raises(CostLimitExceededError) as info:
        _op(tmp_path, max_cost_usd=0.000001).execute(make_context())
    message = str(info.value)
    assert "Estimated batch cost $" in message and "max_cost_usd" in message and "Nothing was uploaded" in message


def test_guard_passes_under_the_limit(tmp_path):
    assert _op(tmp_path, max_cost_usd=100).execute(make_context())


@pytest.mark.parametrize("bad", [-1, 0, "abc", True], ids=["negative", "zero", "text", "bool"])
def test_bad_limit_is_rejected_at_construction(tmp_path, bad):
    with pytest.raises(InvalidInputError, match="max_cost_usd"):
        _op(tmp_path, max_cost_usd=bad)


def test_templated_limit_is_accepted_at_construction(tmp_path):
    assert _op(tmp_path, max_cost_usd="{{ params.max_cost_usd }}").max_cost_usd == "{{ params.max_cost_usd }}"
