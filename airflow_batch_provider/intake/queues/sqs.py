"""SQS backend (boto3): visibility timeouts as claims, receipt handles as acks, a ``<name>-dead`` queue.

Credentials come from boto3's default chain (environment, shared config, instance role) so no
secret ever sits in a DAG or an XCom; ``endpoint_url`` points at another endpoint (moto's
server in tests and demos). SQS hands out at most 10 messages per call, so ``receive`` loops;
``ack`` deletes in batches of 10. A receipt handle is only valid for its own delivery: if a
claim expired and the message went to someone else, the delete fails, the message comes back
once more, and the idempotent output absorbs it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

from airflow_batch_provider.intake.queues.base import BatchQueue, Delivery, QueueStats

log = logging.getLogger(__name__)

SQS_BATCH = 10
MAX_VISIBILITY = 43_200  # SQS's limit on a visibility timeout (12 h)
#: a collect is given this many times its expected length (calls x measured round trip)
LATENCY_MARGIN = 1.5
LATENCY_WEIGHT = 0.3  # of the newest round trip in the moving average


class SqsQueue(BatchQueue):
    """An SQS standard queue (created if missing) and its dead-letter queue ``<name>-dead``."""

    backend = "sqs"

    def __init__(self, name: str, *, endpoint_url: str | None = None, region_name: str = "us-east-1") -> None:
        super().__init__(name)
        self.endpoint_url = endpoint_url
        self.region_name = region_name
        #: seconds per call to the endpoint (receive and stats), a moving average; 0 until measured
        self.latency = 0.0

    @cached_property
    def client(self) -> Any:
        """The boto3 SQS client (boto3 is imported here only: it is an optional dependency)."""
        import boto3

        return boto3.client("sqs", endpoint_url=self.endpoint_url, region_name=self.region_name)

    @cached_property
    def url(self) -> str:
        """The queue URL (create_queue is idempotent for the same attributes)."""
        return str(self.client.create_queue(QueueName=self.name)["QueueUrl"])

    @cached_property
    def dead_url(self) -> str:
        """The dead-letter queue's URL."""
        return str(self.client.create_queue(QueueName=f"{self.name}-dead")["QueueUrl"])

    def send(self, body: bytes) -> str:
        """Enqueue one message."""
        answer = self.client.send_message(QueueUrl=self.url, MessageBody=body.decode("utf-8"))
        return str(answer["MessageId"])

    def stats(self) -> QueueStats:
        """Depth = visible + in flight (SQS's approximate counts)."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        answer = self._timed(self.client.get_queue_attributes, QueueUrl=self.url, AttributeNames=names)
        attrs = answer["Attributes"]
        waiting = int(attrs.get(names[0], 0))
        return QueueStats(depth=waiting + int(attrs.get(names[1], 0)), waiting=waiting)

    def receive(self, max_items: int, claim_seconds: float) -> list[Delivery]:
        """Receive up to ``max_items`` distinct messages (10 per call), each with at least half a claim left.

        A collect takes ``max_items / 10`` calls, which on a slow endpoint can outlast a short
        claim: the messages are claimed for ``claim_seconds`` plus the collect's expected length
        (the calls times the measured round trip, with a margin), and no call starts that would
        end with less than half of ``claim_seconds`` left on the first message. So the group
        starts its work with every claim held and a full group, however slow the endpoint
        (issue 38: a short claim on a slow endpoint cut groups of 64 to 10). A message
        seen twice in one collect (the estimate was short and its claim lapsed) is kept once,
        under its newest receipt (the older one can no longer delete it).
        """
        claim = max(1, round(claim_seconds))
        calls = -(-max_items // SQS_BATCH)
        visibility = min(MAX_VISIBILITY, claim + round(calls * self.latency * LATENCY_MARGIN))
        last_end = time.monotonic() + visibility - claim / 2
        found: dict[str, Delivery] = {}
        while len(found) < max_items and time.monotonic() + self.latency <= last_end:
            answer = self._timed(
                self.client.receive_message,
                QueueUrl=self.url,
                MaxNumberOfMessages=min(SQS_BATCH, max_items - len(found)),
                VisibilityTimeout=visibility,
                WaitTimeSeconds=0,
                AttributeNames=["SentTimestamp", "ApproximateReceiveCount"],
            )
            messages = answer.get("Messages", [])
            if not messages:  # a short poll may return fewer than asked; only an empty answer means "none left"
                break
            for message in messages:
                delivery = _delivery(message)
                earlier = found.pop(delivery.message_id, None)
                if earlier is not None:  # its claim lapsed within this collect: not a new attempt
                    delivery = replace(delivery, attempts=earlier.attempts)
                found[delivery.message_id] = delivery
        return list(found.values())

    def extend(self, receipts: Sequence[str], claim_seconds: float) -> set[str]:
        """Push the visibility timeout of claimed messages ``claim_seconds`` ahead (10 per call); return the lost.

        SQS refuses the change for a receipt that no longer holds its message (deleted by
        whoever took it over: ``ReceiptHandleIsInvalid``; visible again: ``MessageNotInflight``):
        a sender fault, so the claim is lost. Other failures (SQS's own) are logged, not lost.
        """
        return self._change_visibility(receipts, max(1, round(claim_seconds)))

    def release(self, receipts: Sequence[str], after_seconds: float, claim_seconds: float) -> None:
        """Make claimed messages visible again after ``after_seconds`` (not deleted)."""
        lost = self._change_visibility(receipts, max(0, round(after_seconds)))
        if lost:
            log.info("queue %s: %d released message(s) were no longer held by this consumer", self.name, len(lost))

    def _change_visibility(self, receipts: Sequence[str], seconds: int) -> set[str]:
        lost: set[str] = set()
        for start in range(0, len(receipts), SQS_BATCH):
            part = receipts[start : start + SQS_BATCH]
            entries = [{"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": seconds} for i, r in enumerate(part)]
            answer = self.client.change_message_visibility_batch(QueueUrl=self.url, Entries=entries)
            failed = answer.get("Failed", [])
            lost |= {part[int(f["Id"])] for f in failed if f.get("SenderFault", True)}
            errors = [f for f in failed if not f.get("SenderFault", True)]
            if errors:  # SQS's own failure: the claim may still hold; the next beat tries again
                log.warning("queue %s: SQS failed %d visibility change(s): %s", self.name, len(errors), errors[0])
        return lost

    def _timed(self, call: Any, **kwargs: Any) -> Any:
        """Make one call and fold its round trip into ``latency`` (a moving average)."""
        started = time.monotonic()
        answer = call(**kwargs)
        took = time.monotonic() - started
        self.latency = took if not self.latency else (1 - LATENCY_WEIGHT) * self.latency + LATENCY_WEIGHT * took
        return answer

    def ack(self, receipts: Sequence[str]) -> None:
        """Delete claimed messages, 10 per call; a failed delete is logged (the message will come back)."""
        for start in range(0, len(receipts), SQS_BATCH):
            entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts[start : start + SQS_BATCH])]
            answer = self.client.delete_message_batch(QueueUrl=self.url, Entries=entries)
            for failed in answer.get("Failed", []):
                log.warning(
                    "queue %s: could not delete a message (%s: %s); it will be delivered again and its "
                    "result rewritten under the same request id",
                    self.name,
                    failed.get("Code"),
                    failed.get("Message"),
                )

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Send the body to ``<name>-dead`` with ``reason`` as a message attribute, then delete it here."""
        attributes = {
            "reason": {"DataType": "String", "StringValue": reason[:1000]},
            "message_id": {"DataType": "String", "StringValue": delivery.message_id},
            "attempts": {"DataType": "Number", "StringValue": str(delivery.attempts)},
        }
        body = delivery.body.decode("utf-8", errors="replace") or "(empty message)"
        self.client.send_message(QueueUrl=self.dead_url, MessageBody=body, MessageAttributes=attributes)
        self.ack([delivery.receipt])

    def dead_letters(self) -> list[dict[str, Any]]:
        """Read the dead-letter queue (claims them briefly; they stay there)."""
        found: list[dict[str, Any]] = []
        while True:
            answer = self.client.receive_message(
                QueueUrl=self.dead_url,
                MaxNumberOfMessages=SQS_BATCH,
                VisibilityTimeout=5,
                MessageAttributeNames=["All"],
            )
            messages = answer.get("Messages", [])
            if not messages:
                return found
            for m in messages:
                attrs = m.get("MessageAttributes", {})
                found.append(
                    {
                        "body": m["Body"].encode("utf-8"),
                        "reason": attrs.get("reason", {}).get("StringValue", ""),
                        "message_id": attrs.get("message_id", {}).get("StringValue", ""),
                    }
                )

    def config(self) -> dict[str, Any]:
        """Return backend, name, endpoint and region."""
        return {"backend": "sqs", "name": self.name, "endpoint_url": self.endpoint_url, "region_name": self.region_name}

    def delete(self) -> None:
        """Delete both queues."""
        for url in (self.url, self.dead_url):
            self.client.delete_queue(QueueUrl=url)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        if "client" in self.__dict__:
            self.client.close()


def _delivery(message: dict[str, Any]) -> Delivery:
    attrs = message.get("Attributes", {})
    return Delivery(
        message_id=message["MessageId"],
        body=message["Body"].encode("utf-8"),
        receipt=message["ReceiptHandle"],
        enqueued_at=int(attrs.get("SentTimestamp", 0)) / 1000,
        attempts=int(attrs.get("ApproximateReceiveCount", 1)),
    )
