"""A stand-in for ``vllm.LLM`` built on vLLM's real request and output classes.

vLLM cannot load a model without a GPU, and this machine has none; but vLLM's Python modules
import on a CPU (``make vllm-classes`` installs ``vllm`` without its CUDA dependencies beside
the CPU build of torch). So only the model is stood in for: :class:`StandInLLM` has
``vllm.LLM``'s ``chat`` / ``embed`` signatures, takes real ``SamplingParams`` (built and
validated by vLLM itself), checks prompt lengths with vLLM's own rule and raises vLLM's own
``VLLMValidationError``, drops every queued request when one fails (as ``LLM`` does), and answers
with real ``RequestOutput`` / ``CompletionOutput`` / ``EmbeddingRequestOutput`` objects. Its
"tokenizer" counts words (plus a fixed chat-template overhead); its answers are deterministic.

Faults are scripted by a marker in the prompt text: ``finish_reasons`` ("error", "abort"),
``embedding_errors`` (vLLM's empty-vector answer) and ``raise_on`` (an exception from the call).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from airflow_batch_provider.hooks import vllm_engine
from airflow_batch_provider.hooks.vllm_engine import VLLMClasses, VLLMEngine

LABELS = ["electronics", "clothing", "home", "sports", "toys", "beauty", "books", "grocery"]
TEMPLATE_TOKENS = 3  # what the stand-in chat template adds around the messages


def real_classes() -> VLLMClasses:
    """vLLM's real classes, through the production loader; fail (never skip) when vLLM is not installed."""
    try:
        return vllm_engine.load_classes()
    except vllm_engine.EngineUnavailableError as exc:
        pytest.fail(f"vLLM's classes must import for these tests; run `make vllm-classes` ({exc})")


def words(text: str) -> list[int]:
    """The stand-in tokenizer: one token per whitespace-separated word."""
    return [len(word) for word in text.split()]


def stand_in_label(messages: list[dict[str, Any]]) -> str:
    """The stand-in model's deterministic answer for a conversation."""
    digest = hashlib.sha256(orjson.dumps(messages)).digest()
    return LABELS[digest[0] % len(LABELS)]


class StandInTokenizer:
    """``encode`` and ``apply_chat_template`` over :func:`words`."""

    def encode(self, text: str) -> list[int]:
        return words(text)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, list[int]]:
        ids = [t for m in messages for t in words(str(m.get("content", "")))]
        return {"input_ids": [0] * TEMPLATE_TOKENS + ids}  # transformers 5 returns a BatchEncoding


@dataclass
class StandInEngineCore:
    shutdowns: int = 0

    def shutdown(self, timeout: float | None = None) -> None:
        self.shutdowns += 1


@dataclass
class StandInLLM:
    """``vllm.LLM``'s surface the operator uses, answering deterministically with vLLM's output classes."""

    engine_args: dict[str, Any] = field(default_factory=dict)
    max_model_len: int = 4096
    runner_type: str = "generate"
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    finish_reasons: dict[str, str] = field(default_factory=dict)
    faults_once: bool = False  # finish_reasons and embedding_errors hit the first call only
    embedding_errors: set[str] = field(default_factory=set)
    raise_on: dict[str, Exception] = field(default_factory=dict)
    chat_calls: list[tuple[list[Any], list[Any]]] = field(default_factory=list)
    embed_calls: list[list[Any]] = field(default_factory=list)
    engine_core: StandInEngineCore = field(default_factory=StandInEngineCore)

    def __post_init__(self) -> None:
        self.max_model_len = self.engine_args.get("max_model_len", self.max_model_len)
        scheduler = type("S", (), {"max_num_seqs": self.engine_args.get("max_num_seqs", 1024)})()
        self.llm_engine = type("E", (), {"engine_core": self.engine_core, "vllm_config": None})()
        self.llm_engine.vllm_config = type("V", (), {"scheduler_config": scheduler})()
        self.model_config = type(
            "M",
            (),
            {
                "max_model_len": self.max_model_len,
                "runner_type": self.runner_type,
                "get_diff_sampling_param": lambda _self: dict(self.generation_defaults),
            },
        )()

    def get_tokenizer(self) -> StandInTokenizer:
        return StandInTokenizer()

    def _check(self, prompt_len: int) -> None:
        # vLLM's InputProcessor._validate_prompt_len, word for word in behaviour.
        from vllm.exceptions import VLLMValidationError

        if prompt_len == 0:
            raise VLLMValidationError("The decoder prompt cannot be empty")
        if prompt_len > self.max_model_len or (prompt_len == self.max_model_len and self.runner_type == "generate"):
            raise VLLMValidationError(
                f"The decoder prompt (length {prompt_len}) is longer than the maximum model length of "
                f"{self.max_model_len}."
            )

    def _scripted_raise(self, texts: list[str]) -> None:
        for marker, exc in self.raise_on.items():
            if any(marker in text for text in texts):
                raise exc

    def chat(self, messages: Any, sampling_params: Any = None, use_tqdm: bool = True, **kwargs: Any) -> list[Any]:
        from vllm.outputs import CompletionOutput, RequestOutput

        assert isinstance(sampling_params, list) and len(sampling_params) == len(messages)
        texts = ["\n".join(str(m["content"]) for m in conversation) for conversation in messages]
        for text in texts:  # like LLM: every request is rendered and checked before any runs
            self._check(TEMPLATE_TOKENS + len(words(text)))
        self._scripted_raise(texts)
        self.chat_calls.append((messages, sampling_params))
        outputs = []
        for i, (conversation, params, prompt) in enumerate(zip(messages, sampling_params, texts)):
            answer, token_ids, finish = self._answer(conversation, params, prompt)
            if self.faults_once and len(self.chat_calls) > 1 and finish in ("error", "abort"):
                answer, token_ids, finish = stand_in_label(conversation), [1], "stop"
            completion = CompletionOutput(
                index=0, text=answer, token_ids=token_ids, cumulative_logprob=None, logprobs=None, finish_reason=finish
            )
            prompt_ids = [0] * TEMPLATE_TOKENS + words(prompt)
            outputs.append(RequestOutput(str(i), prompt, prompt_ids, None, [completion], finished=True))
        return outputs

    def _answer(self, conversation: list[dict[str, Any]], params: Any, prompt: str) -> tuple[str, list[int], str]:
        for marker, reason in self.finish_reasons.items():
            if marker in prompt:
                return "", [], reason
        structured = getattr(params, "structured_outputs", None)
        text = stand_in_label(conversation)
        if structured is not None and structured.json is not None:
            text = orjson.dumps({"label": text}).decode()
        token_ids = words(text) or [0]
        if params.max_tokens is not None and len(token_ids) > params.max_tokens:
            return text, token_ids[: params.max_tokens], "length"
        return text, token_ids, "stop"

    def embed(self, prompts: Any, *, use_tqdm: bool = True, **kwargs: Any) -> list[Any]:
        from vllm.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestError

        texts = [p if isinstance(p, str) else orjson.dumps(p).decode() for p in prompts]
        for prompt in prompts:
            self._check(len(words(prompt)) if isinstance(prompt, str) else len(prompt["prompt_token_ids"]))
        self._scripted_raise(texts)
        self.embed_calls.append(list(prompts))
        outputs = []
        for i, text in enumerate(texts):
            error = None
            vector = [b / 255.0 for b in hashlib.sha256(text.encode()).digest()[:8]]
            failing = not (self.faults_once and len(self.embed_calls) > 1)
            if failing and any(marker in text for marker in self.embedding_errors):
                # What EmbeddingRequestOutput.from_base makes of a failed pooling request.
                error, vector = RequestError(code="pooling_error", message="pooler failed", retryable=True), []
            outputs.append(EmbeddingRequestOutput(str(i), EmbeddingOutput(vector), words(text), 0, True, error=error))
        return outputs


class StandInFactory:
    """Replaces ``vllm_engine.create_engine``: records each model load and wraps a stand-in LLM."""

    def __init__(self, classes: VLLMClasses | None = None, **llm_options: Any) -> None:
        self.classes = classes or real_classes()
        self.llm_options = llm_options
        self.loads: list[dict[str, Any]] = []
        self.llm: StandInLLM | None = None
        self.engine: VLLMEngine | None = None

    def __call__(self, **engine_args: Any) -> VLLMEngine:
        self.loads.append(engine_args)
        self.llm = StandInLLM(engine_args=engine_args, **self.llm_options)
        self.engine = vllm_engine.describe_llm(self.llm, self.classes)
        return self.engine
