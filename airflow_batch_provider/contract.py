"""The plain types a backend and the pipeline share: the bottom layer, importing nothing of this package.

:class:`SpecFields` is what a backend and its renderer read of a request spec. The one
implementation is :class:`~airflow_batch_provider.chunking.spec.RequestSpec`, which checks itself
through its backend on construction; the backend contract
(:class:`~airflow_batch_provider.backends.base.Backend`) and the renderers
(:mod:`airflow_batch_provider.chunking.requests`) are typed against this protocol so that neither
needs the spec's module, and the spec's module may look backends up in the registry without an
import cycle. ``make lint`` keeps this module a leaf and the package free of cycles
(``[tool.importlinter]`` in pyproject.toml, ``scripts/check_import_cycles.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

#: The two endpoints whose requests carry no system prompt and no response schema (the spec refuses both).
EMBEDDINGS = "/v1/embeddings"
COMPLETIONS = "/v1/completions"

#: What a model's name says it is (:meth:`~airflow_batch_provider.backends.base.Backend.model_kind`).
ModelKind = Literal["chat", "embedding"]


class SpecFields(Protocol):
    """What to ask every row, after the spec's checks: read-only, JSON-clean, endpoint resolved."""

    @property
    def provider(self) -> str:
        """The backend's name (the entry point's name)."""

    @property
    def model(self) -> str:
        """The model (or deployment) name, non-empty."""

    @property
    def endpoint(self) -> str:
        """One of the backend's ``endpoints``: the first when the spec named none."""

    @property
    def system_prompt(self) -> str | None:
        """The system prompt, or None (never set on the embeddings and completions endpoints)."""

    @property
    def params(self) -> Mapping[str, Any]:
        """Sampling parameters passed into the request body: a private, JSON-clean copy."""

    @property
    def json_schema(self) -> dict[str, Any] | None:
        """The structured-output JSON Schema (an object schema), or None."""

    @property
    def schema_name(self) -> str | None:
        """The schema's name, usable as an OpenAI schema or Anthropic tool name (None without a schema)."""

    @property
    def prompt_caching(self) -> bool | str:
        """True: cache the shared prefix where it qualifies; False: never; or a cache TTL ("5m", "1h")."""

    @property
    def schema_from_model(self) -> bool:
        """True when the schema came from a pydantic model (whose optional fields stay nullable)."""
