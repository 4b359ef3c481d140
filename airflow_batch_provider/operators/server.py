"""ServerGenerateOperator: answer one chunk through an OpenAI-compatible inference server.

For a model served by ``vllm serve`` (``--max-num-seqs 256``), TGI or llama.cpp's server, on
your own GPUs. Map it over ChunkOperator's output::

    ServerGenerateOperator.partial(task_id="generate", conn_id="openai_compatible_default").expand(
        chunk=chunks.output
    )

Requests go out at most ``max_concurrency`` at a time (default 64: enough to keep a server's
continuous batching full, few enough not to pile the whole chunk into its queue), fewer while the
server turns requests away with 429 (the limit halves, then grows back); 429/5xx and connection
errors are retried with jittered backoff, and a request that still fails is written as an error
line — one bad row never fails the chunk. A task retry or a clear sends only the rows that failed
retryably again and keeps every other line. The output is the OpenAI batch output format, so
MergeResultsOperator merges it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.operators.self_hosted import CHUNK_LABEL_TEMPLATE, SelfHostedGenerateOperator
from airflow_batch_provider.self_hosted.output_lines import ResultCounts, iter_requests, request_id
from airflow_batch_provider.utils.checks import check_int
from airflow_batch_provider.utils.retry import RetryPolicy

if TYPE_CHECKING:  # imported where used: the openai SDK costs ~0.35 s on every parse of a DAG file using this
    from airflow_batch_provider.hooks.openai_compatible import OpenAICompatibleHook

DEFAULT_MAX_CONCURRENCY = 64


class ServerGenerateOperator(SelfHostedGenerateOperator):
    """Send a chunk's requests to an OpenAI-compatible server; return the chunk as a completed batch.

    :param chunk: a chunk descriptor from ChunkOperator (``/v1/chat/completions`` or ``/v1/embeddings``).
    :param conn_id: connection of type ``openai_compatible`` (default ``openai_compatible_default``).
    :param model: model name the server serves; replaces each request's ``model`` when given.
    :param max_concurrency: the most requests in flight at once; fewer while the server answers 429.
    :param request_retry_policy: attempts and backoff per request (default 8 attempts, 1 s doubling
        to 30 s; ``retry_policy`` is Airflow's own, for task retries).
    :param timeout: seconds per request.
    :param priority: sent as each request's ``priority`` field (vLLM under
        ``--scheduling-policy priority``: lower is served first, real-time traffic uses 0); give
        batch work a higher number so real-time requests on the same server never wait behind it.
        None (default) sends no field (a vLLM server without that policy refuses a non-zero one).
    """

    provider: ClassVar[str] = "server"
    template_fields = (*SelfHostedGenerateOperator.template_fields, "conn_id")
    ui_color = "#f0e6fa"

    def __init__(
        self,
        *,
        chunk: ChunkDescriptor | dict[str, Any],
        conn_id: str | None = None,
        model: str | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        request_retry_policy: RetryPolicy | None = None,
        timeout: float = 600.0,
        priority: int | None = None,
        output_dir: str | None = None,
        overwrite: bool = False,
        map_index_template: str | None = CHUNK_LABEL_TEMPLATE,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            chunk=chunk,
            model=model,
            output_dir=output_dir,
            overwrite=overwrite,
            map_index_template=map_index_template,
            **kwargs,
        )
        check_int("max_concurrency", max_concurrency, 1)
        self.conn_id = conn_id
        self.max_concurrency = max_concurrency
        self.request_retry_policy = request_retry_policy
        self.timeout = timeout
        self.priority = priority

    def hook(self) -> OpenAICompatibleHook:
        """Return the hook on ``conn_id``."""
        from airflow_batch_provider.hooks.openai_compatible import OpenAICompatibleHook

        return OpenAICompatibleHook(self.conn_id, retry_policy=self.request_retry_policy, timeout=self.timeout)

    def generate(
        self, chunk: ChunkDescriptor, model: str, write: Callable[[bytes], Any]
    ) -> tuple[ResultCounts, dict[str, Any]]:
        """Send every request (bounded concurrency, retried) and write one output line each."""
        from airflow_batch_provider.hooks.openai_compatible import ServerRequest

        hook = self.hook()
        extra: dict[str, Any] = {"model": self.model} if self.model else {}
        if self.priority is not None:
            extra["priority"] = self.priority

        def requests() -> Iterator[ServerRequest]:
            for r in iter_requests(chunk):
                body = {**r.body, **extra} if extra else r.body
                yield ServerRequest(r.index, r.custom_id, r.url, body, request_id(chunk["fingerprint"], r.index))

        self.log.info(
            "%s: sending %d requests to %s (max %d in flight)",
            chunk["label"],
            chunk["num_requests"],
            hook.base_url,
            self.max_concurrency,
        )
        run = hook.run(
            requests(),
            fingerprint=chunk["fingerprint"],
            write=write,
            max_concurrency=self.max_concurrency,
            total=chunk["num_requests"],
            label=chunk["label"],
        )
        seconds = max(run.seconds, 1e-9)
        stats = {
            "backend": "server",
            "base_url": hook.base_url,
            "model": model,
            "requests": run.counts.total,
            "succeeded": run.counts.succeeded,
            "failed": run.counts.failed,
            "status_codes": dict(sorted(run.status_codes.items())),
            "input_tokens": run.input_tokens,
            "output_tokens": run.output_tokens,
            "generate_seconds": round(seconds, 3),
            "prompts_per_s": round(run.counts.total / seconds, 2),
            "output_tokens_per_s": round(run.output_tokens / seconds, 2),
            "tokens_per_s": round((run.input_tokens + run.output_tokens) / seconds, 2),
            "max_concurrency": self.max_concurrency,
            "max_in_flight": run.max_in_flight,
            "throttled": run.throttled,
            "lowest_concurrency": run.lowest_concurrency,
        }
        if run.counts.failed:
            self.log.warning(
                "%s: %d of %d requests still failed after retries (%s); they are error lines in the output",
                chunk["label"],
                run.counts.failed,
                run.counts.total,
                stats["status_codes"],
            )
        return run.counts, stats
