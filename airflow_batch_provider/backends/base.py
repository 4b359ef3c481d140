"""Backend: the contract between the pipeline stages and one batch provider.

Everything that differs between providers is declared here and nowhere else: the request lines
a chunk file holds (a :class:`~airflow_batch_provider.chunking.requests.RequestRenderer`), the
parameter checks run before anything is written, batch limits and custom-id rules
(:class:`~airflow_batch_provider.chunking.limits.ProviderLimits`, minimum batch size included),
result-line parsing, prices and token-counting rules, the console link, the Airflow connection
type and the :class:`~airflow_batch_provider.hooks.base.BatchHook` that talks to the API (which
maps the provider's batch statuses to :class:`~airflow_batch_provider.status.BatchStatus`).

A backend's class is loaded for every cost estimate and by ``get_provider_info``, which Airflow
calls while it is still loading its configuration, so the module a backend registers must stay
import-light: nothing that imports Airflow (the package's ``exceptions`` do) and no SDK at module
level. The SDK, the renderer, the hook and the exceptions are imported by the methods that need
them (:meth:`Backend.renderer`, :meth:`Backend.hook_class`, ``check_params``).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple
from urllib.parse import urlsplit

from airflow_batch_provider.chunking.limits import ProviderLimits

if TYPE_CHECKING:
    from airflow_batch_provider.chunking.requests import RequestRenderer
    from airflow_batch_provider.contract import ModelKind, SpecFields
    from airflow_batch_provider.descriptors import ResultRecord
    from airflow_batch_provider.hooks.base import BatchHook


@dataclass(frozen=True)
class TokenRules:
    """How to count one model's tokens offline: characters per token, or a tiktoken encoding."""

    chars_per_token: float = 4.0
    #: tiktoken encoding name for exact counts (used only when its BPE file is on disk), or None.
    encoding: str | None = None


class CountableRequest(NamedTuple):  # a NamedTuple: built once per request line of every cost estimate
    """The body of one batch request line, and what its chat format adds per message.

    ``body`` holds ``messages``, ``input`` or ``prompt`` (a text or a list of texts) and
    ``max_tokens`` when the request caps its answer; a format that is none of these is rewritten
    into one of them by the backend. ``typical_answer``, when given, is an answer the request's
    response schema allows (else it is worked out from ``response_format`` / ``tools`` in the body).
    """

    body: Mapping[str, Any]
    tokens_per_message: int = 0
    reply_priming: int = 0
    typical_answer: str | None = None


class Backend(ABC):
    """One batch provider. Subclass it, register it under its :attr:`name` in the entry-point group.

    Class attributes every backend sets: ``name`` (the provider name chunk descriptors carry and
    the entry point's name), ``title``, ``limits``, ``endpoints`` (the first is the default),
    ``hook_class_path`` (``"module:Class"``), ``connection_type``, ``default_model`` (what a job
    that names no model uses, e.g. the example DAGs; priced in ``prices``). Optional ones:
    ``model_prefixes`` (to guess a model's backend), ``prices`` (model → USD per 1M input and output
    tokens at real-time list prices), ``batch_discount``, ``prices_source``, ``console_hosts``,
    ``console_template``, ``chat_format_tokens``, ``sdk_module`` / ``sdk_requirement``, and what
    the stages ask about the provider's answers: ``retryable_line_errors``, ``capacity_refusal_codes``.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    limits: ClassVar[ProviderLimits]
    endpoints: ClassVar[tuple[str, ...]]
    hook_class_path: ClassVar[str]
    connection_type: ClassVar[str]
    default_model: ClassVar[str]
    model_prefixes: ClassVar[tuple[str, ...]] = ()
    prices: ClassVar[Mapping[str, tuple[float, float]]] = {}
    batch_discount: ClassVar[float] = 0.5
    prices_source: ClassVar[str] = ""
    #: Prompt-cache (read, write) prices as multiples of the input price, batch discount applied on top;
    #: (1, 1) where the backend prices no cache. See docs/cost.md, "Prompt caching".
    cache_price_multipliers: ClassVar[tuple[float, float]] = (1.0, 1.0)
    #: API hosts whose batches the provider's console shows, and the URL of one batch there.
    console_hosts: ClassVar[tuple[str, ...]] = ()
    console_template: ClassVar[str | None] = None
    #: Tokens a chat request's format adds: per message, and to prime the reply (OpenAI's by default).
    chat_format_tokens: ClassVar[tuple[int, int]] = (4, 3)
    #: The SDK the hook imports (a module an install may lack; None: none) and the pip requirement
    #: that installs it. Without it, getting the hook raises AirflowOptionalProviderFeatureException
    #: naming the requirement (:func:`airflow_batch_provider.backends.registry.require_sdk`).
    sdk_module: ClassVar[str | None] = None
    sdk_requirement: ClassVar[str] = ""
    #: Result-line ``error_code`` values that mean "send it again": the provider never really answered
    #: (server error, overload, rate limit, timeout, the batch's expiry). A line with an HTTP status is
    #: judged by the status (408/409/429/5xx); any other code is final. A code any backend lists counts
    #: (:func:`airflow_batch_provider.batches.line_retry.retryable_codes`: merged rows carry no provider).
    retryable_line_errors: ClassVar[frozenset[str]] = frozenset()
    #: Batch ``errors[].code`` values with which the provider refuses a whole batch for its enqueued-token
    #: cap: a batch that failed with these alone is waited out and submitted again
    #: (:func:`airflow_batch_provider.batches.token_budget.is_token_limit_refusal`). Empty: no such cap.
    capacity_refusal_codes: ClassVar[frozenset[str]] = frozenset()

    # -- chunk time: requests ----------------------------------------------------------------------
    @property
    def default_endpoint(self) -> str:
        """Return the endpoint used when a spec names none."""
        return self.endpoints[0]

    @abstractmethod
    def check_params(self, spec: SpecFields) -> None:
        """Raise InvalidInputError when ``spec.params`` (or the schema) cannot be sent to this provider.

        Runs on :class:`~airflow_batch_provider.chunking.spec.RequestSpec` construction, before any
        row is read: a mistake found here costs nothing, the same mistake found in a result a day
        later costs the batch.
        """

    @abstractmethod
    def renderer(self, spec: SpecFields) -> RequestRenderer:
        """Return the renderer writing this provider's JSONL request lines for ``spec``."""

    # -- results --------------------------------------------------------------------------------------
    @abstractmethod
    def parse_result(self, line: bytes | str | Mapping[str, Any]) -> ResultRecord:
        """Turn one result line (or an already decoded result object) into a ResultRecord.

        Never raise on a well-formed line with an unexpected body: return an ``errored`` record
        saying why. Raise :class:`~airflow_batch_provider.exceptions.ResultsError` only for a line
        that is not a result at all.
        """

    # -- the hook and the connection --------------------------------------------------------------
    def hook_class(self) -> type[BatchHook]:
        """Import and return the hook class (the only place the provider's SDK is imported)."""
        from airflow_batch_provider.hooks.base import BatchHook

        module_name, _, class_name = self.hook_class_path.partition(":")
        hook = getattr(importlib.import_module(module_name), class_name)
        if not (isinstance(hook, type) and issubclass(hook, BatchHook)):
            raise TypeError(f"backend {self.name!r}: {self.hook_class_path!r} is not a BatchHook subclass")
        return hook

    def connection_info(self) -> dict[str, Any]:
        """Return this backend's entry of ``get_provider_info()["connection-types"]``.

        Override to add ``ui-field-behaviour`` and ``conn-fields`` (keep them plain data).
        """
        return {
            "hook-class-name": self.hook_class_path.replace(":", "."),
            "hook-name": self.title,
            "connection-type": self.connection_type,
        }

    def model_kind(self, model: str) -> ModelKind | None:
        """Return ``"chat"`` or ``"embedding"`` when ``model``'s name says which it is, else None (no check).

        The spec refuses a chat model on ``/v1/embeddings`` and an embedding model elsewhere
        (:func:`~airflow_batch_provider.chunking.validation.check_model_endpoint`); a name no
        backend knows is sent as it is (self-hosted models, aliases, deployments).
        """
        return None

    # -- cost ---------------------------------------------------------------------------------------
    def owns_model(self, model: str) -> bool:
        """Return True when ``model``'s name says it is this provider's (for tokens and price files)."""
        return bool(self.model_prefixes) and model.startswith(self.model_prefixes)

    def token_rules(self, model: str) -> TokenRules:
        """Return how to count ``model``'s tokens offline (default: 4 characters per token)."""
        return TokenRules()

    def countable_request(self, line: Mapping[str, Any]) -> CountableRequest | None:
        """Return the countable body of ``line`` when it is one of this provider's batch lines, else None."""
        return None

    # -- links --------------------------------------------------------------------------------------
    def console_url(self, base_url: str | None, batch_id: str) -> str | None:
        """Return the console URL of ``batch_id`` when ``base_url`` is the provider's own API, else None.

        A connection pointed elsewhere (the emulator, a proxy) made a batch the console never saw.
        """
        from airflow_batch_provider.backends.console import fill_console_template

        parts = urlsplit(base_url or "")
        hosts = self.console_hosts
        if not self.console_template or parts.scheme != "https" or (parts.hostname or "").lower() not in hosts:
            return None
        return fill_console_template(self.console_template, batch_id=batch_id)  # None for an id of another shape
