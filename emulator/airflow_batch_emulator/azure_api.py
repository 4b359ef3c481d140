"""Azure OpenAI's batch routes, served by the OpenAI engine: a route set registered by entry point.

The paths are Azure's data-plane ones under ``/openai`` (``/openai/files``, ``/openai/batches``,
``/openai/deployments/{deployment}/chat/completions`` ...), each requiring the ``api-version``
query parameter; the key comes in the ``api-key`` header (or an Entra ID ``Authorization: Bearer``
token). Batch lines and creates name the route without ``/v1`` (``/chat/completions``) and a file
may hold 100,000 requests. Everything else (files, the batch lifecycle, faults, answers) is the
OpenAI emulation's: its batches are kept with OpenAI's and counted under ``openai`` in the stats.

Registered in ``emulator/pyproject.toml`` under ``airflow_batch_emulator.routes`` like a route set
of another package would be (:mod:`.extensions`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from airflow_batch_emulator.extensions import Emulator, Route, RouteSet
from airflow_batch_emulator.openai_api import OpenAIApi
from airflow_batch_emulator.wire import OpenAIError, Request, Response

#: An api-version as Azure spells them: a date, optionally ``-preview``.
API_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}(-preview)?")
#: Azure's batch endpoints and the OpenAI routes that answer their realtime twins.
AZURE_ENDPOINTS = {"/chat/completions": "/v1/chat/completions", "/embeddings": "/v1/embeddings"}


class AzureOpenAIApi(OpenAIApi):
    """The OpenAI handlers with Azure's batch endpoints and its 100,000 requests per file."""

    batch_endpoints = frozenset(AZURE_ENDPOINTS)
    max_lines = 100_000


class AzureRoutes(RouteSet):
    """``/openai/...`` routes over the emulator's OpenAI store and batch engine."""

    prefix = "/openai/"
    key_headers = ("api-key",)

    def __init__(self, emulator: Emulator) -> None:
        self.api = AzureOpenAIApi(emulator.store, emulator.openai_api.runner, emulator.config)

    def routes(self) -> Iterable[Route]:
        """Return every Azure route, each checking ``api-version`` first."""
        api = self.api
        handlers: list[tuple[str, str, Callable[[Request], Response]]] = [
            ("POST", "/openai/files", api.upload_file),
            ("GET", "/openai/files", api.list_files),
            ("GET", "/openai/files/(?P<file_id>[^/]+)", api.get_file),
            ("DELETE", "/openai/files/(?P<file_id>[^/]+)", api.delete_file),
            ("GET", "/openai/files/(?P<file_id>[^/]+)/content", api.file_content),
            ("POST", "/openai/batches", api.create_batch),
            ("GET", "/openai/batches", api.list_batches),
            ("GET", "/openai/batches/(?P<batch_id>[^/]+)", api.get_batch),
            ("POST", "/openai/batches/(?P<batch_id>[^/]+)/cancel", api.cancel_batch),
        ]
        for azure, openai in AZURE_ENDPOINTS.items():
            handlers.append(("POST", f"/openai/deployments/(?P<deployment>[^/]+){azure}", api.realtime_handler(openai)))
        return [(method, path, _versioned(handler)) for method, path, handler in handlers]


def _versioned(handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """Wrap ``handler`` so that a request without a well-formed ``api-version`` is refused, as Azure does."""

    def handle(req: Request) -> Response:
        version = req.query.get("api-version")
        if not version:
            message = "The api-version query parameter (?api-version=) is required for all requests."
            raise OpenAIError(400, message, "invalid_request_error", "api-version", "MissingApiVersionParameter")
        if not API_VERSION.fullmatch(version):
            message = f"Unsupported api-version {version[:40]!r}: expected a date such as 2024-10-21."
            raise OpenAIError(400, message, "invalid_request_error", "api-version", "UnsupportedApiVersion")
        return handler(req)

    return handle
