"""Send a chunk's requests to a loaded vLLM engine and turn what comes back into one answer per row.

:func:`run_chat` and :func:`run_embed` send every valid row of a chunk in ONE ``llm.chat`` /
``llm.embed`` call (so vLLM's continuous batching keeps the GPU full) and yield one
:class:`Answer` per row: an OpenAI response body, or an error with an HTTP-like status.

One bad row never sinks the chunk:

- rows whose parameters vLLM refuses, or whose prompt does not fit ``max_model_len``, are answered
  with a final error (400) and left out of the call (:mod:`~airflow_batch_provider.self_hosted.vllm_requests`);
- when the engine call still raises (a check vLLM makes that this package does not), the rows are
  split in halves and sent again until the offending rows are alone (:func:`isolate`); each one
  becomes an error line, final (400) for a request error, retryable (500) otherwise;
- requests vLLM itself reports as failed — finish reason ``error`` or ``abort``, an ``error`` on the
  output (a grammar that did not compile), an empty embedding — are error lines, not 200s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from airflow_batch_provider.exceptions import BatchProviderError
from airflow_batch_provider.hooks.vllm_engine import VLLMEngine
from airflow_batch_provider.self_hosted.output_lines import chat_completion_body, embedding_body, text_completion_body
from airflow_batch_provider.self_hosted.vllm_requests import (
    RowRejected,
    build_sampling_params,
    completion_prompt,
    embedding_inputs,
    prompt_too_long,
)

# Rows that failed alone with an engine (not a request) error, with no engine call succeeding before
# them: past this many the engine, not the rows, is at fault, and the task fails (Airflow retries it)
# instead of erroring every row.
MAX_FAILURES_BEFORE_ANY_SUCCESS = 8

T = TypeVar("T")


@dataclass
class Answer:
    """One request's answer: an OpenAI response body, or an error message with its status and code.

    ``status_code`` 400 is final (the same request fails again); 5xx is retryable.
    """

    index: int
    body: dict[str, Any] | None = None
    error: str | None = None
    status_code: int = 400
    code: str = "invalid_request_error"
    input_tokens: int = 0
    output_tokens: int = 0


def rejected(index: int, exc: RowRejected) -> Answer:
    """Return the final error answer of a row refused before the engine call."""
    return Answer(index, error=str(exc), status_code=400, code=exc.code)


# ------------------------------------------------------------------------------------ isolation


class _Tally:
    """Count isolated engine failures; raise when they say the engine, not the rows, is broken.

    A request error (``client_errors``: vLLM's validation of that one row) says nothing about the
    engine, so it is not counted: eight bad rows at the front of a healthy chunk stay eight 400 lines.
    """

    def __init__(self, client_errors: tuple[type[BaseException], ...] = ()) -> None:
        self.client_errors = client_errors
        self.succeeded = False
        self.failures = 0

    def failed(self, exc: BaseException) -> None:
        if isinstance(exc, self.client_errors):
            return
        self.failures += 1
        if not self.succeeded and self.failures >= MAX_FAILURES_BEFORE_ANY_SUCCESS:
            raise BatchProviderError(
                f"the vLLM engine failed on {self.failures} requests sent one by one and answered none "
                f"({type(exc).__name__}: {exc}); this is an engine fault, not bad rows. The task fails so "
                "that Airflow retries it; check the worker's GPU and the model's engine arguments."
            ) from exc


def isolate(
    items: Sequence[T],
    call: Callable[[Sequence[T]], Sequence[Any]],
    *,
    fatal: tuple[type[BaseException], ...] = (),
    client_errors: tuple[type[BaseException], ...] = (),
) -> Iterator[tuple[T, Any | Exception]]:
    """Yield ``(item, output)`` for every item, calling ``call`` once when it can; bisect when it raises.

    A call that raises is retried on each half, down to single items; a single item whose call
    raises is yielded with the exception instead of an output. ``fatal`` exceptions (the engine is
    dead) propagate at once, as does an engine that fails (other than with ``client_errors``, a bad
    request) on every row it is given.
    """
    yield from _bisect(list(items), call, fatal, _Tally(client_errors))


def _bisect(
    items: list[T], call: Callable[[Sequence[T]], Sequence[Any]], fatal: tuple[type[BaseException], ...], tally: _Tally
) -> Iterator[tuple[T, Any | Exception]]:
    if not items:
        return
    try:
        outputs = call(items)
    except fatal:
        raise
    except Exception as exc:
        if len(items) == 1:
            tally.failed(exc)
            yield items[0], exc
            return
        middle = len(items) // 2
        yield from _bisect(items[:middle], call, fatal, tally)
        yield from _bisect(items[middle:], call, fatal, tally)
        return
    if len(outputs) != len(items):
        raise BatchProviderError(f"vLLM returned {len(outputs)} outputs for {len(items)} requests.")
    tally.succeeded = True
    yield from zip(items, outputs)


def engine_failure(engine: VLLMEngine, index: int, exc: Exception) -> Answer:
    """Return the error answer of a row the engine raised on when sent alone."""
    message = f"vLLM refused this request when sent alone ({type(exc).__name__}: {exc})"
    if isinstance(exc, engine.classes.client_errors):
        return Answer(index, error=message, status_code=400, code="invalid_request_error")
    return Answer(index, error=message, status_code=500, code="server_error")


def reported_failure(index: int, error: Any, finish_reason: str | None) -> Answer | None:
    """Return the error answer for an output vLLM marked as failed, or None for a real answer.

    ``error`` is the output's ``RequestError`` (vLLM 0.2x: ``code``, ``message``, ``retryable``;
    ``validation_error`` covers grammars that did not compile). Finish reason ``error`` is vLLM's
    retryable internal error; ``abort`` means the engine dropped the request.
    """
    if error is not None:
        code = str(getattr(error, "code", "") or "engine_error")
        message = f"vLLM failed this request ({code}): {getattr(error, 'message', error)}"
        if code == "validation_error":
            return Answer(index, error=message, status_code=400, code="invalid_request_error")
        if getattr(error, "retryable", False):
            return Answer(index, error=message, status_code=500, code="server_error")
        return Answer(index, error=message, status_code=422, code="engine_error")
    if finish_reason == "error":
        return Answer(
            index, error="vLLM ended this request with an internal error", status_code=500, code="server_error"
        )
    if finish_reason == "abort":
        return Answer(index, error="vLLM aborted this request", status_code=503, code="engine_aborted")
    return None


# ------------------------------------------------------------------------------------ chat and completions


@dataclass
class _ChatRow:
    index: int
    messages: Any  # a chat's message list, or a completion's prompt
    params: Any
    structured: bool


def _prompt(body: Mapping[str, Any], completions: bool) -> Any:
    if completions:
        return completion_prompt(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RowRejected("'messages' must be a non-empty array.")
    return messages


def _prepare_chat(
    engine: VLLMEngine, requests: Sequence[tuple[int, Mapping[str, Any]]], ignored: set[str], completions: bool
) -> tuple[list[_ChatRow], list[Answer]]:
    rows: list[_ChatRow] = []
    refused: list[Answer] = []
    for index, body in requests:
        try:
            messages = _prompt(body, completions)
            params, skipped = build_sampling_params(engine, body)
            too_long = prompt_too_long(engine, messages)
            if too_long is not None:
                raise too_long
        except RowRejected as exc:
            refused.append(rejected(index, exc))
            continue
        ignored.update(skipped)
        rows.append(_ChatRow(index, messages, params, structured=body.get("response_format") is not None))
    return rows, refused


def run_chat(
    engine: VLLMEngine,
    requests: Sequence[tuple[int, Mapping[str, Any]]],
    *,
    model: str,
    request_ids: Sequence[str],
    on_ignored: Callable[[list[str]], None] | None = None,
    completions: bool = False,
) -> Iterator[Answer]:
    """Answer ``(index, chat body)`` pairs with one ``llm.chat`` call; yield an :class:`Answer` per pair.

    With ``completions`` the bodies are ``/v1/completions`` requests, answered with one ``llm.generate``.
    ``request_ids[index]`` becomes the completion id of the request at ``index``.
    """
    ignored: set[str] = set()
    rows, refused = _prepare_chat(engine, requests, ignored, completions)
    yield from refused
    if ignored and on_ignored is not None:
        on_ignored(sorted(ignored))

    def call(batch: Sequence[_ChatRow]) -> Sequence[Any]:
        prompts, params = [r.messages for r in batch], [r.params for r in batch]
        if completions:
            return engine.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        return engine.llm.chat(prompts, sampling_params=params, use_tqdm=False)

    for row, output in isolate(
        rows, call, fatal=engine.classes.fatal_errors, client_errors=engine.classes.client_errors
    ):
        if isinstance(output, Exception):
            yield engine_failure(engine, row.index, output)
        else:
            yield _chat_answer(row, output, model=model, completion_id=request_ids[row.index], completions=completions)


def _chat_answer(row: _ChatRow, output: Any, *, model: str, completion_id: str, completions: bool) -> Answer:
    index = row.index
    completion = output.outputs[0] if output.outputs else None
    finish = completion.finish_reason if completion is not None else None
    if finish == "error" and row.structured and completion is not None and not completion.token_ids:
        # vLLM ends a request whose grammar does not compile with finish reason "error" before any
        # token; the same schema fails again on retry, so the row's error is final.
        return Answer(
            index,
            error="vLLM ended this structured-output request before generating anything: its grammar backend "
            "could not compile the response schema (the worker log says 'Failed to compile grammar'). "
            "Simplify the schema or change structured_outputs_config's backend.",
            status_code=400,
            code="invalid_request_error",
        )
    failure = reported_failure(index, getattr(output, "error", None), finish)
    if failure is not None:
        return failure
    if completion is None:
        return Answer(index, error="vLLM returned no completion for this request", status_code=500, code="server_error")
    prompt_tokens = len(output.prompt_token_ids or ())
    completion_tokens = len(completion.token_ids or ())
    make_body = text_completion_body if completions else chat_completion_body
    body = make_body(
        completion_id=completion_id,
        model=model,
        text=completion.text,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )
    return Answer(index, body=body, input_tokens=prompt_tokens, output_tokens=completion_tokens)


# ------------------------------------------------------------------------------------ embeddings


def _prepare_embed(
    engine: VLLMEngine, requests: Sequence[tuple[int, Mapping[str, Any]]]
) -> tuple[list[tuple[int, Any]], list[Answer]]:
    prompts: list[tuple[int, Any]] = []  # (row index, one input)
    refused: list[Answer] = []
    for index, body in requests:
        try:
            inputs = embedding_inputs(body)
            for position, prompt in enumerate(inputs):
                too_long = prompt_too_long(engine, prompt)
                if too_long is not None:
                    raise RowRejected(f"input {position}: {too_long}", code=too_long.code)
        except RowRejected as exc:
            refused.append(rejected(index, exc))
            continue
        prompts.extend((index, prompt) for prompt in inputs)
    return prompts, refused


def run_embed(engine: VLLMEngine, requests: Sequence[tuple[int, Mapping[str, Any]]], *, model: str) -> Iterator[Answer]:
    """Answer ``(index, embeddings body)`` pairs with one ``llm.embed`` call; yield an :class:`Answer` per pair."""
    prompts, refused = _prepare_embed(engine, requests)
    yield from refused

    def call(batch: Sequence[tuple[int, Any]]) -> Sequence[Any]:
        return engine.llm.embed([prompt for _, prompt in batch], use_tqdm=False)

    results: dict[int, list[Any]] = {}
    failures: dict[int, Answer] = {}
    for (index, _), output in isolate(
        prompts, call, fatal=engine.classes.fatal_errors, client_errors=engine.classes.client_errors
    ):
        if index in failures:
            continue
        failure = _embedding_failure(engine, index, output)
        if failure is not None:
            failures[index] = failure
            results.pop(index, None)
        else:
            results.setdefault(index, []).append(output)
    yield from failures.values()
    for index, outputs in results.items():
        vectors = [[float(v) for v in out.outputs.embedding] for out in outputs]
        tokens = sum(len(out.prompt_token_ids or ()) for out in outputs)
        body = embedding_body(model=model, vectors=vectors, prompt_tokens=tokens)
        yield Answer(index, body=body, input_tokens=tokens)


def _embedding_failure(engine: VLLMEngine, index: int, output: Any) -> Answer | None:
    if isinstance(output, Exception):
        return engine_failure(engine, index, output)
    failure = reported_failure(index, getattr(output, "error", None), None)
    if failure is not None:
        return failure
    if not len(output.outputs.embedding):
        # vLLM 0.2x turns a failed pooling request into EmbeddingOutput([]) (EmbeddingRequestOutput.from_base).
        return Answer(
            index, error="vLLM returned an empty embedding for this input", status_code=500, code="server_error"
        )
    return None
