"""Azure's request lines are OpenAI's (``url: /chat/completions``, ``model``: the deployment name)."""

from __future__ import annotations

from airflow_batch_provider.backends.openai.requests import OpenAIRenderer


class AzureOpenAIRenderer(OpenAIRenderer):
    """OpenAI's renderer for chunks whose provider is ``azure``."""

    provider = "azure"
