"""vLLMGenerateOperator: answer one chunk on the worker's own GPUs with vLLM's offline engine.

Map it over ChunkOperator's output like SubmitBatchOperator; it runs on Celery queue ``gpu``
by default::

    vLLMGenerateOperator.partial(task_id="generate", model="Qwen/Qwen2.5-7B-Instruct").expand(
        chunk=chunks.output
    )

The task loads the model once (``vllm.LLM``), sends all the chunk's requests in one
``llm.chat`` (or ``llm.embed``) call so continuous batching keeps the GPU full, and writes the
OpenAI batch output format, so MergeResultsOperator merges the result unchanged. A retry
does not regenerate a chunk whose output is already complete (and does not even load the model).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.hooks import vllm_engine
from airflow_batch_provider.hooks.local_results import (
    ResultCounts,
    error_line,
    iter_requests,
    request_id,
    success_line,
)
from airflow_batch_provider.operators.self_hosted import CHUNK_LABEL_TEMPLATE, SelfHostedGenerateOperator

GPU_QUEUE = "gpu"


def _check_range(name: str, value: Any, low: float, high: float | None = None, *, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    ok = isinstance(value, kind) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    if not ok:
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        what = "an integer" if integer else "a number"
        raise InvalidInputError(f"{name} must be {what} {bound}, got {value!r}.")


class vLLMGenerateOperator(SelfHostedGenerateOperator):
    """Generate a chunk's answers with ``vllm.LLM`` on this worker's GPUs; return a completed batch.

    Engine arguments go to ``vllm.LLM``; None means vLLM's own default. The model is loaded once
    per task, so prefer large chunks (e.g. ``chunk_size=50_000``) to spread the load time.

    :param chunk: a chunk descriptor from ChunkOperator (``/v1/chat/completions`` or ``/v1/embeddings``).
    :param model: Hugging Face id or local path; default: the chunk's model.
    :param max_num_seqs: sequences vLLM schedules at once (its batch size).
    :param gpu_memory_utilization: fraction of each GPU's memory vLLM may take (weights + KV cache).
    :param tensor_parallel_size: GPUs one model is sharded across; the worker must see that many.
    :param max_model_len: context length cap (lowers KV-cache memory); default: the model's.
    :param dtype: weights/activation dtype (``auto``, ``bfloat16``, ``float16``...).
    :param quantization: e.g. ``fp8``, ``awq``, ``gptq``; default: none / from the checkpoint.
    :param download_dir: where model weights are cached (mount a volume here).
    :param engine_kwargs: any further ``vllm.LLM`` arguments (``seed``, ``enforce_eager``,
        ``runner="pooling"`` for embedding models...). They win over the arguments above.
    :param queue: Celery queue; ``gpu`` by default so only GPU workers pick it up.
    """

    provider: ClassVar[str] = "vllm"
    template_fields = (*SelfHostedGenerateOperator.template_fields, "download_dir")
    ui_color = "#fde8d7"

    def __init__(
        self,
        *,
        chunk: ChunkDescriptor | dict[str, Any],
        model: str | None = None,
        max_num_seqs: int = 256,
        gpu_memory_utilization: float = 0.90,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        dtype: str = "auto",
        quantization: str | None = None,
        download_dir: str | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        output_dir: str | None = None,
        overwrite: bool = False,
        queue: str = GPU_QUEUE,
        map_index_template: str | None = CHUNK_LABEL_TEMPLATE,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            chunk=chunk,
            model=model,
            output_dir=output_dir,
            overwrite=overwrite,
            queue=queue,
            map_index_template=map_index_template,
            **kwargs,
        )
        _check_range("max_num_seqs", max_num_seqs, 1, integer=True)
        _check_range("gpu_memory_utilization", gpu_memory_utilization, 0.01, 1.0)
        _check_range("tensor_parallel_size", tensor_parallel_size, 1, integer=True)
        if max_model_len is not None:
            _check_range("max_model_len", max_model_len, 1, integer=True)
        self.max_num_seqs = max_num_seqs
        self.gpu_memory_utilization = gpu_memory_utilization
        self.tensor_parallel_size = tensor_parallel_size
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.quantization = quantization
        self.download_dir = download_dir
        self.engine_kwargs = dict(engine_kwargs or {})

    def engine_args(self, model: str) -> dict[str, Any]:
        """Return the keyword arguments for ``vllm.LLM`` (None-valued options left to vLLM)."""
        args: dict[str, Any] = {
            "model": model,
            "max_num_seqs": self.max_num_seqs,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "dtype": self.dtype,
        }
        for name in ("max_model_len", "quantization", "download_dir"):
            if getattr(self, name) is not None:
                args[name] = getattr(self, name)
        args.update(self.engine_kwargs)
        return args

    def generate(
        self, chunk: ChunkDescriptor, model: str, write: Callable[[bytes], Any]
    ) -> tuple[ResultCounts, dict[str, Any]]:
        """Load the model, answer the whole chunk in one engine call, write one line per request."""
        fingerprint = chunk["fingerprint"]
        requests = list(iter_requests(chunk))
        custom_ids = [r.custom_id for r in requests]
        request_ids = [request_id(fingerprint, r.index) for r in requests]
        counts = ResultCounts()

        def fail(index: int, message: str) -> None:
            write(
                error_line(
                    custom_ids[index],
                    fingerprint=fingerprint,
                    req_id=request_ids[index],
                    message=message,
                    status_code=400,
                    code="invalid_request_error",
                )
                + b"\n"
            )
            counts.add(False)

        endpoint = chunk["endpoint"]
        batch: list[tuple[int, Mapping[str, Any]]] = []
        for r in requests:
            if r.url != endpoint:
                fail(r.index, f"url {r.url!r} differs from the chunk's endpoint {endpoint!r}")
            else:
                batch.append((r.index, r.body))

        args = self.engine_args(model)
        self.log.info(
            "%s: loading %s with vLLM (tensor_parallel_size=%s, gpu_memory_utilization=%s, max_num_seqs=%s)",
            chunk["label"],
            model,
            self.tensor_parallel_size,
            self.gpu_memory_utilization,
            self.max_num_seqs,
        )
        load_started = time.monotonic()
        engine = vllm_engine.create_engine(**args)  # the only place vllm is imported
        load_seconds = time.monotonic() - load_started
        self.log.info("%s: model loaded in %.1f s (vLLM %s)", chunk["label"], load_seconds, engine.version)

        def ignored(keys: list[str]) -> None:
            self.log.info("%s: request keys without a vLLM sampling parameter, ignored: %s", chunk["label"], keys)

        started = time.monotonic()
        if endpoint == "/v1/embeddings":
            answers = vllm_engine.run_embed(engine, batch, model=model)
        else:
            answers = vllm_engine.run_chat(engine, batch, model=model, request_ids=request_ids, on_ignored=ignored)
        input_tokens = output_tokens = 0
        for answer in answers:
            if answer.body is None:
                fail(answer.index, answer.error or "the engine returned no answer")
                continue
            write(
                success_line(
                    custom_ids[answer.index], answer.body, fingerprint=fingerprint, req_id=request_ids[answer.index]
                )
                + b"\n"
            )
            counts.add(True)
            input_tokens += answer.input_tokens
            output_tokens += answer.output_tokens
        seconds = max(time.monotonic() - started, 1e-9)
        stats = {
            "backend": "vllm",
            "model": model,
            "requests": counts.total,
            "succeeded": counts.succeeded,
            "failed": counts.failed,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "load_seconds": round(load_seconds, 3),
            "generate_seconds": round(seconds, 3),
            "prompts_per_s": round(counts.succeeded / seconds, 2),
            "output_tokens_per_s": round(output_tokens / seconds, 2),
            "tokens_per_s": round((input_tokens + output_tokens) / seconds, 2),
            "vllm_version": engine.version,
            "gpu": {
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "tensor_parallel_size": self.tensor_parallel_size,
                "max_num_seqs": self.max_num_seqs,
                "max_model_len": self.max_model_len,
                "dtype": self.dtype,
                "quantization": self.quantization,
            },
        }
        return counts, stats
