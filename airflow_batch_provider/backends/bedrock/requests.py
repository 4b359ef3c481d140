"""Amazon Bedrock batch request lines: ``{custom_id, modelInput}`` (the hook renames ``custom_id`` on upload)."""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.backends.bedrock.bodies import model_input
from airflow_batch_provider.chunking.requests import RequestRenderer


class BedrockRenderer(RequestRenderer):
    """Render Amazon Bedrock batch lines ``{custom_id, modelInput}`` (see :mod:`.bodies`)."""

    provider = "bedrock"

    def request_dict(self, custom_id: str, text: str) -> dict[str, Any]:
        """Return the full request as a dict, ``custom_id`` first."""
        return {"custom_id": custom_id, "modelInput": model_input(self.spec, text)}
