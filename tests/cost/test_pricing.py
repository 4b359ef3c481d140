"""Pricing table: list and batch prices, snapshot lookup, overrides from files and dicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from airflow_batch_provider import settings
from airflow_batch_provider.cost.pricing import PricingTable, default_pricing, load_pricing
from airflow_batch_provider.exceptions import InvalidInputError

PRICING_FILE_ENV = settings.env_var("pricing_file")  # AIRFLOW__LLM_BATCH__PRICING_FILE


@pytest.fixture(autouse=True)
def _no_env_pricing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRICING_FILE_ENV, raising=False)


# model, input tokens, output tokens, batch USD, real-time USD
PRICE_CASES = [
    pytest.param("gpt-4o-mini", 6_000_000, 250_000, 0.525, 1.05, id="gpt-4o-mini-brief-example"),
    pytest.param("gpt-4o", 1_000_000, 1_000_000, 6.25, 12.50, id="gpt-4o"),
    pytest.param("gpt-4.1", 2_000_000, 500_000, 4.00, 8.00, id="gpt-4.1"),
    pytest.param("gpt-4.1-mini", 1_000_000, 1_000_000, 1.00, 2.00, id="gpt-4.1-mini"),
    pytest.param("gpt-4.1-nano", 10_000_000, 0, 0.50, 1.00, id="gpt-4.1-nano-input-only"),
    pytest.param("o4-mini", 1_000_000, 1_000_000, 2.75, 5.50, id="o4-mini"),
    pytest.param("text-embedding-3-small", 50_000_000, 0, 0.50, 1.00, id="embedding-small"),
    pytest.param("text-embedding-3-large", 1_000_000, 0, 0.065, 0.13, id="embedding-large"),
    pytest.param("claude-haiku-4-5", 1_000_000, 200_000, 1.00, 2.00, id="claude-haiku-4-5"),
    pytest.param("claude-sonnet-4-6", 1_000_000, 1_000_000, 9.00, 18.00, id="claude-sonnet-4-6"),
    pytest.param("claude-opus-4-6", 100_000, 10_000, 0.375, 0.75, id="claude-opus-4-6"),
    pytest.param("claude-opus-4-1", 1_000_000, 1_000_000, 45.00, 90.00, id="claude-opus-4-1"),
    pytest.param("gpt-4o-mini", 0, 0, 0.0, 0.0, id="zero-tokens"),
]


@pytest.mark.parametrize(("model", "inp", "out", "batch", "realtime"), PRICE_CASES)
def test_prices(model: str, inp: int, out: int, batch: float, realtime: float) -> None:
    price = default_pricing().lookup(model)
    assert price.cost(inp, out, batch=True) == pytest.approx(batch)
    assert price.cost(inp, out, batch=False) == pytest.approx(realtime)


def test_every_default_has_the_50_percent_batch_discount_and_a_provider() -> None:
    table = default_pricing()
    for model in table.models():
        price = table.lookup(model)
        assert price.batch_input_per_mtok == pytest.approx(price.input_per_mtok / 2), model
        assert price.batch_output_per_mtok == pytest.approx(price.output_per_mtok / 2), model
        expected = "anthropic" if model.startswith("claude") else "openai"
        if model.startswith(("anthropic.", "amazon.")):  # Bedrock model ids
            expected = "bedrock"
        if model.startswith("gemini-"):
            expected = "gemini"
        assert price.provider == expected, model


@pytest.mark.parametrize(
    ("model", "resolved"),
    [
        pytest.param("gpt-4o-mini-2024-07-18", "gpt-4o-mini", id="openai-dated"),
        pytest.param("gpt-4o-2024-08-06", "gpt-4o", id="shorter-name-dated"),
        pytest.param("gpt-4.1-mini-2025-04-14", "gpt-4.1-mini", id="longest-prefix-wins"),
        pytest.param("o4-mini-2025-04-16", "o4-mini", id="o-series-dated"),
        pytest.param("claude-haiku-4-5-20251001", "claude-haiku-4-5", id="anthropic-dated"),
        pytest.param("claude-opus-4-1-20250805", "claude-opus-4-1", id="anthropic-opus-dated"),
        pytest.param("claude-sonnet-4-6-latest", "claude-sonnet-4-6", id="latest-alias"),
        pytest.param("gpt-4o-mini", "gpt-4o-mini", id="exact"),
    ],
)
def test_snapshot_lookup(model: str, resolved: str) -> None:
    assert default_pricing().lookup(model).model == resolved
    assert model in default_pricing()


@pytest.mark.parametrize(
    "model",
    [
        pytest.param("gpt-5.4-pro", id="pro-variant-costs-more"),
        pytest.param("o4-mini-deep-research", id="other-product"),
        pytest.param("gpt-4o-audio-preview", id="audio"),
        pytest.param("claude-sonnet-4-5", id="retired-model"),
        pytest.param("llama-3.1-8b", id="self-hosted"),
    ],
)
def test_other_suffixes_are_not_guessed(model: str) -> None:
    table = default_pricing()
    assert table.get(model) is None
    assert model not in table
    with pytest.raises(InvalidInputError) as err:
        table.lookup(model)
    message = str(err.value)
    assert repr(model) in message
    assert PRICING_FILE_ENV in message
    assert f'"{model}": {{"input"' in message
    assert "gpt-4o-mini" in message  # lists the known models


def test_override_file_from_env_adds_and_replaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "prices.json"
    file.write_bytes(
        orjson.dumps(
            {
                "as_of": "2026-12-01",
                "models": {
                    "my-finetune": {"provider": "openai", "input": 0.30, "output": 1.20},
                    "gpt-4o-mini": {"input": 0.10, "output": 0.40, "batch_input": 0.04, "batch_output": 0.16},
                },
            }
        )
    )
    monkeypatch.setenv(PRICING_FILE_ENV, str(file))
    table = load_pricing()
    tuned = table.lookup("my-finetune")
    assert (tuned.batch_input_per_mtok, tuned.batch_output_per_mtok) == pytest.approx((0.15, 0.60))
    mini = table.lookup("gpt-4o-mini-2024-07-18")
    assert (mini.input_per_mtok, mini.batch_input_per_mtok, mini.batch_output_per_mtok) == (0.10, 0.04, 0.16)
    assert table.lookup("gpt-4o").input_per_mtok == 2.50  # untouched defaults stay
    assert f"[llm_batch] pricing_file={file}" in table.sources
    assert load_pricing(use_settings=False).lookup("gpt-4o-mini").input_per_mtok == 0.15


def test_dict_override_wins_over_the_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "prices.json"
    file.write_bytes(orjson.dumps({"m": {"input": 1, "output": 2}}))
    monkeypatch.setenv(PRICING_FILE_ENV, str(file))
    table = load_pricing({"m": {"input": 3, "output": 4, "batch_discount": 0}})
    price = table.lookup("m")
    assert (price.input_per_mtok, price.batch_input_per_mtok, price.batch_output_per_mtok) == (3.0, 3.0, 4.0)
    assert price.provider == "other"


def test_yaml_file_and_file_level_discount(tmp_path: Path) -> None:
    file = tmp_path / "prices.yaml"
    file.write_text("batch_discount: 0.25\nmodels:\n  claude-custom:\n    input: 4\n    output: 8\n")
    price = load_pricing(file).lookup("claude-custom")
    assert (price.batch_input_per_mtok, price.batch_output_per_mtok) == (3.0, 6.0)
    assert price.provider == "anthropic"


def test_a_ready_table_is_used_as_is() -> None:
    table = PricingTable([])
    assert load_pricing(table) is table


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        pytest.param({"m": {"input": 1}}, "'output' of model 'm'", id="missing-output"),
        pytest.param({"m": {"input": "1", "output": 2}}, "'input' of model 'm'", id="string-price"),
        pytest.param({"m": {"input": -1, "output": 2}}, "'input' of model 'm'", id="negative"),
        pytest.param({"m": {"input": True, "output": 2}}, "'input' of model 'm'", id="bool"),
        pytest.param({"m": {"input": 1, "output": 2, "batch_discount": 1.5}}, "batch_discount", id="discount>1"),
        pytest.param({"m": 3}, "each entry must be", id="not-a-mapping"),
        pytest.param({"models": [1, 2]}, "must map model names", id="models-not-a-mapping"),
    ],
)
def test_malformed_overrides_are_rejected(entries: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidInputError, match="Pricing from dict") as err:
        load_pricing(entries)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        pytest.param("missing.json", None, "Cannot read the pricing file", id="missing"),
        pytest.param("bad.json", b"{not json", "is not valid", id="bad-json"),
        pytest.param("list.json", b"[1, 2]", "must hold a mapping", id="not-a-mapping"),
        pytest.param("bad.yaml", b"a: [1,\n", "is not valid .yaml", id="bad-yaml"),
    ],
)
def test_bad_pricing_files_are_named(tmp_path: Path, name: str, content: bytes | None, fragment: str) -> None:
    file = tmp_path / name
    if content is not None:
        file.write_bytes(content)
    with pytest.raises(InvalidInputError, match=fragment) as err:
        load_pricing(file)
    assert str(file) in str(err.value)
