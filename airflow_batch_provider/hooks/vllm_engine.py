"""The one place that imports vLLM: load the engine, read what requests need from it, shut it down.

:func:`create_engine` is the single factory VLLMGenerateOperator calls: it imports ``vllm``
(an optional extra: ``pip install 'airflow-batch-provider[vllm]'``), loads ``vllm.LLM(**engine_args)``
and returns a :class:`VLLMEngine`: the ``LLM`` plus what the request code needs from this vLLM
version and this model (the ``SamplingParams`` and structured-output classes, the error classes
vLLM raises, the model's ``max_model_len`` and runner, its ``generation_config`` sampling
defaults and a tokenizer-based prompt counter). :func:`shutdown_engine` frees the GPUs.

:func:`describe_llm` builds the same bundle around any object with ``vllm.LLM``'s interface: the
tests use it with a stand-in ``LLM`` (vLLM cannot load a model without a GPU) and vLLM's real
classes from :func:`load_classes` (they import on a CPU machine).

A worker can select another engine build without code changes: ``[llm_batch] vllm_engine_factory``
names a callable (``package.module.function``) that takes :func:`create_engine`'s arguments and
returns a :class:`VLLMEngine` (a patched vLLM, a wrapper that adds tracing, or — in the
distributed test suite, which has no GPU — a stand-in ``LLM`` over vLLM's real classes).

Supported: vLLM >= 0.11.1 (:data:`MIN_VLLM`), checked when the engine is loaded. Before it, a request
that ``LLM.chat`` refuses mid-batch left the requests added before it queued in the engine
(vllm-project/vllm issue 26081, fixed by PR 27420): the next call — the operator's bisecting retry —
got their outputs too ("vLLM returned 69 outputs for 32 requests") and the chunk failed.
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_batch_provider import settings
from airflow_batch_provider.exceptions import BatchProviderError

INSTALL_HINT = "pip install 'airflow-batch-provider[vllm]'"
MIN_VLLM = "0.11.1"

# generation_config keys ``vllm serve`` uses as per-request defaults (ModelConfig.get_diff_sampling_param).
GENERATION_DEFAULT_KEYS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_tokens",
    "skip_special_tokens",
)


class EngineUnavailableError(BatchProviderError, AirflowFailException):
    """Report that vLLM cannot be imported on this worker (not installed, too old, or a broken install).

    An AirflowFailException: a retry on the same worker finds the same install, so the task fails
    at once instead of spending its retries (route it to a worker with vLLM, then clear it).
    """


@dataclass(frozen=True)
class VLLMClasses:
    """The vLLM classes the request code uses, as found in the installed version.

    ``structured_outputs`` is ``(SamplingParams keyword, params class)``: ``("structured_outputs",
    StructuredOutputsParams)`` from vLLM 0.11, ``("guided_decoding", GuidedDecodingParams)`` on 0.10.x
    (removed in 0.12), or None. ``client_errors`` are what vLLM raises for a bad request
    (``VLLMClientError`` from 0.2x is not a ``ValueError``); ``fatal_errors`` mean the engine itself
    is gone (``EngineDeadError``): no use trying other rows.
    """

    sampling_params: Callable[..., Any]
    structured_outputs: tuple[str, Callable[..., Any]] | None
    client_errors: tuple[type[BaseException], ...] = (ValueError, TypeError)
    fatal_errors: tuple[type[BaseException], ...] = ()
    version: str = "unknown"


@dataclass
class VLLMEngine:
    """A loaded model plus what its requests need; see :func:`describe_llm`.

    ``count_prompt`` returns the prompt tokens of a chat conversation (a message list) or of an
    embedding input (a string), or None when the tokenizer cannot tell. ``bound_prompt`` returns a
    cheap upper bound of the same number (or None): where it already fits, the exact count — which
    renders the chat template and tokenizes, as vLLM does again inside ``chat`` — is skipped.
    """

    llm: Any
    classes: VLLMClasses
    max_model_len: int | None = None
    runner: str = "generate"
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    count_prompt: Callable[[Any], int | None] | None = None
    max_num_seqs: int | None = None
    bound_prompt: Callable[[Any], int | None] | None = None
    cleanup: Callable[[], Any] = gc.collect

    @property
    def version(self) -> str:
        """The installed vLLM version."""
        return self.classes.version


def _import_error(exc: BaseException) -> EngineUnavailableError:
    return EngineUnavailableError(
        f"VLLMGenerateOperator needs vLLM >= {MIN_VLLM} on the worker that runs it, but importing vllm failed "
        f"({exc}). Install the extra on your GPU workers: {INSTALL_HINT} (see docker/Dockerfile.gpu), "
        "and route the task to them with queue='gpu'."
    )


def load_classes() -> VLLMClasses:
    """Import vLLM's request classes; raise EngineUnavailableError (with the install hint) without vLLM."""
    try:
        import vllm
        from vllm import sampling_params as module
    except (ImportError, OSError) as exc:
        raise _import_error(exc) from exc
    structured: tuple[str, Callable[..., Any]] | None = None
    current = getattr(module, "StructuredOutputsParams", None)  # vLLM >= 0.11
    legacy = getattr(module, "GuidedDecodingParams", None)  # vLLM 0.10.x (removed in 0.12)
    if current is not None:
        structured = ("structured_outputs", current)
    elif legacy is not None:
        structured = ("guided_decoding", legacy)
    client: tuple[type[BaseException], ...] = (ValueError, TypeError)
    try:  # vLLM's own request-error base (0.2x); older versions raise ValueError
        from vllm.exceptions import VLLMClientError

        client = (*client, VLLMClientError)
    except ImportError:
        pass
    version = str(getattr(vllm, "__version__", "unknown"))
    check_version(version)
    fatal: tuple[type[BaseException], ...] = ()
    try:
        from vllm.v1.engine.exceptions import EngineDeadError

        fatal = (EngineDeadError,)
    except ImportError:
        pass
    return VLLMClasses(
        sampling_params=module.SamplingParams,
        structured_outputs=structured,
        client_errors=client,
        fatal_errors=fatal,
        version=version,
    )


def check_version(version: str) -> None:
    """Raise EngineUnavailableError for a vLLM older than :data:`MIN_VLLM` (an unreadable version passes)."""
    from packaging.version import InvalidVersion, Version

    try:
        too_old = Version(version) < Version(MIN_VLLM)
    except InvalidVersion:
        return
    if too_old:
        raise EngineUnavailableError(
            f"vLLM {version} is installed, VLLMGenerateOperator needs >= {MIN_VLLM}: older releases leave the "
            "requests of a batch queued when one request is refused (vllm-project/vllm issue 26081), so one bad "
            f"row would fail the whole chunk. Upgrade vLLM on the GPU workers: {INSTALL_HINT}."
        )


def create_engine(**engine_args: Any) -> VLLMEngine:
    """Import vLLM and load ``vllm.LLM(**engine_args)``; raise EngineUnavailableError with the install hint.

    With ``[llm_batch] vllm_engine_factory`` set on the worker, that factory is called instead.
    """
    factory = settings.vllm_engine_factory()
    if factory:
        return _configured_factory(factory)(**engine_args)
    return load_engine(**engine_args)


def load_engine(**engine_args: Any) -> VLLMEngine:
    """Load ``vllm.LLM(**engine_args)`` with the installed vLLM (what a configured factory can build on)."""
    classes = load_classes()
    from vllm import LLM

    engine = describe_llm(LLM(**engine_args), classes)
    engine.cleanup = _release_gpu_memory
    return engine


def _configured_factory(dotted: str) -> Callable[..., VLLMEngine]:
    module_name, _, name = dotted.rpartition(".")
    try:
        factory = getattr(importlib.import_module(module_name), name) if module_name else None
    except (ImportError, AttributeError) as exc:
        raise EngineUnavailableError(
            f"[llm_batch] vllm_engine_factory={dotted!r} cannot be imported on this worker: {exc}"
        ) from exc
    if not callable(factory):
        raise EngineUnavailableError(
            f"[llm_batch] vllm_engine_factory={dotted!r} must name a callable as package.module.function"
        )
    return factory


def describe_llm(llm: Any, classes: VLLMClasses) -> VLLMEngine:
    """Read the model's context length, runner, sampling defaults and tokenizer off a loaded ``LLM``."""
    config = _model_config(llm)
    runner = str(getattr(config, "runner_type", "generate") or "generate")
    max_len = getattr(config, "max_model_len", None)
    defaults = config.get_diff_sampling_param() if config is not None else {}
    count = _prompt_counter(llm)
    return VLLMEngine(
        llm=llm,
        classes=classes,
        max_model_len=int(max_len) if max_len else None,
        runner=runner,
        sampling_defaults={k: v for k, v in dict(defaults or {}).items() if k in GENERATION_DEFAULT_KEYS},
        count_prompt=count,
        max_num_seqs=_scheduler_max_num_seqs(llm),
        bound_prompt=_prompt_bound(count) if count is not None else None,
    )


def _model_config(llm: Any) -> Any:
    # ``LLM.model_config`` on current vLLM; ``LLM.llm_engine.model_config`` on 0.10.x.
    config = getattr(llm, "model_config", None)
    return config if config is not None else getattr(getattr(llm, "llm_engine", None), "model_config", None)


def _scheduler_max_num_seqs(llm: Any) -> int | None:
    # What vLLM really chose when max_num_seqs was left to it (it depends on the GPU).
    vllm_config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    value = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", None)
    return int(value) if isinstance(value, int) else None


def _prompt_counter(llm: Any) -> Callable[[Any], int | None] | None:
    """Return a function counting a prompt's tokens with the model's tokenizer (None without one)."""
    try:
        tokenizer = llm.get_tokenizer()
    except Exception:  # a pooling model without a tokenizer: the engine's own check still applies
        return None

    def count(prompt: Any) -> int | None:
        try:
            if isinstance(prompt, str):
                return len(tokenizer.encode(prompt))
            if isinstance(prompt, Mapping) and "prompt_token_ids" in prompt:
                return len(prompt["prompt_token_ids"])
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        except Exception:  # a template this tokenizer cannot render: leave the row to the engine
            return None
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return len(ids) if isinstance(ids, Sequence) else None

    return count


def _prompt_bound(count: Callable[[Any], int | None]) -> Callable[[Any], int | None]:
    """Return an upper bound of ``count(prompt)`` that costs no template rendering per row.

    A token covers at least one byte of text (byte-level BPE, SentencePiece with byte fallback, an
    ``<unk>`` per character), so a prompt has at most ``bytes of its text`` tokens plus what the chat
    template (or the tokenizer's special tokens) adds around it; that overhead is counted once per
    sequence of roles, on the same messages with empty contents. Messages that are not plain
    ``{"role", "content": str}`` get no bound (the exact count runs). Should a template repeat the
    content, vLLM's own check still refuses the row and the operator isolates it.
    """
    overheads: dict[tuple[str, ...] | None, int | None] = {}

    def overhead(key: tuple[str, ...] | None) -> int | None:
        if key not in overheads:
            empty: Any = "" if key is None else [{"role": role, "content": ""} for role in key]
            overheads[key] = count(empty) if key is None or key else None
        return overheads[key]

    def bound(prompt: Any) -> int | None:
        if isinstance(prompt, str):
            extra = overhead(None)
            return None if extra is None else extra + len(prompt.encode())
        if not isinstance(prompt, list):
            return None
        size, roles = 0, []
        for message in prompt:
            if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
                return None
            if not set(message) <= {"role", "content"}:
                return None
            size += len(message["content"].encode())
            roles.append(str(message.get("role")))
        extra = overhead(tuple(roles))
        return None if extra is None else extra + size

    return bound


def shutdown_engine(engine: VLLMEngine) -> None:
    """Stop the engine's worker processes and free its GPU memory now, not at interpreter exit.

    The task runner may leave the process through ``os._exit``, which skips the finalizers vLLM
    relies on; the next task on the same GPU would then find the memory taken. Calls
    ``LLM.shutdown()`` where the installed vLLM has it, else the V1 engine core client's
    ``shutdown()`` (``llm.llm_engine.engine_core``, vLLM 0.10.2 and later); then ``engine.cleanup``
    (for a real engine: vLLM's own ``cleanup_dist_env_and_memory``).
    """
    llm, engine.llm = engine.llm, None
    if llm is None:
        return
    stop = getattr(llm, "shutdown", None)
    if callable(stop):
        stop()
    else:
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
    del llm
    engine.cleanup()


def _release_gpu_memory() -> None:
    # Tears down vLLM's tensor-parallel process groups and empties the CUDA cache.
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
