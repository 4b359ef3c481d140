"""The standalone stream worker: wait for a group, answer it, write it, acknowledge it — forever.

The DAG in ``dags/stream_intake.py`` is the Airflow-native way to run the aggregator; this loop
is the same steps in one long-lived process (``python -m airflow_batch_provider.intake``), for a
deployment that wants sub-second flushes without a DAG run per group, and for the load test.
A crash anywhere before the ack leaves the claim to expire: the group is delivered again, and
what happens then is decided per request from what is written and remembered (:mod:`.ledger`):

1. answered already (a ``succeeded`` row, same fingerprint): acknowledged, not sent again;
2. failed retryably ``max_attempts`` times, or crashed its group ``alone_attempts`` times while
   alone: dead-lettered with the reason;
3. otherwise sent again — requests that were in a crashed group go in smaller groups (halved
   per crash: 64 → 32 → … → 1), so a message that kills its worker ends up alone and only it
   reaches the dead-letter queue, while its group-mates are answered on the way.

Each part is acknowledged as soon as its rows are written; claims are renewed (a heartbeat)
while the group is in flight, and a request whose claim was lost (the worker was paused past
its claim, :mod:`.claims`) is not sent: whoever holds it now answers it. What is answered is
looked up again before every part, not only the first. A request that keeps failing
retryably is released to the queue with a back-off instead of holding its group. The output
holds each request id once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pyarrow as pa

from airflow_batch_provider.intake.aggregator import Aggregator, Group, GroupPolicy, ReadinessTracker
from airflow_batch_provider.intake.claims import GroupClaims
from airflow_batch_provider.intake.handler import BATCH_PRIORITY, ServerGroupHandler
from airflow_batch_provider.intake.ledger import Tries, WorkLedger
from airflow_batch_provider.intake.messages import IntakeRequest
from airflow_batch_provider.sinks.sql import SqlUpsertSink

__all__ = ["BATCH_PRIORITY", "ServerGroupHandler", "StreamWorker", "halvings", "part_size"]

log = logging.getLogger(__name__)

#: rows per write while a part is answered: a crash mid-part pays again for at most this many
#: answers (plus those in flight) instead of the whole part.
FLUSH_EVERY = 16


def part_size(max_items: int, crashes: int) -> int:
    """Group size for requests that were in ``crashes`` crashed groups: halved per crash, at least 1."""
    return max(1, max_items >> crashes)


def halvings(max_items: int) -> int:
    """Crashes after which a request is sent alone (``part_size`` reaches 1)."""
    return (max_items - 1).bit_length()


class StreamWorker:
    """Run the aggregator loop: ready → collect → skip answered → answer in parts → write → ack."""

    def __init__(
        self,
        aggregator: Aggregator,
        handler: ServerGroupHandler,
        sink: SqlUpsertSink,
        *,
        poll_interval: float = 0.2,
        flush_every: int = FLUSH_EVERY,
    ) -> None:
        self.aggregator = aggregator
        self.handler = handler
        self.sink = sink
        self.ledger = WorkLedger(sink)
        self.poll_interval = poll_interval
        self.flush_every = flush_every
        self.stop = threading.Event()
        self.groups: list[Group] = []
        self._parts = 0
        self.claims: GroupClaims | None = None  # of the group being processed (one at a time)

    @property
    def policy(self) -> GroupPolicy:
        """The aggregator's group policy."""
        return self.aggregator.policy

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
        self.handle(group)
        return group

    def handle(self, group: Group) -> None:
        """Process a collected group and remember it."""
        self.process(group)
        self.groups.append(group)

    def process(self, group: Group) -> None:
        """Answer a collected group, renewing its claims meanwhile."""
        receipts = [d.receipt for ds in group.deliveries.values() for d in ds]
        self.claims = GroupClaims(
            self.aggregator.queue, self.policy.claim_seconds, group.group_id, receipts, group.flushed_at
        )
        with self.claims.heartbeat():
            self._process(group)

    def _process(self, group: Group) -> None:
        """Skip what is answered, dead-letter what is hopeless, answer the rest part by part."""
        todo = self._unanswered(group, group.requests)
        tries = self.ledger.read([r.request_id for r in todo])
        todo = [r for r in todo if not self._hopeless(group, r, tries.get(r.request_id, Tries()))]
        for index, (crashes, part) in enumerate(self._parts_of(todo, tries)):
            if self.stop.is_set() and index:
                return  # SIGTERM: the rest stays claimed and comes back to whoever runs next
            # Another worker may have answered some meanwhile (this one was paused past its claim).
            part = self._unanswered(group, part) if index else part
            self._answer_part(group, index, part, crashes)

    def _unanswered(self, group: Group, requests: list[IntakeRequest]) -> list[IntakeRequest]:
        """Acknowledge the requests the output already answers; return the others."""
        answered = self.ledger.answered({r.request_id: self.handler.fingerprint(r) for r in requests})
        if answered:
            log.info("group %s: %d request(s) already answered; acknowledged, not sent", group.group_id, len(answered))
            self._ack(group, answered)
        return [r for r in requests if r.request_id not in answered]

    def _receipts(self, group: Group, request_id: str) -> list[str]:
        return [d.receipt for d in group.deliveries.get(request_id, [])]

    def _parts_of(
        self, todo: list[IntakeRequest], tries: dict[str, Tries]
    ) -> Iterator[tuple[int, list[IntakeRequest]]]:
        by_crashes: dict[int, list[IntakeRequest]] = {}
        for request in todo:
            by_crashes.setdefault(tries.get(request.request_id, Tries()).crashes, []).append(request)
        for crashes in sorted(by_crashes):
            size = part_size(self.policy.max_items, crashes)
            if crashes:  # all of a suspect part in flight at once: a crash then blames only what was sent
                size = min(size, self.handler.max_concurrency)
            members = by_crashes[crashes]
            for start in range(0, len(members), size):
                yield crashes, members[start : start + size]

    def _hopeless(self, group: Group, request: IntakeRequest, tries: Tries) -> bool:
        if tries.alone >= self.policy.alone_attempts:
            reason = (
                f"request {request.request_id}: sent {tries.tries} times and its worker died each time without "
                f"writing a result ({tries.alone} of them alone); it may crash its worker — inspect it, "
                "then send it again"
            )
        elif tries.failures >= self.policy.max_attempts:
            reason = (
                f"request {request.request_id}: failed {tries.failures} times with a retryable error "
                f"(last: {tries.last_error}); send it again once the server is healthy"
            )
        else:
            return False
        held = set(self._current_claims().take(self._receipts(group, request.request_id)))
        if not held:  # its claim was lost: its new holder counts its tries and decides
            return True
        for delivery in group.deliveries.get(request.request_id, []):
            if delivery.receipt in held:
                self.aggregator.queue.dead_letter(delivery, reason)
        log.warning("group %s: dead-lettered: %s", group.group_id, reason)
        self.aggregator.metrics.dead_lettered(1)
        self.ledger.forget([request.request_id])
        return True

    def _answer_part(self, group: Group, index: int, requests: list[IntakeRequest], crashes: int) -> None:
        """Send one part, writing rows as they land; acknowledge it; release what failed retryably.

        A part that crashed before is sent all at once (it is at most ``max_concurrency``), each
        row written as it lands: the next crash costs only what was in flight, and blames only that.
        """
        claims = self._current_claims()
        requests = [r for r in requests if claims.holds(self._receipts(group, r.request_id))]
        if not requests:
            return
        ids = [r.request_id for r in requests]
        part = Group(f"{group.group_id}-{index}", requests, [], group.first_enqueued_at, group.flushed_at)
        alone = len(ids) == 1 and crashes > 0
        self.ledger.sending(ids, alone=alone)
        suspect = crashes > 0
        skipped: set[str] = set()

        def still_held(request: IntakeRequest) -> bool:  # asked as each request is about to go
            if claims.holds(self._receipts(group, request.request_id)):
                return True
            skipped.add(request.request_id)
            return False

        answer = self.handler(
            part,
            max_concurrency=len(requests) if suspect else None,
            flush=self._write,
            flush_every=1 if suspect else self.flush_every,
            keep=still_held,
        )
        self._write(answer.table)
        self._ack(group, set(ids) - set(answer.retry) - skipped)
        if answer.retry:
            self._release(group, answer.retry, alone)
        self._log_throughput(part)

    def _release(self, group: Group, errors: dict[str, str], alone: bool) -> None:
        """Give requests that failed retryably back to the queue, with a back-off of 2^failures s."""
        self.ledger.failed(errors, alone=alone)
        tries = self.ledger.read(errors)
        for rid, error in errors.items():
            backoff = min(self.policy.claim_seconds, 2.0 ** tries[rid].failures)
            receipts = self._current_claims().take(self._receipts(group, rid))
            self.aggregator.queue.release(receipts, backoff, self.policy.claim_seconds)
            log.warning("request %s: %s; released to the queue, back in %.0f s", rid, error, backoff)

    def _write(self, table: pa.Table) -> None:
        if table.num_rows:
            self.sink.write_part(table, self._parts)
            self._parts += 1

    def _ack(self, group: Group, request_ids: set[str]) -> None:
        """Acknowledge the requests' messages this worker still holds (a lost one is its new holder's)."""
        receipts = self._current_claims().take([r for rid in request_ids for r in self._receipts(group, rid)])
        self.aggregator.queue.ack(receipts)
        self.ledger.forget(request_ids)

    def _current_claims(self) -> GroupClaims:
        if self.claims is None:
            raise RuntimeError("no group is being processed")
        return self.claims

    def _log_throughput(self, group: Group) -> None:
        tokens, seconds = group.extra.get("tokens"), group.extra.get("generate_seconds")
        if tokens and seconds:
            self.aggregator.metrics.tokens_per_second(tokens, seconds)
            log.info("group %s: %d tokens in %.2f s (%.0f tokens/s)", group.group_id, tokens, seconds, tokens / seconds)

    def run(self) -> None:
        """Handle groups until ``stop`` is set."""
        while not self.stop.is_set():
            self.run_once()
