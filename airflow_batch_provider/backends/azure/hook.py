"""AzureOpenAIBatchHook: the OpenAI hook on the SDK's ``AzureOpenAI`` clients.

Connection (type ``azure_openai_batch``, default id ``azure_openai_batch_default``): the resource
endpoint (``https://<resource>.openai.azure.com``) in the host field, the API key in the
password field, the ``api_version`` extra (default :data:`~.connection.DEFAULT_API_VERSION`).
With no key the hook signs in with Microsoft Entra ID: ``azure-identity``'s
``DefaultAzureCredential`` (managed identity, workload identity, ``AZURE_CLIENT_ID`` /
``AZURE_TENANT_ID`` / ``AZURE_CLIENT_SECRET``, a developer's ``az login``), installed by the
``[azure]`` extra and imported only then. The SDK adds ``/openai`` to the endpoint, the
``api-version`` query to every call, and routes a realtime call to ``/deployments/{model}/...``.
Everything else (files, batches, listing, results, retries) is the OpenAI hook's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import openai

from airflow_batch_provider.backends.azure import AZURE_LIMITS
from airflow_batch_provider.backends.azure.connection import DEFAULT_API_VERSION
from airflow_batch_provider.backends.openai.hook import OpenAIBatchHook
from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.hooks.sdk_clients import connection_client_kwargs

#: The scope an Entra ID token for Azure OpenAI is issued for.
ENTRA_SCOPE = "https://cognitiveservices.azure.com/.default"


class AzureOpenAIBatchHook(OpenAIBatchHook):
    """Submit chunk files to Azure OpenAI global-batch deployments, poll, cancel and stream results."""

    default_conn_name: ClassVar[str] = "azure_openai_batch_default"
    conn_type = "azure_openai_batch"
    hook_name = "Azure OpenAI Batch"
    provider: ClassVar[str] = "azure"
    limits: ClassVar[ProviderLimits] = AZURE_LIMITS
    sync_client_class = openai.AzureOpenAI
    async_client_class = openai.AsyncAzureOpenAI
    credential_args = ("api_key", "azure_ad_token_provider")

    def sdk_client_kwargs(self, conn: Any) -> dict[str, Any]:
        """Return ``AzureOpenAI`` arguments: endpoint, api-version, and a key or an Entra ID token provider."""
        kwargs = connection_client_kwargs(conn, max_retries=self.max_retries, timeout=self.timeout)
        endpoint = kwargs.pop("base_url")
        if not endpoint:
            raise openai.OpenAIError(
                f"Connection {self.conn_id!r} names no endpoint: put https://<resource>.openai.azure.com "
                "in its host field."
            )
        kwargs.update(azure_endpoint=endpoint, api_version=conn.extra_dejson.get("api_version") or DEFAULT_API_VERSION)
        if not kwargs["api_key"]:
            del kwargs["api_key"]  # the SDK takes a key or a token provider, never both
            kwargs["azure_ad_token_provider"] = self.entra_token_provider()
        return kwargs

    def entra_token_provider(self) -> Any:
        """Return a callable giving Entra ID bearer tokens (``azure-identity``; cached and refreshed by it)."""
        try:
            from azure.identity import DefaultAzureCredential, get_bearer_token_provider
        except ImportError:
            from airflow.exceptions import AirflowOptionalProviderFeatureException

            raise AirflowOptionalProviderFeatureException(
                f"Connection {self.conn_id!r} has no API key, and signing in with Microsoft Entra ID needs "
                "azure-identity: pip install 'airflow-batch-provider[azure]', or put the key in the password field."
            ) from None
        return get_bearer_token_provider(DefaultAzureCredential(), ENTRA_SCOPE)
