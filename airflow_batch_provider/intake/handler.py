"""Answer one group through an OpenAI-compatible server: rows to write, and requests to try later.

Every row carries ``request_fingerprint`` (a hash of the request body: model, parameters,
prompt), which lets a redelivered group skip what is already answered (:mod:`.ledger`). A
request that still fails with a retryable error (429, 5xx, a lost connection) after a short
in-group retry is *not* written: it goes back to the queue to be tried again later, so its
back-off never holds the rest of its group, or the queue, behind it. Other failures (a 400:
the request itself is wrong) are written as ``errored`` rows, as a batch would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson
import pyarrow as pa

from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.hooks.openai_compatible import OpenAICompatibleHook, ServerRequest
from airflow_batch_provider.intake.aggregator import Group
from airflow_batch_provider.intake.messages import IntakeRequest
from airflow_batch_provider.results.parse import parse_openai_line
from airflow_batch_provider.utils.retry import RetryPolicy

#: vLLM's ``--scheduling-policy priority``: lower values are served first; real-time traffic sends
#: none (0), so batch groups go behind it.
BATCH_PRIORITY = 10
#: In-group retries stay short (about 2 s in all): a request failing longer is released to the queue.
GROUP_RETRY_POLICY = RetryPolicy(attempts=3, base_delay=0.5, max_delay=2.0)
RETRYABLE_HTTP = frozenset({408, 409, 429})
RETRYABLE_CODES = frozenset({"connection_error", "request_failed"})
OUTPUT_COLUMNS = (
    "custom_id",
    "status",
    "response",
    "error",
    "input_tokens",
    "output_tokens",
    "request_fingerprint",
    "group_id",
)
OUTPUT_SCHEMA = pa.schema(
    [
        ("custom_id", pa.string()),
        ("status", pa.string()),
        ("response", pa.string()),
        ("error", pa.string()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("request_fingerprint", pa.string()),
        ("group_id", pa.string()),
    ]
)


@dataclass
class GroupAnswer:
    """What a handler made of a group: the rows to write, and retryable failures (id → error)."""

    table: pa.Table
    retry: dict[str, str] = field(default_factory=dict)


@dataclass
class ServerGroupHandler:
    """Answer a group through an OpenAI-compatible server; one row per answered request id.

    Requests carry ``priority`` (vLLM's request field under ``--scheduling-policy priority``;
    lower is served first) so that real-time traffic on the same server never waits behind them.
    """

    conn_id: str
    spec: RequestSpec
    priority: int | None = BATCH_PRIORITY
    max_concurrency: int = 16
    retry_policy: RetryPolicy = GROUP_RETRY_POLICY

    @cached_property
    def hook(self) -> OpenAICompatibleHook:
        """The server's hook, built once per handler."""
        return OpenAICompatibleHook(self.conn_id, retry_policy=self.retry_policy)

    def body(self, request: IntakeRequest) -> tuple[str, dict[str, Any]]:
        """Return the endpoint and request body sent for ``request``."""
        line = renderer_for(self.spec).request_dict(request.request_id, request.prompt)
        body = dict(line["body"])
        if self.priority is not None:
            body["priority"] = self.priority
        return str(line["url"]), body

    def fingerprint(self, request: IntakeRequest) -> str:
        """Return the hash of what is sent for ``request``: a changed model or prompt is a new request."""
        url, body = self.body(request)
        return hashlib.sha256(url.encode() + b"\n" + orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]

    def __call__(
        self,
        group: Group,
        *,
        max_concurrency: int | None = None,
        flush: Callable[[pa.Table], object] | None = None,
        flush_every: int = 1,
        keep: Callable[[IntakeRequest], bool] | None = None,
    ) -> GroupAnswer:
        """Send the group's requests; return the rows to write and the requests to try again later.

        With ``flush``, answered rows are handed to it as they land, ``flush_every`` at a time,
        so a crash mid-group loses (and pays again for) only the requests not yet flushed; the
        returned table holds the rest. ``keep`` is asked as each request is about to be sent;
        one it refuses is skipped (neither sent nor in the answer: its claim was lost).
        """
        fingerprints: dict[str, str] = {}

        def requests() -> Iterator[ServerRequest]:  # lazy: the hook takes the next one when a slot is free
            for index, request in enumerate(group.requests):
                if keep is not None and not keep(request):
                    continue
                url, body = self.body(request)
                fingerprints[request.request_id] = self.fingerprint(request)
                yield ServerRequest(index, request.request_id, url, body, f"{group.group_id}-{index}")

        pending: list[dict[str, Any]] = []
        retry: dict[str, str] = {}

        def land(line: bytes) -> None:
            record = parse_openai_line(line)
            if retryable(record):
                retry[str(record["custom_id"])] = str(record.get("error") or "failed")[:500]
                return
            pending.append({**record, "request_fingerprint": fingerprints.get(str(record["custom_id"]))})
            if flush is not None and len(pending) >= flush_every:
                flush(rows_table(pending, group.group_id))
                pending.clear()

        run = self.hook.run(
            requests(), fingerprint=group.group_id, write=land, max_concurrency=max_concurrency or self.max_concurrency
        )
        group.extra["tokens"] = run.input_tokens + run.output_tokens
        group.extra["generate_seconds"] = run.seconds
        return GroupAnswer(rows_table(pending, group.group_id), retry)


def retryable(record: Any) -> bool:
    """True for a failure worth another try later: 408/409/429, 5xx, or no HTTP answer at all."""
    if record.get("status") == "succeeded":
        return False
    status = record.get("http_status")
    if status is not None:
        return int(status) in RETRYABLE_HTTP or int(status) >= 500
    return record.get("error_code") in RETRYABLE_CODES


def rows_table(records: list[Any], group_id: str) -> pa.Table:
    """Return the output rows of one group as an Arrow table keyed by ``custom_id``."""
    columns: dict[str, list[Any]] = {name: [] for name in OUTPUT_COLUMNS}
    for record in records:
        for name in OUTPUT_COLUMNS[:-1]:
            value = record.get(name)
            columns[name].append(value if name != "response" or value is None else str(value))
        columns["group_id"].append(group_id)
    return pa.table(columns, schema=OUTPUT_SCHEMA)
