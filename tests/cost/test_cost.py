"""Cost: estimates from chunk files, actual usage, the budget guard, the comparison line and the CLI."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider import settings
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.cost.__main__ import main
from airflow_batch_provider.cost.advisor import duration, plan_workload, realtime_minutes, recommend
from airflow_batch_provider.cost.estimate import (
    CostEstimate,
    JobEstimate,
    UsageTally,
    check_budget,
    estimate_chunks_cost,
    estimate_cost,
    parse_max_cost_usd,
    price_usage,
    usd,
)
from airflow_batch_provider.cost.run_summary import comparison_line, cost_rows, cost_summary
from airflow_batch_provider.cost.tokens import count_request_tokens
from airflow_batch_provider.exceptions import CostLimitExceededError, InvalidInputError
from tests.chunking.reference import render

PRICING_FILE_ENV = settings.env_var("pricing_file")

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_env_pricing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRICING_FILE_ENV, raising=False)


def _estimate(
    batch: float | None = 0.525,
    realtime: float | None = 1.05,
    model: str = "gpt-4o-mini",
    output_tokens: int = 250_000,
    output_basis: str = "max_tokens",
) -> CostEstimate:
    return CostEstimate(
        model=model,
        requests=50_000,
        input_tokens=6_000_000,
        output_tokens=output_tokens,
        batch_usd=batch,
        realtime_usd=realtime,
        provider="openai",
        method="tiktoken o200k_base",
        output_basis=output_basis,
    )


def _job(bound: float | None = 0.525, expected: float | None = 0.47, model: str = "gpt-4o-mini") -> JobEstimate:
    """50,000 requests: 250,000 output tokens at max_tokens=5, 50,000 expected from the schema."""
    return JobEstimate(
        upper_bound=_estimate(bound, None if bound is None else bound * 2, model),
        expected=_estimate(
            expected, None if expected is None else expected * 2, model, 50_000, "response schema, ~1 tokens/answer"
        ),
    )


@pytest.mark.parametrize(
    ("model", "inp", "out", "batch", "realtime"),
    [
        pytest.param("gpt-4o-mini", 6_000_000, 250_000, 0.525, 1.05, id="brief-example"),
        pytest.param("gpt-4o-mini-2024-07-18", 1_000_000, 0, 0.075, 0.15, id="dated-snapshot"),
        pytest.param("claude-haiku-4-5-20251001", 2_000_000, 100_000, 1.25, 2.50, id="claude-dated"),
        pytest.param("text-embedding-3-small", 10_000_000, 0, 0.10, 0.20, id="embeddings"),
    ],
)
def test_price_usage(model: str, inp: int, out: int, batch: float, realtime: float) -> None:
    est = price_usage(model, inp, out, requests=10)
    assert (est.batch_usd, est.realtime_usd) == (pytest.approx(batch), pytest.approx(realtime))
    assert est.saving_usd == pytest.approx(realtime - batch)
    assert est.priced
    assert est.to_dict()["saving_usd"] == pytest.approx(realtime - batch)


def test_unknown_model_is_unpriced_unless_a_price_is_required() -> None:
    est = price_usage("llama-3.1-8b", 1000, 10, require_price=False)
    assert (est.batch_usd, est.realtime_usd, est.saving_usd, est.priced) == (None, None, None, False)
    assert "no price known for llama-3.1-8b" in est.describe()
    assert comparison_line(est) == "batch vs real-time: no price known for llama-3.1-8b"
    with pytest.raises(InvalidInputError, match=r"No price is known for model 'llama-3\.1-8b'"):
        price_usage("llama-3.1-8b", 1000, 10)


def test_price_override_dict_reaches_the_estimate() -> None:
    est = estimate_cost(
        ["abcd"] * 1000, "my-model", expected_output_tokens=1, pricing={"my-model": {"input": 1000, "output": 0}}
    ).expected
    assert est.batch_usd == pytest.approx(1000 * 1 * 1000 / 2 / 1_000_000)


def test_estimate_from_request_dicts() -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 5}
    est = estimate_cost([body] * 1000, "gpt-4o-mini", exact=False).upper_bound
    # 100 tokens of text + 4 per message + 3 priming, and max_tokens out.
    assert (est.requests, est.input_tokens, est.output_tokens) == (1000, 107_000, 5_000)
    assert est.batch_usd == pytest.approx((107_000 * 0.075 + 5_000 * 0.30) / 1_000_000)
    assert est.method == "approximation chars/4"


def _chunks(tmp_path: Path, spec: RequestSpec, rows: int = 120, chunk_size: int = 50) -> list[dict[str, Any]]:
    """Write chunk files as the chunk step does (the package's renderer, one JSONL file per chunk)."""
    renderer = renderer_for(spec)
    chunks = []
    for index, start in enumerate(range(0, rows, chunk_size)):
        ids = range(start, min(rows, start + chunk_size))
        path = tmp_path / f"chunk-{index:05d}.jsonl"
        path.write_bytes(
            b"".join(render(renderer, f"p{i}", f"Classify: Product number {i} " * (1 + i % 5)) + b"\n" for i in ids)
        )
        chunks.append(
            {"chunk_index": index, "provider": spec.provider, "model": spec.model, "requests_path": str(path)}
        )
    return chunks


def test_estimate_chunk_files(tmp_path: Path) -> None:
    spec = RequestSpec(provider="openai", model="gpt-4o-mini", system_prompt="Be brief.", params={"max_tokens": 5})
    chunks = _chunks(tmp_path, spec)
    assert len(chunks) == 3
    job = estimate_chunks_cost(chunks, exact=False)
    est = job.upper_bound
    lines = [line for c in chunks for line in Path(c["requests_path"]).read_bytes().splitlines()]
    tally = count_request_tokens(lines, "gpt-4o-mini", exact=False)
    assert (est.requests, est.input_tokens, est.output_tokens) == (120, tally.input_tokens, 600)
    assert est.batch_usd == pytest.approx((tally.input_tokens * 0.075 + 600 * 0.30) / 1_000_000)
    assert est.output_basis == "max_tokens"
    # No schema, nothing given: the expectation is the bound, and says so.
    assert (job.expected.output_tokens, job.expected.batch_usd) == (est.output_tokens, est.batch_usd)
    assert job.expected.output_basis.startswith("= upper bound: no response schema")
    with_expectation = estimate_chunks_cost(chunks, exact=False, expected_output_tokens=1)
    assert (with_expectation.expected.output_tokens, with_expectation.upper_bound.output_tokens) == (120, 600)


def test_estimate_anthropic_chunks(tmp_path: Path) -> None:
    spec = RequestSpec(provider="anthropic", model="claude-haiku-4-5", params={"max_tokens": 16})
    est = estimate_chunks_cost(_chunks(tmp_path, spec, rows=10, chunk_size=10)).upper_bound
    assert est.provider == "anthropic"
    assert est.method == "approximation chars/3.5"
    assert est.output_tokens == 160


def test_estimate_of_no_chunks_is_an_error() -> None:
    with pytest.raises(InvalidInputError, match="no chunks"):
        estimate_chunks_cost([])


def test_budget_guard_passes_under_the_limit_and_without_one() -> None:
    check_budget(_job(), 0.53)
    check_budget(_job(), "0.53")  # a rendered Param is a string
    check_budget(_job(), None)
    check_budget(_job(bound=None, expected=None), None)
    check_budget(_job(), 0.5, basis="expected")  # 0.47 expected, 0.525 at most


def test_budget_guard_message_states_estimate_limit_and_what_to_do() -> None:
    with pytest.raises(CostLimitExceededError) as err:
        check_budget(_job(), 0.0001)
    message = str(err.value)
    assert message.startswith("Batch cost $0.5250 (upper bound) exceeds max_cost_usd=$0.0001:")
    assert "50,000 requests to gpt-4o-mini: 6,000,000 input tokens (tiktoken o200k_base)" in message
    assert "expected $0.4700 batch / $0.9400 real-time with 50,000 output tokens (response schema" in message
    assert "upper bound $0.5250 batch / $1.05 real-time with 250,000 output tokens (max_tokens)" in message
    assert "Nothing was uploaded" in message
    assert "max_cost_basis" not in message  # the expected cost is over the limit too: no point suggesting it
    assert "raise max_cost_usd to at least $0.5250" in message
    assert "cheaper model" in message
    assert isinstance(err.value, InvalidInputError)
    assert (err.value.estimate_usd, err.value.limit_usd) == (0.525, 0.0001)
    assert err.value.estimate["upper_bound"]["input_tokens"] == 6_000_000


def test_budget_guard_on_the_bound_points_at_the_expected_cost_when_that_fits() -> None:
    """A limit set from last night's bill sits between the two figures: the message says how to use it."""
    with pytest.raises(
        CostLimitExceededError, match=r"guard on the expected cost \(\$0\.4700\) instead: max_cost_basis='expected'"
    ):
        check_budget(_job(), 0.5)
    with pytest.raises(
        CostLimitExceededError, match=r"^Batch cost \$0\.4700 \(expected\) exceeds max_cost_usd=\$0\.4000"
    ):
        check_budget(_job(), 0.4, basis="expected")


def test_unknown_budget_basis_is_rejected() -> None:
    with pytest.raises(InvalidInputError, match="max_cost_basis must be one of"):
        check_budget(_job(), None, basis="actual")


def test_budget_guard_needs_a_price() -> None:
    with pytest.raises(InvalidInputError, match="no price is known for llama") as err:
        check_budget(_job(bound=None, expected=None, model="llama"), 5)
    assert not isinstance(err.value, CostLimitExceededError)


@pytest.mark.parametrize("bad", [0, -1, "abc", True, math.nan, math.inf], ids=str)
def test_bad_limits_are_rejected(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="max_cost_usd must be a positive number"):
        parse_max_cost_usd(bad)


def test_comparison_line_and_summary_rows() -> None:
    actual = _estimate()
    line = comparison_line(actual)
    assert line == (
        "batch vs real-time: $0.5250 with the batch API vs $1.05 in real time for the same 50,000 requests "
        "to gpt-4o-mini (saved $0.5250, 50%)"
    )
    summary = cost_summary(actual, upper_bound=0.6, expected=0.55)
    assert (summary["cost_upper_bound_usd"], summary["cost_expected_usd"]) == (0.6, 0.55)
    assert (summary["actual_cost_usd"], summary["realtime_cost_usd"]) == (0.525, 1.05)
    assert summary["saved_usd"] == pytest.approx(0.525)
    assert summary["cost_comparison"] == line
    assert cost_rows(summary) == [
        ("expected cost", "$0.5500 (before submission)"),
        ("cost upper bound", "$0.6000 (every answer at max_tokens)"),
        ("actual cost", "$0.5250 (usage the provider reported)"),
        ("real-time cost", "$1.05"),
        ("batch vs real-time", line.removeprefix("batch vs real-time: ")),
    ]
    assert cost_rows({"rows": 1}) == []
    assert cost_summary(actual, upper_bound=0.7)["cost_upper_bound_usd"] == 0.7
    assert cost_summary(actual)["cost_expected_usd"] is None


@pytest.mark.parametrize(
    ("value", "text"),
    [(1234.5, "$1,234.50"), (1, "$1.00"), (0.525, "$0.5250"), (0.00001234, "$0.000012"), (None, "n/a")],
    ids=["thousands", "one", "cents", "tiny", "none"],
)
def test_usd_format(value: float | None, text: str) -> None:
    assert usd(value) == text


def test_usage_tally_prices_each_model_and_adds_up() -> None:
    tally = UsageTally()
    tally.add("gpt-4o-mini", 1_000_000, 100_000, 10)
    tally.add("gpt-4o-mini-2024-07-18", 1_000_000, 0, 5)
    tally.add("gpt-4o", 1_000_000, 0, 1)
    est = tally.cost()
    assert est.requests == 16
    assert est.model == "gpt-4o-mini, gpt-4o-mini-2024-07-18, gpt-4o"
    assert est.batch_usd == pytest.approx(0.075 + 0.03 + 0.075 + 1.25)
    assert est.realtime_usd == pytest.approx(2 * est.batch_usd)
    tally.add("llama", 1, 1)
    assert tally.cost().batch_usd is None


@pytest.mark.parametrize(
    ("per_day", "latency", "choice", "fragment"),
    [
        pytest.param(50_000, False, "batch", "≥ 10,000", id="bulk-async"),
        pytest.param(10_000, False, "batch", "≥ 10,000", id="at-threshold"),
        pytest.param(2_000, False, "batch", "real time is acceptable", id="small-async"),
        pytest.param(1_000_000, True, "real-time", "up to 24 h", id="latency-sensitive"),
    ],
)
def test_decision_matrix(per_day: int, latency: bool, choice: str, fragment: str) -> None:
    rec = recommend(per_day, latency_sensitive=latency, saving_usd=1.0)
    assert rec.choice == choice
    assert fragment in rec.reason


def test_realtime_duration_is_rate_limit_bound() -> None:
    assert realtime_minutes(50_000, 125, 200_000) == pytest.approx(31.25)
    assert realtime_minutes(50_000, 125, 200_000, requests_per_minute=500) == 100
    assert [duration(m) for m in (0.5, 31.25, 150)] == ["30 s", "31 min", "2.5 h"]
    plan = plan_workload(1_000_000, 1_000, 100, "gpt-4o-mini", tokens_per_minute=500)
    assert "longer than the 24 h batch window" in plan.recommendation.reason


def test_plan_rejects_bad_numbers() -> None:
    with pytest.raises(InvalidInputError, match="rows must be an integer ≥ 1"):
        plan_workload(0, 10, 1, "gpt-4o-mini")


def test_cli_prints_costs_window_and_recommendation() -> None:
    # As a user runs it: no price overrides, and not Airflow's unit-test mode (which logs to stdout).
    env = {k: v for k, v in os.environ.items() if k not in (PRICING_FILE_ENV, "AIRFLOW__CORE__UNIT_TEST_MODE")}
    args = ["--rows", "50000", "--prompt-tokens", "120", "--output-tokens", "5", "--model", "gpt-4o-mini"]
    done = subprocess.run(
        [sys.executable, "-m", "airflow_batch_provider.cost", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    out = out[next(i for i, line in enumerate(out) if line.startswith("Workload:")) :]
    assert out[0] == "Workload: 50,000 requests x (120 prompt + 5 output tokens) on gpt-4o-mini (openai)"
    assert out[1].split() == ["tokens", "6,000,000", "input", "+", "250,000", "output"]
    assert out[2].split()[:4] == ["costs", "are", "expected", "at"] and "for an upper bound" in out[2]
    assert out[3].split()[:3] == ["batch", "API", "$0.5250"] and "up to 24 h" in out[3]
    assert out[4].split()[:3] == ["real-time", "API", "$1.05"] and "≈ 31 min at 200,000 tokens/min" in out[4]
    assert "saving         $0.5250 per run (50%) with batch" in done.stdout
    assert "5 request file(s) of up to 10,000 requests" in done.stdout
    assert out[-1].startswith("Recommendation: BATCH: async work at 50,000 requests/day")


def test_cli_latency_sensitive_and_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = ["--rows", "500", "--prompt-tokens", "800", "--output-tokens", "300"]
    assert main([*base, "--model", "claude-haiku-4-5", "--latency-sensitive", "--rpm", "50"]) == 0
    out = capsys.readouterr().out
    assert "Recommendation: REAL-TIME" in out
    assert "≈ 10 min at 200,000 tokens/min, 50 requests/min" in out
    assert main([*base, "--model", "no-such-model"]) == 2
    assert "No price is known for model 'no-such-model'" in capsys.readouterr().err
    prices = tmp_path / "p.json"
    prices.write_text('{"no-such-model": {"input": 1, "output": 1}}')
    assert main([*base, "--model", "no-such-model", "--pricing-file", str(prices)]) == 0
    assert "$0.2750" in capsys.readouterr().out  # 500 x 1,100 tokens at $0.50 / 1M
