"""Failure kinds for the "LLM batches" view: counts, example row ids, and the next step for each kind.

Two sources, both small XComs: while the run is live, the sensor's record of each ended attempt
(:func:`airflow_batch_provider.progress.attempt_errors`: kinds as ``status/code: message``, a
``final`` flag, a few custom_ids); once the merge ran, its summary (``top_errors``,
``error_examples``, ``truncated_rows``), which is the final word for the whole run. Every value
is read through :mod:`.values`: an XCom is data anyone with write access to it could have shaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_batch_provider.batches.line_retry import is_final_error_code
from airflow_batch_provider.ui.values import count_or_zero, items, mapping, text, texts

EXAMPLES = 3
TOP_KINDS = 5
TRUNCATED_KIND = "truncated: answer cut off at max_tokens (finish_reason=length)"

_AUTH_CODES = frozenset(
    {"authentication_error", "permission_error", "invalid_api_key", "http_401", "http_403", "insufficient_quota"}
)


@dataclass
class ErrorKind:
    """One kind of failure: how many lines, whether it is final, a few row ids, and what to do."""

    kind: str
    count: int = 0
    final: bool = True
    examples: list[str] = field(default_factory=list)

    @property
    def hint(self) -> str:
        """The one-line next step for this kind."""
        return next_step(self.kind, self.final)


def _code(kind: str) -> tuple[str, str]:
    """Return (status, code) of a ``status/code: message`` kind."""
    head = kind.split(":", 1)[0].strip()
    status, _, code = head.partition("/")
    return status.strip().lower(), code.strip().lower().replace("http ", "http_")


# What really sends a row again. A chunk's batch is tied to the chunk's content (its submission
# key), so clearing its submit task finds the same batch instead of sending the fixed rows; a new DAG
# run writes new chunks. With skip_unchanged it sends only rows without a final stored result for
# the same request (chunking/incremental.py): new or changed rows, and retryable failures.
_RERUN = "then run the DAG again: with skip_unchanged it sends only new or changed rows and rows that failed retryably"


def next_step(kind: str, final: bool) -> str:
    """Return what a person should do about lines that failed this way (one sentence)."""
    status, code = _code(kind)
    text = kind.lower()
    if status == "truncated" or "max_tokens" in text or "finish_reason=length" in text:
        return (
            "Answers were cut off: raise max_tokens in request_params, then run the DAG again; max_tokens is part "
            "of every request, so the rerun sends every row again (skip_unchanged carries none)."
        )
    if "token_limit_exceeded" in text:
        return (
            "The provider's enqueued-token budget is full: the sensor waits and resubmits; "
            "lower chunk_size or set token_budget."
        )
    if code in _AUTH_CODES:
        return (
            "Check the connection's API key and its access to the model, then run the DAG again; with "
            "skip_unchanged set carry_statuses=('succeeded', 'invalid_output'), or these errored rows are carried."
        )
    if not final:
        return "Passing failure: these lines are sent again in a follow-up batch (max_line_retries); nothing to do."
    if status in ("expired", "missing", "canceled") or (code and not is_final_error_code(code)):
        return f"Still failing after the last follow-up: raise max_line_retries on the sensor if it helps, {_RERUN}."
    if status == "invalid_output":
        return (
            "The answer did not match the schema: fix the schema or the prompt (or raise max_tokens), then run "
            "the DAG again; the changed request sends every row again."
        )
    if "invalid_request" in code or code in ("http_400", "http_404", "http_413", "http_422"):
        return f"The request is invalid: fix these rows in the input (see the ids), {_RERUN}."
    return "See the error column of these rows in the output, or the batch in the provider console."


def from_attempts(records: Iterable[Mapping[str, Any]]) -> list[ErrorKind]:
    """Return the failure kinds of a chunk's attempt records, most lines first.

    A kind that was retryable in one attempt and is still there in a later one counts in both:
    each attempt's lines are distinct sends. A kind is final when any attempt said so.
    """
    kinds: dict[str, ErrorKind] = {}
    for record in records:
        for item in (i for i in items(mapping(record).get("kinds")) if isinstance(i, Mapping)):
            name = text(item.get("kind")) or "unknown"
            kind = kinds.setdefault(name, ErrorKind(name, final=False))
            kind.count += count_or_zero(item.get("count"))
            kind.final = kind.final or bool(item.get("final"))
            kind.examples.extend(i for i in texts(item.get("examples"), EXAMPLES) if i not in kind.examples)
            del kind.examples[EXAMPLES:]
    return sorted(kinds.values(), key=lambda k: (not k.final, -k.count, k.kind))


def merge_kinds(groups: Iterable[Iterable[ErrorKind]]) -> list[ErrorKind]:
    """Add up chunks' kinds into the run's, the top :data:`TOP_KINDS` first."""
    total: dict[str, ErrorKind] = {}
    for kinds in groups:
        for kind in kinds:
            into = total.setdefault(kind.kind, ErrorKind(kind.kind, final=False))
            into.count += kind.count
            into.final = into.final or kind.final
            into.examples.extend(i for i in kind.examples if i not in into.examples)
            del into.examples[EXAMPLES:]
    return sorted(total.values(), key=lambda k: (not k.final, -k.count, k.kind))[:TOP_KINDS]


def from_summary(summary: Mapping[str, Any]) -> list[ErrorKind]:
    """Return the run's failure kinds from the merge summary (final: the merge is over)."""
    examples = mapping(summary.get("error_examples"))
    kinds = []
    for entry in (e for e in items(summary.get("top_errors")) if isinstance(e, list | tuple) and len(e) == 2):
        name = text(entry[0])
        kinds.append(ErrorKind(name, count_or_zero(entry[1]), True, texts(examples.get(name), EXAMPLES)))
    # Cut-off answers of every status; shown on their own unless a top kind already names them.
    truncated = count_or_zero(summary.get("truncated_rows"))
    if truncated and not any("truncated" in k.kind for k in kinds):
        kinds.append(ErrorKind(TRUNCATED_KIND, truncated, True, texts(summary.get("truncated_examples"), EXAMPLES)))
    return kinds
