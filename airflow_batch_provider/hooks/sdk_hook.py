"""SdkBatchHook: the half of a batch hook that a provider's HTTP SDK decides (OpenAI's, Anthropic's).

Both SDKs come as a synchronous and an async client built from the same arguments. What differs
between the backends is which client classes, how the connection maps to their arguments, which
exception means a missing key, and how the SDK's errors are classified for retries; each backend
names those, and this class builds the clients (the async one off the event loop:
:func:`~airflow_batch_provider.hooks.sdk_clients.anew_client`) and runs every call under the hook's
:class:`~airflow_batch_provider.utils.retry.RetryPolicy`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import cached_property, partial
from typing import Any, ClassVar, Generic, TypeVar, cast

import orjson

from airflow_batch_provider.exceptions import ProviderCallError
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.hooks.sdk_clients import anew_client, connection_client_kwargs, new_client
from airflow_batch_provider.utils.retry import RetryPolicy, acall_with_retries, call_with_retries

SyncClientT = TypeVar("SyncClientT")
AsyncClientT = TypeVar("AsyncClientT")
T = TypeVar("T")
#: Builds one batch-result line: (custom_id, HTTP status, answer body or error object) -> JSON object.
ResultLineBuilder = Callable[[str, int, dict[str, Any]], dict[str, Any]]


def json_object(answer: object) -> dict[str, Any]:
    """Return a real-time answer's JSON body; anything but an object fails that request (answers are hostile)."""
    if not isinstance(answer, dict):
        raise ValueError(f"the real-time answer is not a JSON object but {type(answer).__name__}")
    return answer


def api_error(exc: BaseException | None) -> tuple[int, dict[str, Any]]:
    """Return (HTTP status, ``{type, code, message}``) of a failed SDK call; status 0 when no answer came."""
    status = getattr(exc, "status_code", 0) or 0
    body = getattr(exc, "body", None)
    # OpenAI's SDK keeps the inner error object, Anthropic's the whole {"type": "error", "error": {...}}.
    error = body.get("error", body) if isinstance(body, dict) else {}
    error = error if isinstance(error, dict) else {}
    return status, {
        "type": error.get("type") or type(exc).__name__,
        "code": error.get("code"),
        "message": str(error.get("message") or exc),
    }


class SdkBatchHook(BatchHook, Generic[SyncClientT, AsyncClientT]):
    """A batch hook over an SDK's client pair.

    :param conn_id: Airflow connection id.
    :param retry_policy: attempts above the SDK's own retries for every API call.
    :param max_retries: the SDK's own retry count (keep it > 0: it handles quick blips).
    :param timeout: per-request timeout in seconds.
    """

    #: The SDK's clients and the error it raises for a client it cannot build, e.g. ``openai.OpenAI``,
    #: ``openai.AsyncOpenAI`` and ``openai.OpenAIError``.
    sync_client_class: ClassVar[type[Any]]
    async_client_class: ClassVar[type[Any]]
    sdk_error: ClassVar[type[Exception]]
    #: Client arguments any one of which authenticates (Azure's clients take a token provider instead of a key).
    credential_args: ClassVar[tuple[str, ...]] = ("api_key",)

    def __init__(
        self,
        conn_id: str | None = None,
        *,
        retry_policy: RetryPolicy | None = None,
        max_retries: int = 2,
        timeout: float = 600.0,
    ) -> None:
        super().__init__(conn_id)
        self.retry_policy = retry_policy or RetryPolicy()
        self.max_retries = max_retries
        self.timeout = timeout

    def classify_error(self, exc: BaseException) -> tuple[bool, float | None]:
        """Return (retryable, seconds the provider asked to wait) for an error of this SDK."""
        raise NotImplementedError

    def sdk_client_kwargs(self, conn: Any) -> dict[str, Any]:
        """Return the client arguments read from ``conn``: those every provider shares, unless overridden."""
        return connection_client_kwargs(conn, max_retries=self.max_retries, timeout=self.timeout)

    def _client_kwargs(self, conn: Any) -> dict[str, Any]:
        kwargs = self.sdk_client_kwargs(conn)
        if not any(kwargs.get(name) for name in self.credential_args):
            raise self.sdk_error(
                f"Connection {self.conn_id!r} has no API key: put it in the connection's password field."
            )
        return kwargs

    @cached_property
    def client(self) -> SyncClientT:
        """The synchronous SDK client, built once from the connection."""
        return cast(
            SyncClientT, new_client(self.sync_client_class, self._client_kwargs(self.get_connection(self.conn_id)))
        )

    def get_conn(self) -> SyncClientT:
        """Return the synchronous SDK client."""
        return self.client

    async def aget_client(self) -> AsyncClientT:
        """Return the async SDK client (connection read without blocking the event loop); closed by ``aclose``."""
        if self._async_client is None:
            conn = await self.aget_connection(self.conn_id)
            self._async_client = await anew_client(self.async_client_class, lambda: self._client_kwargs(conn))
        return cast(AsyncClientT, self._async_client)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return call_with_retries(fn, what=what, classify=self.classify_error, policy=self.retry_policy)

    async def _acall(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Async twin of :meth:`_call` (``fn`` returns an awaitable)."""
        return await acall_with_retries(fn, what=what, classify=self.classify_error, policy=self.retry_policy)

    def _answer_each(
        self, request_lines: Sequence[bytes], send: Callable[[dict[str, Any]], dict[str, Any]], line: ResultLineBuilder
    ) -> list[bytes]:
        """Do :meth:`answer_now` with ``send`` (one real-time call, its answer as JSON) and ``line`` (its result line).

        Each call is retried like every other call of the hook; an error the API still gives is the line's answer.
        """
        answers: list[bytes] = []
        for raw in request_lines:
            request = orjson.loads(raw)
            custom_id = str(request.get("custom_id"))
            try:
                answer = self._call(f"real-time request {custom_id!r}", partial(send, request))
                answers.append(orjson.dumps(line(custom_id, 200, answer)))
            except ProviderCallError as exc:
                status, error = api_error(exc.__cause__)
                answers.append(orjson.dumps(line(custom_id, status, error)))
        return answers
