"""Redis Streams backend: a consumer group's pending entries as claims, ``XAUTOCLAIM`` for redelivery.

The stream ``<name>`` holds unacknowledged messages only: ``ack`` is ``XACK`` + ``XDEL`` in one
transaction, so ``XLEN`` is the depth. ``receive`` first takes over entries another consumer
has held longer than ``claim_seconds`` (``XAUTOCLAIM``: that consumer died), then reads new
ones (``XREADGROUP ... >``). Dead letters go to the stream ``<name>:dead`` with their reason.
Entry ids are ``<ms>-<seq>``, so the oldest waiting message's age is exact.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow_batch_provider.intake.queues.base import BatchQueue, Delivery, QueueStats

log = logging.getLogger(__name__)

GROUP = "aggregator"
PRUNE_EVERY_S = 60.0
#: KEYS[1] the stream; ARGV group, consumer, idle ms, entry ids. For each id: if this consumer
#: owns the pending entry (XPENDING filtered by consumer), set its idle time (XCLAIM ... JUSTID
#: keeps the delivery count; it drops an entry whose data is gone); return the ids not claimed.
CLAIM_IF_OWNER = """
local lost = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local owned = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])
  if #owned == 0 or #redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'IDLE', ARGV[3], 'JUSTID') == 0 then
    lost[#lost + 1] = id
  end
end
return lost
"""


class RedisStreamQueue(BatchQueue):
    """A Redis stream with one consumer group (``aggregator``) and a ``<name>:dead`` stream."""

    backend = "redis"

    def __init__(self, name: str, *, url: str = "redis://127.0.0.1:6379/0", consumer: str | None = None) -> None:
        super().__init__(name)
        self.url = url
        # One consumer name per process: a restarted worker is a new consumer, and the old one's
        # pending entries are reclaimed by XAUTOCLAIM once idle long enough.
        self.consumer = consumer or f"{os.uname().nodename}-{os.getpid()}"
        self.dead_name = f"{name}:dead"
        self._pruned_at = -float("inf")

    @cached_property
    def client(self) -> Any:
        """The redis-py client, with the consumer group created (idempotent)."""
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            client.xgroup_create(self.name, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        return client

    def send(self, body: bytes) -> str:
        """XADD one entry."""
        return _text(self.client.xadd(self.name, {"body": body}))

    def stats(self) -> QueueStats:
        """Depth = XLEN (acked entries are deleted); waiting = depth - pending."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xlen(self.name)
        pipe.xpending(self.name, GROUP)
        pipe.xinfo_groups(self.name)
        depth, pending, groups = pipe.execute()
        waiting = max(0, int(depth) - int(pending["pending"]))
        oldest = None
        if waiting:
            last = next((_text(g["last-delivered-id"]) for g in groups if _text(g["name"]) == GROUP), "0-0")
            first = self.client.xrange(self.name, min=f"({last}", count=1)
            if first:
                oldest = int(_text(first[0][0]).split("-")[0]) / 1000
        return QueueStats(depth=int(depth), waiting=waiting, oldest_waiting_at=oldest)

    def receive(self, max_items: int, claim_seconds: float) -> list[Delivery]:
        """Reclaim entries idle longer than ``claim_seconds``, then read new ones, up to ``max_items``."""
        self._prune_consumers(claim_seconds)  # before reclaiming: a holder's entries must move first
        _next, claimed, deleted = self.client.xautoclaim(
            self.name, GROUP, self.consumer, min_idle_time=int(claim_seconds * 1000), start_id="0-0", count=max_items
        )
        if deleted:  # pending entries whose data is gone (acked by XDEL elsewhere): drop the claim
            self.client.xack(self.name, GROUP, *deleted)
        entries = [e for e in claimed if e[1]]
        out = self._with_attempts(entries)
        if len(out) < max_items:
            fresh = self.client.xreadgroup(GROUP, self.consumer, {self.name: ">"}, count=max_items - len(out))
            for _stream, items in fresh or []:
                out.extend(_delivery(entry_id, fields, 1) for entry_id, fields in items)
        return out

    def _with_attempts(self, entries: list[Any]) -> list[Delivery]:
        if not entries:
            return []
        ids = [_text(e[0]) for e in entries]
        details = self.client.xpending_range(self.name, GROUP, min=ids[0], max=ids[-1], count=len(ids) * 4)
        times = {_text(d["message_id"]): int(d["times_delivered"]) for d in details}
        return [_delivery(entry_id, fields, times.get(_text(entry_id), 2)) for entry_id, fields in entries]

    def _prune_consumers(self, claim_seconds: float) -> None:
        """Remove consumers that hold nothing and were idle longer than a claim (dead workers' names).

        Every worker process is a new consumer (``<host>-<pid>``); XAUTOCLAIM moves a dead one's
        entries away but leaves its name in the group forever. One holding entries is kept (its
        entries would be lost with it); at most once a minute.
        """
        now = time.monotonic()
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        idle_ms = max(int(claim_seconds * 1000), 1)
        for consumer in self.client.xinfo_consumers(self.name, GROUP):
            name = _text(consumer["name"])
            if name != self.consumer and int(consumer["pending"]) == 0 and int(consumer["idle"]) > idle_ms:
                self.client.xgroup_delconsumer(self.name, GROUP, name)
                log.info("queue %s: removed stale consumer %s (idle, holding nothing)", self.name, name)

    def extend(self, receipts: Sequence[str], claim_seconds: float) -> set[str]:
        """Reset the idle time of the entries this consumer still owns; return the others (lost)."""
        return self._reclaim_own(receipts, idle_ms=0)

    def release(self, receipts: Sequence[str], after_seconds: float, claim_seconds: float) -> None:
        """Back-date our pending entries so XAUTOCLAIM takes them again after ``after_seconds``."""
        self._reclaim_own(receipts, idle_ms=max(0, int((claim_seconds - after_seconds) * 1000)))

    def _reclaim_own(self, receipts: Sequence[str], *, idle_ms: int) -> set[str]:
        """Set the idle time of our own pending entries, atomically; return the ids we no longer own.

        A plain XCLAIM changes the owner whoever holds the entry (a min-idle-time cannot tell a
        renewal from a theft: the new holder's heartbeat keeps its idle time as low as ours), so
        a paused worker's heartbeat would take back entries another consumer reclaimed meanwhile.
        The script checks the owner and claims in one step (Redis runs a script atomically).
        """
        if not receipts:
            return set()
        lost = self._claim_if_owner(keys=[self.name], args=[GROUP, self.consumer, idle_ms, *receipts])
        return {_text(entry_id) for entry_id in lost}

    @cached_property
    def _claim_if_owner(self) -> Any:
        return self.client.register_script(CLAIM_IF_OWNER)

    def ack(self, receipts: Sequence[str]) -> None:
        """XACK and XDEL in one transaction."""
        if not receipts:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.xack(self.name, GROUP, *receipts)
        pipe.xdel(self.name, *receipts)
        pipe.execute()

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """XADD to ``<name>:dead`` (body, reason, message id, attempts), then ack here."""
        fields = {
            "body": delivery.body,
            "reason": reason,
            "message_id": delivery.message_id,
            "attempts": str(delivery.attempts),
        }
        self.client.xadd(self.dead_name, fields)
        self.ack([delivery.receipt])

    def dead_letters(self) -> list[dict[str, Any]]:
        """Read ``<name>:dead``."""
        return [
            {"body": f[b"body"], "reason": _text(f[b"reason"]), "message_id": _text(f[b"message_id"])}
            for _id, f in self.client.xrange(self.dead_name)
        ]

    def config(self) -> dict[str, Any]:
        """Return backend, name and URL (put a password in the URL only through a secrets backend)."""
        return {"backend": "redis", "name": self.name, "url": self.url}

    def delete(self) -> None:
        """Delete the stream, its group and the dead-letter stream."""
        self.client.delete(self.name, self.dead_name)

    def close(self) -> None:
        """Close the connection pool."""
        if "client" in self.__dict__:
            self.client.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _delivery(entry_id: Any, fields: dict[bytes, bytes], attempts: int) -> Delivery:
    eid = _text(entry_id)
    return Delivery(
        message_id=eid,
        body=fields.get(b"body", b""),
        receipt=eid,
        enqueued_at=int(eid.split("-")[0]) / 1000,
        attempts=attempts,
    )
