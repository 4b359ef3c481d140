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
    from airflow_batch_provider.chunking.spec import RequestSpec
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
    ``hook_class_path`` (``"module:Class"``), ``connection_type``. Optional ones: ``model_prefixes``
    (to guess a model's backend), ``prices`` (model → USD per 1M input and output tokens at
    real-time list prices), ``batch_discount``, ``prices_source``, ``console_hosts``,
    ``console_template`` and ``chat_format_tokens``.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    limits: ClassVar[ProviderLimits]
    endpoints: ClassVar[tuple[str, ...]]
    hook_class_path: ClassVar[str]
    connection_type: ClassVar[str]
    model_prefixes: ClassVar[tuple[str, ...]] = ()
    prices: ClassVar[Mapping[str, tuple[float, float]]] = {}
    batch_discount: ClassVar[float] = 0.5
    prices_source: ClassVar[str] = ""
    #: API hosts whose batches the provider's console shows, and the URL of one batch there.
    console_hosts: ClassVar[tuple[str, ...]] = ()
    console_template: ClassVar[str | None] = None
    #: Tokens a chat request's format adds: per message, and to prime the reply (OpenAI's by default).
    chat_format_tokens: ClassVar[tuple[int, int]] = (4, 3)

    # -- chunk time: requests ----------------------------------------------------------------------
    @property
    def default_endpoint(self) -> str:
        """Return the endpoint used when a spec names none."""
        return self.endpoints[0]

    @abstractmethod
    def check_params(self, spec: RequestSpec) -> None:
        """Raise InvalidInputError when ``spec.params`` (or the schema) cannot be sent to this provider.

        Runs on :class:`~airflow_batch_provider.chunking.spec.RequestSpec` construction, before any
        row is read: a mistake found here costs nothing, the same mistake found in a result a day
        later costs the batch.
        """

    @abstractmethod
    def renderer(self, spec: RequestSpec) -> RequestRenderer:
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
        parts = urlsplit(base_url or "")
        hosts = self.console_hosts
        if not batch_id or not self.console_template or parts.scheme != "https":
            return None
        return self.console_template.format(batch_id=batch_id) if (parts.hostname or "").lower() in hosts else None
