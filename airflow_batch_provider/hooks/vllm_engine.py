"""The one place that imports vLLM: load the engine, read what requests need from it, shut it down.

:func:`create_engine` is the single factory vLLMGenerateOperator calls: it imports ``vllm``
(an optional extra: ``pip install 'airflow-batch-provider[vllm]'``), loads ``vllm.LLM(**engine_args)``
and returns a :class:`VLLMEngine`: the ``LLM`` plus what the request code needs from this vLLM
version and this model (the ``SamplingParams`` and structured-output classes, the error classes
vLLM raises, the model's ``max_model_len`` and runner, its ``generation_config`` sampling
defaults and a tokenizer-based prompt counter). :func:`shutdown_engine` frees the GPUs.

:func:`describe_llm` builds the same bundle around any object with ``vllm.LLM``'s interface: the
tests use it with a stand-in ``LLM`` (vLLM cannot load a model without a GPU) and vLLM's real
classes from :func:`load_classes` (they import on a CPU machine).

A worker can select another engine build without code changes: ``$AIRFLOW_BATCH_VLLM_ENGINE_FACTORY``
names a callable (``package.module.function``) that takes :func:`create_engine`'s arguments and
returns a :class:`VLLMEngine` (a patched vLLM, a wrapper that adds tracing, or — in the
distributed test suite, which has no GPU — a stand-in ``LLM`` over vLLM's real classes).

Supported: vLLM >= 0.10.2 (:data:`MIN_VLLM`), the first release with ``runner="pooling"`` whose
default (V1) engine compiles the JSON schemas ChunkOperator writes (``enum``, ``pattern``, bounds).
"""

from __future__ import annotations

import gc
import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_batch_provider.exceptions import BatchProviderError

INSTALL_HINT = "pip install 'airflow-batch-provider[vllm]'"
MIN_VLLM = "0.10.2"
# Set on a worker to load engines through another factory (see the module docstring).
ENGINE_FACTORY_ENV = "AIRFLOW_BATCH_VLLM_ENGINE_FACTORY"

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


class EngineUnavailableError(BatchProviderError):
    """Report that vLLM cannot be imported on this worker (not installed, or a broken install)."""


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
    embedding input (a string), or None when the tokenizer cannot tell.
    """

    llm: Any
    classes: VLLMClasses
    max_model_len: int | None = None
    runner: str = "generate"
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    count_prompt: Callable[[Any], int | None] | None = None
    max_num_seqs: int | None = None
    cleanup: Callable[[], Any] = gc.collect

    @property
    def version(self) -> str:
        """The installed vLLM version."""
        return self.classes.version


def _import_error(exc: BaseException) -> EngineUnavailableError:
    return EngineUnavailableError(
        f"vLLMGenerateOperator needs vLLM >= {MIN_VLLM} on the worker that runs it, but importing vllm failed "
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
        version=str(getattr(vllm, "__version__", "unknown")),
    )


def create_engine(**engine_args: Any) -> VLLMEngine:
    """Import vLLM and load ``vllm.LLM(**engine_args)``; raise EngineUnavailableError with the install hint.

    With ``$AIRFLOW_BATCH_VLLM_ENGINE_FACTORY`` set on the worker, that factory is called instead.
    """
    factory = os.environ.get(ENGINE_FACTORY_ENV)
    if factory:
        return _configured_factory(factory)(**engine_args)
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
            f"{ENGINE_FACTORY_ENV}={dotted!r} cannot be imported on this worker: {exc}"
        ) from exc
    if not callable(factory):
        raise EngineUnavailableError(f"{ENGINE_FACTORY_ENV}={dotted!r} must name a callable as package.module.function")
    return factory


def describe_llm(llm: Any, classes: VLLMClasses) -> VLLMEngine:
    """Read the model's context length, runner, sampling defaults and tokenizer off a loaded ``LLM``."""
    config = _model_config(llm)
    runner = str(getattr(config, "runner_type", "generate") or "generate")
    max_len = getattr(config, "max_model_len", None)
    defaults = config.get_diff_sampling_param() if config is not None else {}
    return VLLMEngine(
        llm=llm,
        classes=classes,
        max_model_len=int(max_len) if max_len else None,
        runner=runner,
        sampling_defaults={k: v for k, v in dict(defaults or {}).items() if k in GENERATION_DEFAULT_KEYS},
        count_prompt=_prompt_counter(llm),
        max_num_seqs=_scheduler_max_num_seqs(llm),
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
