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


def _op(tmp_path, request_params=None, **kwargs) -> ChunkOperator:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return ChunkOperator(
        task_id="chunk",
        source=_table(tmp_path),
        job_dir=str(tmp_path / "job"),
        prompt_template="Classify: {text}",
        model="gpt-4o-mini",
        id_column="id",
        request_params=request_params or {"max_tokens": 10},
        **kwargs,
    )


def test_descriptors_carry_the_estimate(tmp_path):
    descriptors = _op(tmp_path, chunk_size=100).execute(make_context())
    assert len(descriptors) == 2
    assert all(d["cost_upper_bound_usd"] > 0 and d["estimated_input_tokens"] > 0 for d in descriptors)
    # No response schema and no expected_output_tokens: nothing better than the bound to expect.
    assert all(d["cost_expected_usd"] == d["cost_upper_bound_usd"] for d in descriptors)


def test_guard_fails_with_the_estimate_in_the_message(tmp_path):
    with pytest.raises(CostLimitExceededError) as info:
        _op(tmp_path, max_cost_usd=0.000001).execute(make_context())
    message = str(info.value)
    assert "Batch cost $" in message and "(upper bound)" in message and "Nothing was uploaded" in message


def test_guard_passes_under_the_limit(tmp_path):
    assert _op(tmp_path, max_cost_usd=100).execute(make_context())


@pytest.mark.parametrize("bad", [-1, 0, "abc", True], ids=["negative", "zero", "text", "bool"])
def test_bad_limit_is_rejected_at_construction(tmp_path, bad):
    with pytest.raises(InvalidInputError, match="max_cost_usd"):
        _op(tmp_path, max_cost_usd=bad)


def test_templated_limit_is_accepted_at_construction(tmp_path):
    assert _op(tmp_path, max_cost_usd="{{ params.max_cost_usd }}").max_cost_usd == "{{ params.max_cost_usd }}"


LABELS_SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["electronics", "clothing", "home"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["label", "confidence"],
    "additionalProperties": False,
}


def test_a_response_schema_makes_the_expectation_far_below_the_bound(tmp_path):
    """max_tokens=64 caps a '{"label": ..., "confidence": ...}' answer that takes ~15 tokens."""
    op = _op(tmp_path, chunk_size=100, response_schema=LABELS_SCHEMA, request_params={"max_tokens": 64})
    descriptors = op.execute(make_context())
    for d in descriptors:
        assert d["cost_expected_usd"] < d["cost_upper_bound_usd"] * 0.75


@pytest.mark.parametrize(("basis", "fails"), [("upper_bound", True), ("expected", False)])
def test_the_guard_compares_the_figure_the_user_chose(tmp_path, basis, fails):
    """A limit between the expected cost and the upper bound: only the upper-bound guard trips."""
    probe = _op(tmp_path / "probe", response_schema=LABELS_SCHEMA, request_params={"max_tokens": 64})
    descriptors = probe.execute(make_context())
    expected = sum(d["cost_expected_usd"] for d in descriptors)
    bound = sum(d["cost_upper_bound_usd"] for d in descriptors)
    limit = (expected + bound) / 2
    op = _op(
        tmp_path / "run",
        response_schema=LABELS_SCHEMA,
        request_params={"max_tokens": 64},
        max_cost_usd=limit,
        max_cost_basis=basis,
    )
    if fails:
        with pytest.raises(CostLimitExceededError, match="max_cost_basis='expected'") as info:
            op.execute(make_context())
        assert "(upper bound)" in str(info.value)
    else:
        assert op.execute(make_context())


def test_an_unknown_cost_basis_is_rejected_at_construction(tmp_path):
    with pytest.raises(InvalidInputError, match="max_cost_basis must be one of 'upper_bound', 'expected'"):
        _op(tmp_path, max_cost_basis="actual")
