"""The standalone stream worker: wait for a group, answer it, write it, acknowledge it — forever.

The DAG in ``dags/stream_intake.py`` is the Airflow-native way to run the aggregator; this loop
is the same steps in one long-lived process (``python -m airflow_batch_provider.intake``), for a
deployment that wants sub-second flushes without a DAG run per group, and for the load test.
Each step is the same code the DAG's tasks call: :class:`~.aggregator.Aggregator` to claim,
:class:`ServerGroupHandler` (the self-hosted server path, at batch priority) to answer,
:class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink` keyed by request id to write, then ack.
A crash anywhere before the ack leaves the claim to expire: the group is delivered again and
its rows rewritten under the same keys, so the output holds each request id once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa

from airflow_batch_provider.chunking.requests import renderer_for
from airflow_batch_provider.chunking.spec import RequestSpec
from airflow_batch_provider.hooks.openai_compatible import OpenAICompatibleHook, ServerRequest
from airflow_batch_provider.intake.aggregator import Aggregator, Group, ReadinessTracker
from airflow_batch_provider.results.parse import parse_openai_line
from airflow_batch_provider.sinks.sql import SqlUpsertSink

log = logging.getLogger(__name__)

#: vLLM's ``--scheduling-policy priority``: lower values are served first; real-time traffic sends
#: none (0), so batch groups go behind it.
BATCH_PRIORITY = 10
OUTPUT_COLUMNS = ("custom_id", "status", "response", "error", "input_tokens", "output_tokens", "group_id")

GroupHandler = Callable[[Group], pa.Table]


@dataclass
class ServerGroupHandler:
    """Answer a group through an OpenAI-compatible server; return one output row per request id.

    Requests carry ``priority`` (vLLM's request field under ``--scheduling-policy priority``;
    lower is served first) so that real-time traffic on the same server never waits behind them.
    """

    conn_id: str
    spec: RequestSpec
    priority: int | None = BATCH_PRIORITY
    max_concurrency: int = 16

    @cached_property
    def hook(self) -> OpenAICompatibleHook:
        """The server's hook, built once per handler."""
        return OpenAICompatibleHook(self.conn_id)

    def __call__(self, group: Group) -> pa.Table:
        """Send the group's requests; return the rows (``custom_id`` = request id)."""
        renderer = renderer_for(self.spec)
        requests = []
        for index, request in enumerate(group.requests):
            line = renderer.request_dict(request.request_id, request.prompt)
            body = dict(line["body"])
            if self.priority is not None:
                body["priority"] = self.priority
            requests.append(ServerRequest(index, request.request_id, line["url"], body, f"{group.group_id}-{index}"))
        lines: list[bytes] = []
        run = self.hook.run(
            requests, fingerprint=group.group_id, write=lines.append, max_concurrency=self.max_concurrency
        )
        group.extra["tokens"] = run.input_tokens + run.output_tokens
        group.extra["generate_seconds"] = run.seconds
        return rows_table([parse_openai_line(line) for line in lines], group.group_id)


def rows_table(records: list[Any], group_id: str) -> pa.Table:
    """Return the output rows of one group as an Arrow table keyed by ``custom_id``."""
    columns: dict[str, list[Any]] = {name: [] for name in OUTPUT_COLUMNS}
    for record in records:
        for name in OUTPUT_COLUMNS[:-1]:
            value = record.get(name)
            columns[name].append(value if name != "response" or value is None else str(value))
        columns["group_id"].append(group_id)
    schema = pa.schema(
        [
            ("custom_id", pa.string()),
            ("status", pa.string()),
            ("response", pa.string()),
            ("error", pa.string()),
            ("input_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("group_id", pa.string()),
        ]
    )
    return pa.table(columns, schema=schema)


class StreamWorker:
    """Run the aggregator loop: ready → collect → answer → write (upsert) → ack."""

    def __init__(
        self, aggregator: Aggregator, handler: GroupHandler, sink: SqlUpsertSink, *, poll_interval: float = 0.2
    ) -> None:
        self.aggregator = aggregator
        self.handler = handler
        self.sink = sink
        self.poll_interval = poll_interval
        self.stop = threading.Event()
        self.groups: list[Group] = []

    def wait_ready(self) -> bool:
        """Poll the queue until a group is ready; False when stopped first."""
        tracker = ReadinessTracker(self.aggregator.policy)
        while not self.stop.is_set():
            stats = self.aggregator.queue.stats()
            self.aggregator.metrics.queue_depth(stats.depth)
            if tracker.observe(stats, time.time()):
                return True
            self.stop.wait(self.poll_interval)
        return False

    def run_once(self) -> Group | None:
        """Handle one group, if one becomes ready before ``stop``."""
        if not self.wait_ready():
            return None
        group = self.aggregator.collect()
        if group is None:
            return None
        table = self.handler(group)
        self.sink.write_part(table, len(self.groups))
        self.aggregator.complete(group)
        self._log_throughput(group)
        self.groups.append(group)
        return group

    def _log_throughput(self, group: Group) -> None:
        tokens, seconds = group.extra.get("tokens"), group.extra.get("generate_seconds")
        if tokens and seconds:
            self.aggregator.metrics.tokens_per_second(tokens, seconds)
            log.info("group %s: %d tokens in %.2f s (%.0f tokens/s)", group.group_id, tokens, seconds, tokens / seconds)

    def run(self) -> None:
        """Handle groups until ``stop`` is set."""
        while not self.stop.is_set():
            self.run_once()
