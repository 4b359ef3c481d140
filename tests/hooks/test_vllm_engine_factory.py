"""``[llm_batch] vllm_engine_factory``: a worker selects another engine build by setting, not by code."""

from __future__ import annotations

import pytest

from airflow_batch_provider import settings
from airflow_batch_provider.hooks import vllm_engine
from airflow_batch_provider.hooks.vllm_engine import EngineUnavailableError

ENGINE_FACTORY_ENV = settings.env_var("vllm_engine_factory")


@pytest.mark.vllm_classes
def test_the_configured_factory_builds_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENGINE_FACTORY_ENV, "tests.distributed.stand_in_vllm.create_engine")
    engine = vllm_engine.create_engine(model="m", tensor_parallel_size=1)
    assert engine.version.endswith("(stand-in)")
    assert engine.llm.engine_args == {"model": "m", "tensor_parallel_size": 1}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tests.distributed.no_such_module.create_engine", "cannot be imported on this worker"),
        ("tests.distributed.stand_in_vllm.no_such_function", "cannot be imported on this worker"),
        ("tests.distributed.stand_in_vllm.dataclasses", "must name a callable"),
    ],
)
def test_a_bad_factory_setting_is_named(monkeypatch: pytest.MonkeyPatch, value: str, message: str) -> None:
    monkeypatch.setenv(ENGINE_FACTORY_ENV, value)
    with pytest.raises(EngineUnavailableError, match=rf"\[llm_batch\] vllm_engine_factory=.*{message}"):
        vllm_engine.create_engine(model="m")
