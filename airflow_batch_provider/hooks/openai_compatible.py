"""OpenAICompatibleHook: send a chunk's requests to any OpenAI-compatible server, many at a time.

For self-hosted servers — ``vllm serve`` (``vllm.entrypoints.openai.api_server``), TGI,
llama.cpp's server — and for the emulator's realtime routes. Each chunk line is POSTed as-is
(``/v1/chat/completions`` or ``/v1/embeddings``) through the async ``openai`` SDK, with at most
``max_concurrency`` requests in flight: enough to keep the server's continuous batching full
without queueing the whole chunk on it. When the server turns requests away (429) the limit
adapts (:class:`~airflow_batch_provider.utils.adaptive.AdaptiveLimit`: halved, then grown back).
429, 5xx and connection errors are retried here, with jittered backoff that honours Retry-After
(:class:`~airflow_batch_provider.utils.retry.RetryPolicy`); the SDK's own retries are off in a run,
so every rejection is seen and its retries log nothing at INFO. A request that still fails becomes
an error line in the output (logged once, naming its custom_id), never a failed chunk.

Connection (type ``openai_compatible``, default id ``openai_compatible_default``): the base URL
in the extra ``base_url`` or the host field (``http://gpu-box:8000/v1``; a URL without a path
gets ``/v1``; a bare host gets ``http://`` and the port field); the API key, if the server wants
one, in the password field (``vllm serve --api-key``). Optional extras: ``timeout`` (seconds per
request) and ``headers`` (a JSON object of extra HTTP headers; every value is masked in logs).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException
from airflow.sdk.log import mask_secret

try:
    import openai
except ModuleNotFoundError as missing:  # ServerGenerateOperator and the streaming intake name the extra
    raise AirflowOptionalProviderFeatureException(
        "Talking to an OpenAI-compatible server needs the 'openai' package, which is not installed: "
        "pip install 'airflow-batch-provider[openai]'."
    ) from missing

from airflow_batch_provider.backends.openai.states import classify_openai_error
from airflow_batch_provider.exceptions import ProviderCallError
from airflow_batch_provider.hooks.sdk_clients import new_client
from airflow_batch_provider.self_hosted.output_lines import ResultCounts, error_line, success_line
from airflow_batch_provider.utils.adaptive import AdaptiveLimit
from airflow_batch_provider.utils.http_logs import quiet_transport_logs
from airflow_batch_provider.utils.retry import RetryPolicy

log = logging.getLogger(__name__)

#: Per request in a run (the SDK's retries are off there): more attempts than a single API call gets,
#: because a busy server turns requests away for as long as it is full.
SERVER_RETRY_POLICY = RetryPolicy(attempts=8, base_delay=1.0, max_delay=30.0)
#: Requests that finally failed are logged one line each up to this many; the summary counts the rest.
FAILURE_LINES = 50

SUPPORTED_ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings")
# vLLM's server ignores the key unless started with --api-key, but the SDK refuses an empty one.
PLACEHOLDER_API_KEY = "EMPTY"


@dataclass(frozen=True)
class ServerRequest:
    """One chunk line to send: its position, custom_id, endpoint and request body."""

    index: int
    custom_id: str
    url: str
    body: Mapping[str, Any]
    request_id: str


@dataclass
class ServerRunStats:
    """What one chunk's run against the server did."""

    counts: ResultCounts = field(default_factory=ResultCounts)
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    max_in_flight: int = 0
    status_codes: dict[str, int] = field(default_factory=dict)
    throttled: int = 0  # requests the server turned away with 429 (each retried)
    lowest_concurrency: int = 0  # the lowest the adaptive in-flight limit went


def normalise_base_url(raw: str | None, port: int | None = None) -> str:
    """Return a base URL with a scheme and a path (``/v1`` when none was given)."""
    if not raw:
        raise openai.OpenAIError(
            "The openai_compatible connection has no base URL: set the host field or the base_url extra, "
            "e.g. http://gpu-box:8000/v1."
        )
    url = raw.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    parts = urlsplit(url)
    netloc = parts.netloc
    if port and parts.port is None:
        netloc = f"{netloc}:{port}"
    path = parts.path or "/v1"
    return f"{parts.scheme}://{netloc}{path}"


class OpenAICompatibleHook(BaseHook):
    """Call an OpenAI-compatible inference server with the ``openai`` SDK.

    :param conn_id: Airflow connection id (type ``openai_compatible``).
    :param retry_policy: attempts per request in :meth:`run` (default :data:`SERVER_RETRY_POLICY`).
    :param max_retries: the SDK's own retry count (for :meth:`get_conn`; a run retries by itself).
    :param timeout: per-request timeout in seconds (the connection's ``timeout`` extra wins).
    """

    conn_name_attr = "conn_id"
    default_conn_name: ClassVar[str] = "openai_compatible_default"
    conn_type = "openai_compatible"
    hook_name = "OpenAI-compatible server"

    def __init__(
        self,
        conn_id: str | None = None,
        *,
        retry_policy: RetryPolicy | None = None,
        max_retries: int = 2,
        timeout: float = 600.0,
    ) -> None:
        super().__init__()
        self.conn_id = conn_id or self.default_conn_name
        self.retry_policy = retry_policy or SERVER_RETRY_POLICY
        self.max_retries = max_retries
        self.timeout = timeout

    # -- clients ---------------------------------------------------------------------------------
    @property
    def client_kwargs(self) -> dict[str, Any]:
        """SDK client arguments built from the connection, each time they are asked for.

        Not cached on the hook: they hold the key and the header values, which must not outlive the
        call in ``vars(hook)`` or a pickle of it (a hook travels with an operator or a trigger).
        """
        quiet_transport_logs()  # every client is built from these: no INFO line per request
        conn = self.get_connection(self.conn_id)
        extra = conn.extra_dejson or {}
        headers = extra.get("headers") or {}
        if isinstance(headers, str):  # the UI form stores the JSON object as text
            try:
                headers = json.loads(headers)
            except ValueError:
                headers = None
        if not isinstance(headers, dict):
            raise openai.OpenAIError(f"Connection {self.conn_id!r}: the 'headers' extra must be a JSON object.")
        for value in headers.values():
            # Extra headers usually carry credentials (a gateway token, an org key), and the UI stores
            # the extra as plain text, which Airflow's masker does not look inside: mask each value.
            mask_secret(str(value))
        return {
            "base_url": normalise_base_url(extra.get("base_url") or conn.host, conn.port),
            "api_key": conn.password or extra.get("api_key") or PLACEHOLDER_API_KEY,
            "max_retries": self.max_retries,
            "timeout": float(extra.get("timeout") or self.timeout),
            "default_headers": {str(k): str(v) for k, v in headers.items()} or None,
        }

    @property
    def base_url(self) -> str:
        """The server's base URL (ends in ``/v1`` for vLLM)."""
        return str(self.client_kwargs["base_url"])

    def get_conn(self) -> openai.OpenAI:
        """Return a synchronous SDK client (for quick checks; generation uses the async client)."""
        return new_client(openai.OpenAI, self.client_kwargs)

    def test_connection(self) -> tuple[bool, str]:
        """List the server's models (what the UI's Test button calls)."""
        try:
            with self.get_conn() as client:
                models = [m.id for m in client.models.list()]
        except Exception as exc:
            return False, str(exc)
        return True, f"Connected to {self.base_url}; models: {', '.join(models) or '(none listed)'}"

    # -- one request -----------------------------------------------------------------------------
    async def acreate(
        self, client: openai.AsyncOpenAI, url: str, body: Mapping[str, Any], limit: AdaptiveLimit | None = None
    ) -> Any:
        """POST ``body`` to ``url`` (``/v1/chat/completions`` …) with retries; return the decoded JSON body.

        Each attempt holds a slot of ``limit`` (none: unbounded) and tells it whether the server
        turned it away; waits between attempts hold no slot. Retries are logged at DEBUG only: a
        busy server can turn away thousands; the run logs what finally failed.
        """
        path = url[len("/v1") :] if url.startswith("/v1/") else url
        policy = self.retry_policy
        for attempt in range(1, policy.attempts + 1):
            sent_at = await limit.acquire() if limit is not None else 0.0
            answered = turned_away = False
            try:
                result = await client.post(path, cast_to=object, body=dict(body))
                answered = True
                return result
            except Exception as exc:
                turned_away = isinstance(exc, openai.RateLimitError)
                retryable, retry_after = classify_openai_error(exc)
                why = str(exc)
                if not retryable or attempt == policy.attempts:
                    raise ProviderCallError(f"POST {url} failed after {attempt} attempt(s): {exc}") from exc
            finally:
                if limit is not None:
                    await limit.release(sent_at, answered=answered, turned_away=turned_away)
            wait = policy.delay(attempt, retry_after)
            log.debug(
                "POST %s failed (%s); retrying in %.1f s (attempt %d/%d)", url, why, wait, attempt, policy.attempts
            )
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- a whole chunk ---------------------------------------------------------------------------
    def run(
        self,
        requests: Iterable[ServerRequest],
        *,
        fingerprint: str,
        write: Callable[[bytes], Any],
        max_concurrency: int = 64,
        total: int | None = None,
        label: str = "chunk",
        progress_every: float = 30.0,
    ) -> ServerRunStats:
        """Send every request, at most ``max_concurrency`` at a time; ``write`` each output line as it lands.

        Lines are written in completion order (the merge joins on custom_id). Blocks until all
        requests are answered; returns the counts and token totals.
        """
        if not isinstance(max_concurrency, int) or isinstance(max_concurrency, bool) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be a positive integer, got {max_concurrency!r}.")
        # Progress is logged every progress_every s; the transport's line per request is not (client_kwargs).
        return asyncio.run(self._arun(requests, fingerprint, write, max_concurrency, total, label, progress_every))

    async def _arun(
        self,
        requests: Iterable[ServerRequest],
        fingerprint: str,
        write: Callable[[bytes], Any],
        max_concurrency: int,
        total: int | None,
        label: str,
        progress_every: float,
    ) -> ServerRunStats:
        stats = ServerRunStats()
        started = time.monotonic()
        next_report = started + progress_every
        # Tasks alive are bounded by the ceiling; requests on the wire by the adaptive limit below it.
        semaphore = asyncio.Semaphore(max_concurrency)
        limit = AdaptiveLimit(max_concurrency)

        async def one(client: openai.AsyncOpenAI, request: ServerRequest) -> None:
            nonlocal next_report
            try:
                line, ok, status, usage = await self._answer(client, request, fingerprint, limit)
            finally:
                semaphore.release()
            if not ok:
                _log_failure(label, request.custom_id, status, stats.counts.failed)
            write(line + b"\n")
            stats.counts.add(ok)
            stats.status_codes[status] = stats.status_codes.get(status, 0) + 1
            stats.input_tokens += int(usage.get("prompt_tokens") or 0)
            stats.output_tokens += int(usage.get("completion_tokens") or 0)
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + progress_every
                _log_progress(label, stats, total, started)

        # The SDK's own retries are off: each attempt must reach the adaptive limit (and the SDK
        # would log a "Retrying request" line at INFO for every one).
        client_kwargs = {**self.client_kwargs, "max_retries": 0}
        try:
            async with (
                new_client(openai.AsyncOpenAI, client_kwargs, asynchronous=True) as client,
                asyncio.TaskGroup() as group,
            ):
                pending = iter(requests)
                while True:
                    # A slot first, then the next request: a lazy ``requests`` decides at send time.
                    await semaphore.acquire()  # bounds both requests in flight and tasks alive
                    request = next(pending, None)
                    if request is None:
                        break
                    group.create_task(one(client, request))
        except BaseExceptionGroup as errors:
            # Request failures never get here (they become error lines); what does — an unreadable
            # chunk line, a failed write — should surface as itself, not wrapped in a group.
            if len(errors.exceptions) == 1:
                raise errors.exceptions[0]  # noqa: B904 - keep the error's own cause
            raise
        stats.seconds = time.monotonic() - started
        stats.throttled, stats.lowest_concurrency, stats.max_in_flight = limit.throttled, limit.lowest, limit.peak
        _log_summary(label, stats, max_concurrency)
        return stats

    async def _answer(
        self,
        client: openai.AsyncOpenAI,
        request: ServerRequest,
        fingerprint: str,
        limit: AdaptiveLimit,
    ) -> tuple[bytes, bool, str, Mapping[str, Any]]:
        """Return (output line, succeeded, status label, usage) for one request; never raises for the request."""
        custom_id, req_id = request.custom_id, request.request_id
        if request.url not in SUPPORTED_ENDPOINTS:
            message = f"endpoint {request.url!r} is not supported in server mode; use one of {SUPPORTED_ENDPOINTS}"
            line = error_line(
                custom_id,
                fingerprint=fingerprint,
                req_id=req_id,
                message=message,
                status_code=400,
                code="invalid_request_error",
            )
            return line, False, "400", {}
        try:
            body = await self.acreate(client, request.url, request.body, limit)
        except ProviderCallError as exc:
            return self._failure_line(custom_id, req_id, fingerprint, exc)
        if not isinstance(body, dict):
            message = f"the server answered {request.url} with a non-JSON-object body: {str(body)[:200]!r}"
            line = error_line(
                custom_id, fingerprint=fingerprint, req_id=req_id, message=message, status_code=502, code="bad_response"
            )
            return line, False, "502", {}
        line = success_line(custom_id, body, fingerprint=fingerprint, req_id=req_id)
        usage = body.get("usage")
        return line, True, "200", usage if isinstance(usage, dict) else {}

    @staticmethod
    def _failure_line(
        custom_id: str, req_id: str, fingerprint: str, exc: ProviderCallError
    ) -> tuple[bytes, bool, str, Mapping[str, Any]]:
        cause = exc.__cause__
        if isinstance(cause, openai.APIStatusError):
            detail = cause.body if isinstance(cause.body, dict) else {}
            message = str(detail.get("message") or cause.message)
            code = detail.get("code") or detail.get("type")
            line = error_line(
                custom_id,
                fingerprint=fingerprint,
                req_id=cause.request_id or req_id,
                message=message,
                status_code=cause.status_code,
                code=str(code) if code else None,
            )
            return line, False, str(cause.status_code), {}
        kind = "connection_error" if isinstance(cause, openai.APIConnectionError) else "request_failed"
        line = error_line(
            custom_id, fingerprint=fingerprint, req_id=req_id, message=str(exc), status_code=None, code=kind
        )
        return line, False, kind, {}


def _log_progress(label: str, stats: ServerRunStats, total: int | None, started: float) -> None:
    done = stats.counts.total
    log.info(
        "%s: %s/%s requests answered (%d failed), %.1f req/s",
        label,
        f"{done:,}",
        f"{total:,}" if total is not None else "?",
        stats.counts.failed,
        done / max(time.monotonic() - started, 1e-9),
    )


def _log_summary(label: str, stats: ServerRunStats, ceiling: int) -> None:
    """Log one line on what failed for good and how often the server turned requests away (if anything did)."""
    if not (stats.counts.failed or stats.throttled):
        return
    failures = ", ".join(f"{code} x{n}" for code, n in sorted(stats.status_codes.items()) if code != "200")
    log.warning(
        "%s: %d of %d request(s) failed for good (%s); the server turned requests away %d time(s), so at the "
        "low point at most %d were in flight (ceiling %d)",
        label,
        stats.counts.failed,
        stats.counts.total,
        failures or "none",
        stats.throttled,
        stats.lowest_concurrency,
        ceiling,
    )


def _log_failure(label: str, custom_id: str, status: str, failed_so_far: int) -> None:
    """Log one request that failed for good (the first FAILURE_LINES of a run; the summary counts all)."""
    if failed_so_far < FAILURE_LINES:
        log.warning("%s: request %s failed for good (%s); it is an error line in the output", label, custom_id, status)
    elif failed_so_far == FAILURE_LINES:
        log.warning("%s: more requests failed for good; the summary at the end counts them", label)
