"""The azure backend as the pipeline sees it: registered, its limits, endpoint, lines, prices and connection type."""

from __future__ import annotations

import importlib.metadata

import orjson
import pytest

from airflow_batch_provider.backends.azure import AZURE_LIMITS, AzureOpenAIBackend
from airflow_batch_provider.backends.openai import OpenAIBackend
from airflow_batch_provider.backends.registry import ENTRY_POINT_GROUP, backend_for_model, get_backend
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.cost.pricing import default_pricing
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.get_provider_info import get_provider_info
from airflow_batch_provider.links import console_url
from tests.backends.azure.conftest import DEPLOYMENT, SCHEMA


def test_registered_as_a_variant_of_openai():
    points = {p.name: p.value for p in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert points["azure"] == "airflow_batch_provider.backends.azure:AzureOpenAIBackend"
    backend = get_backend("azure")
    assert isinstance(backend, AzureOpenAIBackend) and isinstance(backend, OpenAIBackend)
    assert backend.hook_class().__name__ == "AzureOpenAIBatchHook"
    assert (AZURE_LIMITS.max_requests, AZURE_LIMITS.max_bytes) == (100_000, 200 * 1024 * 1024)


def test_lines_are_openai_lines_on_azure_s_route():
    spec = RequestSpec(provider="azure", model=DEPLOYMENT, system_prompt="Be brief.", response_schema=SCHEMA)
    line = renderer_for(spec).request_dict("r-1", "a red ball")
    assert line["url"] == "/chat/completions" and spec.endpoint == "/chat/completions"
    assert line["body"]["model"] == DEPLOYMENT  # the deployment name
    assert line["body"]["response_format"]["json_schema"]["strict"] is True
    assert get_backend("azure").parse_result(orjson.dumps(_answer("r-1")))["status"] == "succeeded"


def test_the_openai_route_is_refused_before_anything_is_written():
    with pytest.raises(InvalidInputError, match="'/v1/chat/completions' is not supported for provider 'azure'"):
        RequestSpec(provider="azure", model=DEPLOYMENT, endpoint="/v1/chat/completions")
    with pytest.raises(InvalidInputError, match="params may not set"):
        RequestSpec(provider="azure", model=DEPLOYMENT, params={"messages": []})


def test_deployment_names_claim_no_model_and_are_priced_by_name():
    assert backend_for_model(DEPLOYMENT).name == "openai"  # a gpt-* name stays OpenAI's guess
    assert backend_for_model("contoso-batch-prod") is None
    price = default_pricing().lookup(DEPLOYMENT)  # the deployment named after its model: OpenAI's list price
    assert (price.batch_input_per_mtok, price.batch_output_per_mtok) == (0.075, 0.30)
    assert console_url("azure", "https://contoso.openai.azure.com", "batch_1") is None


def test_connection_type_is_listed_with_its_fields():
    (conn,) = [c for c in get_provider_info()["connection-types"] if c["connection-type"] == "azure_openai_batch"]
    assert conn["hook-class-name"] == "airflow_batch_provider.backends.azure.hook.AzureOpenAIBatchHook"
    assert set(conn["conn-fields"]) == {"api_version"}
    assert conn["ui-field-behaviour"]["relabeling"]["host"] == "Endpoint"


def _answer(custom_id: str) -> dict:
    body = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}], "usage": {}}
    return {"custom_id": custom_id, "response": {"status_code": 200, "body": body}, "error": None}
