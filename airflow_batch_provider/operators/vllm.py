"""VLLMGenerateOperator: answer one chunk on the worker's own GPUs with vLLM's offline engine.

Map it over ChunkOperator's output like SubmitBatchOperator; it runs on Celery queue ``gpu``
by default::

    VLLMGenerateOperator.partial(task_id="generate", model="Qwen/Qwen2.5-7B-Instruct").expand(
        chunk=chunks.output
    )

The task loads the model once (``vllm.LLM``), sends all the chunk's requests in one
``llm.chat`` (or ``llm.embed``) call so continuous batching keeps the GPU full, and writes the
OpenAI batch output format, so MergeResultsOperator merges the result unchanged. A retry
does not regenerate a chunk whose output is already complete (and does not even load the model).
A bad row becomes an error line for that row only (see :mod:`airflow_batch_provider.self_hosted.vllm_answers`);
the engine is shut down when the task ends, whatever happened.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.hooks import vllm_engine
from airflow_batch_provider.operators.self_hosted import CHUNK_LABEL_TEMPLATE, SelfHostedGenerateOperator
from airflow_batch_provider.operators.vllm_pod import DEFAULT_SHM_SIZE, gpu_executor_config
from airflow_batch_provider.self_hosted.output_lines import (
    ChunkRequest,
    ResultCounts,
    error_line,
    iter_requests,
    request_id,
    success_line,
)
from airflow_batch_provider.self_hosted.vllm_answers import Answer, run_chat, run_embed

GPU_QUEUE = "gpu"


def _check_range(name: str, value: Any, low: float, high: float | None = None, *, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    ok = isinstance(value, kind) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    if not ok:
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        what = "an integer" if integer else "a number"
        raise InvalidInputError(f"{name} must be {what} {bound}, got {value!r}.")


class _ChunkOutput:
    """Write one output line per request of a chunk and count them."""

    def __init__(self, chunk: ChunkDescriptor, requests: list[ChunkRequest], write: Callable[[bytes], Any]) -> None:
        self.fingerprint = chunk["fingerprint"]
        self.custom_ids = [r.custom_id for r in requests]
        self.request_ids = [request_id(self.fingerprint, r.index) for r in requests]
        self.write = write
        self.counts = ResultCounts()
        self.failures: Counter[str] = Counter()
        self.input_tokens = self.output_tokens = 0

    def add(self, answer: Answer) -> None:
        """Write ``answer`` as a success line (HTTP 200) or an error line with its status and code."""
        index = answer.index
        if answer.body is None:
            line = error_line(
                self.custom_ids[index],
                fingerprint=self.fingerprint,
                req_id=self.request_ids[index],
                message=answer.error or "the engine returned no answer",
                status_code=answer.status_code,
                code=answer.code,
            )
            self.failures[f"{answer.status_code} {answer.code}"] += 1
        else:
            line = success_line(
                self.custom_ids[index], answer.body, fingerprint=self.fingerprint, req_id=self.request_ids[index]
            )
            self.input_tokens += answer.input_tokens
            self.output_tokens += answer.output_tokens
        self.write(line + b"\n")
        self.counts.add(answer.body is not None)


class VLLMGenerateOperator(SelfHostedGenerateOperator):
    """Generate a chunk's answers with ``vllm.LLM`` on this worker's GPUs; return a completed batch.

    Engine arguments go to ``vllm.LLM``; None means vLLM's own default. The model is loaded once
    per task, so prefer large chunks (e.g. ``chunk_size=50_000``) to spread the load time. Sampling
    keys a request leaves unset take the model's ``generation_config`` defaults, as ``vllm serve``
    does (``engine_kwargs={"generation_config": "vllm"}`` turns that off).

    :param chunk: a chunk descriptor from ChunkOperator (``/v1/chat/completions``, ``/v1/completions``
        (answered with ``llm.generate``) or ``/v1/embeddings``).
    :param model: Hugging Face id or local path; default: the chunk's model.
    :param max_num_seqs: sequences vLLM schedules at once (its batch size); default: vLLM's (it picks
        by GPU, e.g. 1024 on H100/H200-class GPUs in current versions).
    :param gpu_memory_utilization: fraction of each GPU's memory vLLM may take (weights + KV cache);
        default: vLLM's own (0.9 in current versions), not sent.
    :param tensor_parallel_size: GPUs one model is sharded across; the worker must see that many
        (under KubernetesExecutor the task's pod asks for that many ``nvidia.com/gpu``).
    :param max_model_len: context length cap (lowers KV-cache memory); default: the model's.
    :param dtype: weights/activation dtype (``auto``, ``bfloat16``, ``float16``...).
    :param quantization: e.g. ``fp8``, ``awq``, ``gptq``; default: none / from the checkpoint.
    :param download_dir: where model weights are cached (mount a volume here).
    :param engine_kwargs: any further ``vllm.LLM`` arguments (``seed``, ``enforce_eager``,
        ``runner="pooling"`` for embedding models...). They win over the arguments above.
    :param kubernetes_shm_size: size of the memory-backed ``/dev/shm`` the task's pod mounts under
        KubernetesExecutor (None: mount none). ``executor_config={"pod_override": ...}`` wins over
        the pod this operator asks for, field by field.
    :param queue: Celery queue; ``gpu`` by default so only GPU workers pick it up.
    """

    provider: ClassVar[str] = "vllm"
    endpoints: ClassVar[tuple[str, ...]] = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
    template_fields = (*SelfHostedGenerateOperator.template_fields, "download_dir")
    ui_color = "#fde8d7"

    def __init__(
        self,
        *,
        chunk: ChunkDescriptor | dict[str, Any],
        model: str | None = None,
        max_num_seqs: int | None = None,
        gpu_memory_utilization: float | None = None,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        dtype: str = "auto",
        quantization: str | None = None,
        download_dir: str | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        kubernetes_shm_size: str | None = DEFAULT_SHM_SIZE,
        output_dir: str | None = None,
        overwrite: bool = False,
        queue: str = GPU_QUEUE,
        map_index_template: str | None = CHUNK_LABEL_TEMPLATE,
        **kwargs: Any,
    ) -> None:
        _check_range("tensor_parallel_size", tensor_parallel_size, 1, integer=True)
        kwargs["executor_config"] = gpu_executor_config(
            kwargs.get("executor_config"),
            tensor_parallel_size=tensor_parallel_size,
            shm_size=kubernetes_shm_size,
            executor=kwargs.get("executor"),
        )
        super().__init__(
            chunk=chunk,
            model=model,
            output_dir=output_dir,
            overwrite=overwrite,
            queue=queue,
            map_index_template=map_index_template,
            **kwargs,
        )
        if max_num_seqs is not None:
            _check_range("max_num_seqs", max_num_seqs, 1, integer=True)
        if gpu_memory_utilization is not None:
            _check_range("gpu_memory_utilization", gpu_memory_utilization, 0.01, 1.0)
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
        self.kubernetes_shm_size = kubernetes_shm_size

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:
        """Map the operator like any other; the GPU pod of KubernetesExecutor goes into the partial arguments.

        A mapped task's ``executor_config`` is read from ``.partial()``'s arguments (``__init__``
        only runs on the worker, after the pod exists), so it is added here too.
        """
        kwargs["executor_config"] = gpu_executor_config(
            kwargs.get("executor_config"),
            tensor_parallel_size=kwargs.get("tensor_parallel_size", 1),
            shm_size=kwargs.get("kubernetes_shm_size", DEFAULT_SHM_SIZE),
            executor=kwargs.get("executor"),
        )
        return super().partial(**kwargs)

    def engine_args(self, model: str) -> dict[str, Any]:
        """Return the keyword arguments for ``vllm.LLM`` (None-valued options left to vLLM)."""
        args: dict[str, Any] = {
            "model": model,
            "tensor_parallel_size": self.tensor_parallel_size,
            "dtype": self.dtype,
        }
        for name in ("gpu_memory_utilization", "max_num_seqs", "max_model_len", "quantization", "download_dir"):
            if getattr(self, name) is not None:
                args[name] = getattr(self, name)
        args.update(self.engine_kwargs)
        return args

    def generate(
        self, chunk: ChunkDescriptor, model: str, write: Callable[[bytes], Any]
    ) -> tuple[ResultCounts, dict[str, Any]]:
        """Load the model, answer the whole chunk in one engine call, write one line per request.

        Rows that fail in a way that may pass on another try (5xx: finish reason ``error`` or ``abort``,
        an errored embedding) are sent once more before the engine is shut down.
        """
        requests = list(iter_requests(chunk))
        out = _ChunkOutput(chunk, requests, write)
        endpoint = chunk["endpoint"]
        batch: list[tuple[int, Mapping[str, Any]]] = []
        for r in requests:
            if r.url != endpoint:
                message = f"url {r.url!r} differs from the chunk's endpoint {endpoint!r}; rebuild the chunk"
                out.add(Answer(r.index, error=message))
            else:
                batch.append((r.index, r.body))
        engine, load_seconds = self._load(chunk, model)
        try:
            started = time.monotonic()
            retry: list[tuple[int, Mapping[str, Any]]] = []
            bodies = dict(batch)
            for answer in self._answers(engine, chunk, batch, model, out.request_ids):
                if answer.body is None and answer.status_code >= 500:
                    retry.append((answer.index, bodies[answer.index]))
                else:
                    out.add(answer)
            if retry:
                # A retryable failure (engine error, abort) gets one more try while the model is loaded.
                self.log.info("%s: sending %d retryable failed requests once more", chunk["label"], len(retry))
                for answer in self._answers(engine, chunk, retry, model, out.request_ids):
                    out.add(answer)
            seconds = max(time.monotonic() - started, 1e-9)
        finally:
            self._shutdown(chunk, engine)
        if out.failures:
            self.log.warning(
                "%s: %d of %d requests are error lines (%s); the chunk's other rows succeeded",
                chunk["label"],
                out.counts.failed,
                out.counts.total,
                dict(out.failures),
            )
        return out.counts, self._stats(model, engine, out, load_seconds, seconds)

    def _load(self, chunk: ChunkDescriptor, model: str) -> tuple[vllm_engine.VLLMEngine, float]:
        self.log.info(
            "%s: loading %s with vLLM (tensor_parallel_size=%s, gpu_memory_utilization=%s, max_num_seqs=%s)",
            chunk["label"],
            model,
            self.tensor_parallel_size,
            self.gpu_memory_utilization if self.gpu_memory_utilization is not None else "vLLM's default",
            self.max_num_seqs if self.max_num_seqs is not None else "vLLM's default",
        )
        started = time.monotonic()
        engine = vllm_engine.create_engine(**self.engine_args(model))  # the only place vllm is imported
        seconds = time.monotonic() - started
        self.log.info("%s: model loaded in %.1f s (vLLM %s)", chunk["label"], seconds, engine.version)
        if engine.sampling_defaults:
            self.log.info(
                "%s: the model's generation_config fills unset sampling keys: %s",
                chunk["label"],
                engine.sampling_defaults,
            )
        return engine, seconds

    def _answers(
        self,
        engine: vllm_engine.VLLMEngine,
        chunk: ChunkDescriptor,
        batch: list[tuple[int, Mapping[str, Any]]],
        model: str,
        request_ids: list[str],
    ) -> Iterator[Answer]:
        if chunk["endpoint"] == "/v1/embeddings":
            return run_embed(engine, batch, model=model)

        def ignored(keys: list[str]) -> None:
            self.log.info("%s: request keys without a vLLM sampling parameter, ignored: %s", chunk["label"], keys)

        completions = chunk["endpoint"] == "/v1/completions"
        return run_chat(
            engine, batch, model=model, request_ids=request_ids, on_ignored=ignored, completions=completions
        )

    def _shutdown(self, chunk: ChunkDescriptor, engine: vllm_engine.VLLMEngine) -> None:
        # A failed shutdown must not hide the task's own error nor fail a chunk whose output is written.
        try:
            vllm_engine.shutdown_engine(engine)
        except Exception:
            self.log.exception("%s: shutting the vLLM engine down failed; GPU memory may stay taken", chunk["label"])
        else:
            self.log.info("%s: vLLM engine shut down, GPU memory released", chunk["label"])

    def _stats(
        self, model: str, engine: vllm_engine.VLLMEngine, out: _ChunkOutput, load_seconds: float, seconds: float
    ) -> dict[str, Any]:
        counts = out.counts
        return {
            "backend": "vllm",
            "model": model,
            "requests": counts.total,
            "succeeded": counts.succeeded,
            "failed": counts.failed,
            "failures": dict(sorted(out.failures.items())),
            "input_tokens": out.input_tokens,
            "output_tokens": out.output_tokens,
            "load_seconds": round(load_seconds, 3),
            "generate_seconds": round(seconds, 3),
            "prompts_per_s": round(counts.succeeded / seconds, 2),
            "output_tokens_per_s": round(out.output_tokens / seconds, 2),
            "tokens_per_s": round((out.input_tokens + out.output_tokens) / seconds, 2),
            "vllm_version": engine.version,
            "gpu": {
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "tensor_parallel_size": self.tensor_parallel_size,
                "max_num_seqs": engine.max_num_seqs if engine.max_num_seqs is not None else self.max_num_seqs,
                "max_model_len": engine.max_model_len or self.max_model_len,
                "dtype": self.dtype,
                "quantization": self.quantization,
            },
        }


def __getattr__(name: str) -> Any:
    # The class's old name (before it followed PEP 8): still importable, with a DeprecationWarning.
    if name == "vLLMGenerateOperator":
        warnings.warn(
            "vLLMGenerateOperator is deprecated; import VLLMGenerateOperator from "
            "airflow_batch_provider.operators.vllm instead (same class, same arguments).",
            DeprecationWarning,
            stacklevel=2,
        )
        return VLLMGenerateOperator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
