"""Azure OpenAI Batch: the OpenAI backend on Azure's endpoint, ``api-version`` and deployment names.

A variant, not a new provider: request lines, result lines, statuses and errors are OpenAI's
(everything is inherited from :class:`~airflow_batch_provider.backends.openai.OpenAIBackend`).
What differs is declared here: the batch limits of a *global batch* (or data-zone batch)
deployment, the line URL without ``/v1`` (Azure's form), the connection type, and the hook
(:mod:`.hook`), which builds the SDK's ``AzureOpenAI`` clients. The ``model`` of a request is the
name of a batch deployment; its prices are looked up under that name, so a deployment named after
its model (``gpt-4o-mini``) is priced like OpenAI's, and any other name is priced by a price file.

Limits (learn.microsoft.com/azure/ai-foundry/openai/how-to/batch, "Batch limits"): 100,000
requests and 200 MB per input file, a fixed 24 h completion window, global-batch quota counted in
enqueued tokens per deployment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_batch_provider.backends.azure.connection import CONNECTION_INFO
from airflow_batch_provider.backends.openai import OpenAIBackend
from airflow_batch_provider.chunking.limits import MB, ProviderLimits

if TYPE_CHECKING:
    from airflow_batch_provider.chunking.requests import RequestRenderer
    from airflow_batch_provider.contract import SpecFields

CHAT_COMPLETIONS = "/chat/completions"  # Azure's batch lines and batch create name the route without /v1

AZURE_LIMITS = ProviderLimits(
    provider="azure",
    max_requests=100_000,
    max_bytes=200 * MB,
    default_byte_cap=190 * MB,
    endpoints=frozenset({CHAT_COMPLETIONS}),
    max_custom_id_chars=512,
)


class AzureOpenAIBackend(OpenAIBackend):
    """Azure OpenAI Batch API: OpenAI's lines with ``url: /chat/completions``, 100,000 requests a batch."""

    name = "azure"
    title = "Azure OpenAI Batch"
    limits = AZURE_LIMITS
    endpoints = (CHAT_COMPLETIONS,)
    hook_class_path = "airflow_batch_provider.backends.azure.hook:AzureOpenAIBatchHook"
    connection_type = "azure_openai_batch"
    sdk_requirement = "airflow-batch-provider[azure]"  # the openai SDK (sdk_module, inherited) and azure-identity
    model_prefixes = ()  # deployment names are the customer's own: they say nothing about the provider
    prices = {}  # priced by deployment name in the shared table: OpenAI's entries, or a price file's
    prices_source = ""
    console_hosts = ()  # the Foundry portal's batch page needs the resource's subscription path: no link
    console_template = None

    def renderer(self, spec: SpecFields) -> RequestRenderer:
        """Return OpenAI's line renderer under this backend's name."""
        from airflow_batch_provider.backends.azure.requests import AzureOpenAIRenderer

        return AzureOpenAIRenderer(spec)

    def connection_info(self) -> dict[str, Any]:
        """Return the ``azure_openai_batch`` connection type (endpoint, key, api-version)."""
        return CONNECTION_INFO
