"""The pre-flight canary: a few of the job's requests answered in real time before anything is uploaded.

A batch answers hours later; a ``max_tokens`` that cuts every answer off, a schema the model does not
follow or a request the provider rejects would be found only then, after the whole table was paid
for. So once the chunk step has written its files, :func:`run_canary` reads ``canary_rows`` request
lines back from them (evenly spread over the job: :func:`canary_positions`), sends those exact
bodies through the provider's real-time API (:meth:`~airflow_batch_provider.hooks.base.BatchHook.answer_now`,
which returns batch-result-shaped lines), parses each answer with the backend's own
``parse_result`` and judges it as the merge would (errors, ``finish_reason=length``, refusals, the
response schema). Every answer is logged beside its request (capped and escaped: both are hostile
text). More than ``canary_max_failures`` failures raise :class:`CanaryFailedError`: the chunk task
fails and nothing is uploaded.

The canary's rows still go in the batch: their real-time answers are not merged, so the canary
costs ``canary_rows`` extra real-time requests (estimated with the job's cost in the chunk summary).
A backend without a real-time call, or a worker without the job's connection, skips the canary
with one log line saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_batch_provider.backends.registry import get_backend
from airflow_batch_provider.cost.estimate import JobEstimate, usd
from airflow_batch_provider.descriptors import ChunkDescriptor, ResultRecord
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.hooks.base import NoRealtimeEndpointError
from airflow_batch_provider.hooks.registry import get_batch_hook
from airflow_batch_provider.results.structured import OutputValidator
from airflow_batch_provider.utils.storage import to_path

log = logging.getLogger(__name__)

DEFAULT_CANARY_ROWS = 3
DEFAULT_CANARY_MAX_FAILURES = 0
#: Characters of a request or an answer the log shows (escaped): enough to see what the template rendered.
LOG_CHARS = 300
#: Finish reasons that mean the model declined to answer (OpenAI's filter, Anthropic's stop_reason).
REFUSALS = frozenset({"content_filter", "refusal"})


class CanaryFailedError(InvalidInputError):
    """The canary's real-time answers failed more often than allowed; nothing was uploaded."""


@dataclass(frozen=True)
class CanaryRow:
    """One request the canary sent: where it sits in the job, its line, and the verdict on its answer."""

    position: int  # 0-based among the job's requests, in chunk order
    label: str  # "chunk 1/3 (100 req), line 17"
    request: bytes  # the chunk file's line: JSON written by this package (no raw control characters)
    answer: str | None = None  # the parsed answer text (or the error), as the merge would store it
    problem: str | None = None  # None: the answer passed


def canary_positions(total: int, rows: int) -> list[int]:
    """Return ``rows`` distinct request positions spread evenly over ``total`` (the middle of each slice)."""
    count = min(max(rows, 0), total)
    return [(2 * i + 1) * total // (2 * count) for i in range(count)]


def check_canary_args(rows: Any, max_failures: Any) -> tuple[int, int]:
    """Return (canary_rows, canary_max_failures) when both are whole numbers >= 0 (a DAG import error otherwise)."""
    for name, value in (("canary_rows", rows), ("canary_max_failures", max_failures)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInputError(
                f"{name} must be a whole number >= 0, got {value!r} (canary_rows=0 skips the canary)."
            )
    return rows, max_failures


def canary_summary(estimate: JobEstimate, rows: int) -> str:
    """Return the chunk summary's canary line: how many real-time requests, and what they should cost."""
    total = estimate.upper_bound.requests
    sent = min(rows, total)
    if not sent:
        return "off (canary_rows=0)"
    expected, bound = (
        None if usd is None else usd * sent / total
        for usd in (estimate.expected.realtime_usd, estimate.upper_bound.realtime_usd)
    )
    cost = "unpriced model" if expected is None or bound is None else f"{usd(expected)} expected, {usd(bound)} at most"
    return f"{sent} real-time request(s) before upload, {cost} (their rows still go in the batch)"


def _read_rows(descriptors: Sequence[ChunkDescriptor], positions: Iterable[int]) -> Iterator[CanaryRow]:
    """Yield the request line at each position (ascending), reading each chunk file only as far as needed."""
    wanted = sorted(set(positions))
    start = 0
    for chunk in descriptors:
        end = start + chunk["num_requests"]
        here = {p - start for p in wanted if start <= p < end}
        if here:
            with to_path(chunk["requests_path"]).open("rb") as handle:
                for line_no, line in enumerate(handle):
                    if line_no in here:
                        custom_id = _escaped(orjson.loads(line).get("custom_id"))
                        where = f"custom_id {custom_id}, {chunk['label']} line {line_no + 1}"
                        yield CanaryRow(start + line_no, where, line.rstrip(b"\n"))
                    if line_no >= max(here):
                        break
        start = end


def _capped(text: str) -> str:
    return text[:LOG_CHARS] + ("..." if len(text) > LOG_CHARS else "")


def _escaped(value: Any) -> str:
    """Return at most :data:`LOG_CHARS` characters of ``value`` as a JSON string literal (control chars escaped)."""
    return orjson.dumps(_capped(str(value if value is not None else ""))).decode()


def _openai_refusal(answer: bytes) -> bool:
    """True when an OpenAI-shaped answer carries ``message.refusal`` (its parser returns the refusal as the text)."""
    try:
        choices = orjson.loads(answer)["response"]["body"]["choices"]
        return bool(choices[0]["message"].get("refusal"))
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return False


def _failed(record: ResultRecord) -> str:
    """Say why a record that did not succeed failed, and what to change."""
    status = record.get("http_status") or 0
    code = _escaped(record.get("error_code") or "-")
    what = f"{record['status']} ({code}, HTTP {status or '-'}): {_escaped(record.get('error'))}"
    if status in (401, 403, 404):
        return f"{what}; check the connection (API key, base URL) and the model name"
    if status == 429 or status >= 500 or not status:
        return f"{what}; the provider was busy or out of reach: run again, or raise canary_max_failures"
    return f"{what}; the provider rejects the request: check request_params, the model and what the template renders"


def judge(record: ResultRecord, answer: bytes, validator: OutputValidator | None, max_tokens: Any) -> str | None:
    """Return what is wrong with one canary answer, and what to change; None when the merge would keep it."""
    if record["status"] != "succeeded":
        return _failed(record)
    if record.get("finish_reason") == "length":
        return f"answer cut off at max_tokens (finish_reason=length, max_tokens={max_tokens}); raise max_tokens"
    if record.get("finish_reason") in REFUSALS or _openai_refusal(answer):
        return "the model refused to answer; check what the template renders for this row (a missing value?)"
    if validator is not None:
        _, reason = validator.parse(record.get("response"))
        if reason:
            return f"{reason}; describe the format in the prompt or loosen response_schema"
    return None


def _max_tokens(params: Mapping[str, Any]) -> Any:
    return params.get("max_tokens", params.get("max_completion_tokens", params.get("max_output_tokens")))


def _judge_all(
    provider: str, picked: Sequence[CanaryRow], answers: Sequence[bytes], validator: OutputValidator | None, limit: Any
) -> list[CanaryRow]:
    """Parse each answer line with the backend's parser and judge it; return the rows with answer and verdict."""
    backend = get_backend(provider)
    judged = []
    for row, answer in zip(picked, answers, strict=True):
        record = backend.parse_result(answer)
        text = record.get("response") if record["status"] == "succeeded" else record.get("error")
        problem = judge(record, answer, validator, limit)
        judged.append(CanaryRow(row.position, row.label, row.request, None if text is None else str(text), problem))
    return judged


def _log_row(row: CanaryRow) -> None:
    verdict = "ok" if row.problem is None else f"FAILED: {row.problem}"
    log.info(
        "canary request %s (%s): %s\n    request: %s\n    answer:  %s",
        f"{row.position + 1:,}",
        row.label,
        verdict,
        _capped(row.request.decode("utf-8", "replace")),
        _escaped(row.answer),
    )


def run_canary(
    descriptors: Sequence[ChunkDescriptor],
    *,
    rows: int,
    max_failures: int,
    conn_id: str | None,
    request_params: Mapping[str, Any],
) -> list[CanaryRow]:
    """Send ``rows`` of the job's requests in real time, log each answer, raise when too many fail.

    Return the rows sent (empty when skipped). Raise :class:`CanaryFailedError` naming every failed
    row when more than ``max_failures`` failed.
    """
    total = sum(d["num_requests"] for d in descriptors)
    if rows <= 0 or not total:
        return []
    provider = descriptors[0]["provider"]
    hook = get_batch_hook(provider, conn_id)
    try:
        hook.get_connection(hook.conn_id)
    except AirflowNotFoundException:
        log.warning("canary skipped: no connection %r on this worker (the submit step needs it)", hook.conn_id)
        return []
    picked = list(_read_rows(descriptors, canary_positions(total, rows)))
    try:
        answers = hook.answer_now([row.request for row in picked], model=descriptors[0]["model"])
    except NoRealtimeEndpointError as exc:
        log.info("canary skipped: %s, so nothing can be answered before the batch", exc)
        return []
    schema_path = descriptors[0].get("schema_path")
    validator = OutputValidator.from_file(schema_path) if schema_path else None
    judged = _judge_all(provider, picked, answers, validator, _max_tokens(request_params))
    for row in judged:
        _log_row(row)
    _check(judged, max_failures)
    return judged


def _check(judged: Sequence[CanaryRow], max_failures: int) -> None:
    failed = [row for row in judged if row.problem is not None]
    log.info("canary: %s of %s real-time answers passed", len(judged) - len(failed), len(judged))
    if len(failed) <= max_failures:
        return
    lines = [f"  request {row.position + 1:,} ({row.label}): {row.problem}" for row in failed]
    raise CanaryFailedError(
        f"Canary: {len(failed)} of {len(judged)} real-time answers failed (canary_max_failures={max_failures}); "
        "nothing was uploaded. Fix what each line says, then run again (canary_rows=0 skips the canary):\n"
        + "\n".join(lines)
    )
