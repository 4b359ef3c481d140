"""Google's Gemini Batch API (Gemini Developer API) as a batch backend, through the ``google-genai`` SDK.

:class:`GeminiBackend` is what the registry loads (entry point ``gemini``); it stays import-light
(see :mod:`airflow_batch_provider.backends.base`): the renderer, the parameter checks, the result
parser, the token parts and the hook are imported by the methods that use them. What each
module owns:

- :mod:`.limits`: batch limits, key rules, the endpoint name and API version (plain data).
- :mod:`.params`: which ``params`` a request takes and their ``generationConfig`` names (checks).
- :mod:`.render`: request lines ``{custom_id, request: GenerateContentRequest}``, structured
  output through ``responseMimeType`` + ``responseJsonSchema``.
- :mod:`.states`: ``JOB_STATE_*`` → :class:`~airflow_batch_provider.status.BatchStatus` (raises on
  an unknown state), SDK ``BatchJob`` → :class:`~airflow_batch_provider.status.BatchState`, which
  SDK errors are worth a retry.
- :mod:`.results`: result lines ``{key, response | error}`` → the merged schema's records.
- :mod:`.hook`: :class:`~.hook.GeminiBatchHook` (upload, create, crash-safe re-find by display
  name, status, cancel, results download, console link).
- :mod:`.tokens`: what a request line asks the model to read, for cost estimates.
- :mod:`.prices`: list prices per model (batch mode is half of them).
- :mod:`.connection`: the ``gemini`` connection type (API key in the password field).

The SDK is optional (the ``gemini`` extra): only the hook imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_batch_provider.backends.base import Backend, CountableRequest
from airflow_batch_provider.backends.gemini.connection import CONNECTION_TYPE
from airflow_batch_provider.backends.gemini.limits import GENERATE_CONTENT, LIMIT_FIELDS, PROVIDER
from airflow_batch_provider.backends.gemini.prices import GEMINI_PRICES, PRICES_SOURCE
from airflow_batch_provider.chunking.limits import ProviderLimits

if TYPE_CHECKING:
    from airflow_batch_provider.chunking.requests import RequestRenderer
    from airflow_batch_provider.contract import SpecFields
    from airflow_batch_provider.descriptors import ResultRecord

GEMINI_LIMITS = ProviderLimits(**LIMIT_FIELDS)


class GeminiBackend(Backend):
    """Gemini Batch API: ``{custom_id, request}`` lines in one uploaded file, 50,000 requests a chunk."""

    name = PROVIDER
    title = "Google Gemini Batch API"
    limits = GEMINI_LIMITS
    endpoints = (GENERATE_CONTENT,)
    hook_class_path = "airflow_batch_provider.backends.gemini.hook:GeminiBatchHook"
    connection_type = str(CONNECTION_TYPE["connection-type"])
    sdk_module = "google.genai"
    sdk_requirement = "airflow-batch-provider[gemini]"
    default_model = "gemini-2.5-flash"
    model_prefixes = ("gemini-",)
    prices = GEMINI_PRICES
    batch_discount = 0.5  # batch mode costs half of the list price
    prices_source = PRICES_SOURCE
    console_hosts = ("generativelanguage.googleapis.com",)
    console_template = "https://aistudio.google.com/batches/{batch_id}"
    chat_format_tokens = (0, 0)  # Gemini publishes no per-turn framing cost

    def check_params(self, spec: SpecFields) -> None:
        """Refuse another provider's model, parameters Gemini does not take, and keys the renderer writes."""
        from airflow_batch_provider.backends.gemini.params import check_gemini_params

        check_gemini_params(spec)

    def renderer(self, spec: SpecFields) -> RequestRenderer:
        """Return the Gemini batch line renderer."""
        from airflow_batch_provider.backends.gemini.render import GeminiRenderer

        return GeminiRenderer(spec)

    def parse_result(self, line: bytes | str | Mapping[str, Any]) -> ResultRecord:
        """Parse one line of a Gemini batch result file (or the decoded object)."""
        import orjson

        from airflow_batch_provider.backends.gemini.results import parse_gemini_line

        return parse_gemini_line(line if isinstance(line, bytes | str) else orjson.dumps(line))

    def connection_info(self) -> dict[str, Any]:
        """Return the ``gemini`` connection type (API key in the password field, base URL)."""
        return CONNECTION_TYPE

    def countable_request(self, line: Mapping[str, Any]) -> CountableRequest | None:
        """Return a ``{custom_id, request}`` line's text parts and output cap as ``{"prompt", "max_tokens"}``."""
        request = line.get("request")
        if not isinstance(request, Mapping):
            return None
        from airflow_batch_provider.backends.gemini.tokens import gemini_request_parts

        texts, cap, answer = gemini_request_parts(request)
        return CountableRequest({"prompt": list(texts), "max_tokens": cap}, typical_answer=answer)

    def console_url(self, base_url: str | None, batch_id: str) -> str | None:
        """Return the AI Studio link of a batch on Google's own API (the id without its ``batches/`` prefix)."""
        return super().console_url(base_url, batch_id.removeprefix("batches/"))
