"""The claims a stream worker holds on one group's messages: renewed by a heartbeat, dropped when lost.

A claim is lost when the worker cannot have renewed it in time — it was paused (SIGSTOP, a VM
freeze, a long GC) past ``claim_seconds`` — or when the queue says another consumer holds the
message now, or that it is gone (``BatchQueue.extend``). Either way the messages may be in
another worker's hands already, so this worker stops sending them, and neither acknowledges
nor releases them: their new holder answers them (issue 38: a paused worker that woke up and
went on sent the rest of its group to the model a second time). Losing a claim costs at most
the requests that were in flight when it lapsed.

The lapse is judged here, on this worker's clock, as well as by the queue, because a queue
cannot always tell: SQS (and moto) may accept an old receipt handle after the message went to
someone else, and an unreachable queue answers nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from airflow_batch_provider.intake.queues.base import BatchQueue

log = logging.getLogger(__name__)

#: a claim last confirmed longer ago than this share of ``claim_seconds`` counts as lapsed: the
#: rest covers the renewal's own trip to the queue, and a message that turned visible meanwhile.
LAPSE_SHARE = 0.9


class GroupClaims:
    """The receipts of one group this worker still holds; ``holds`` says whether one may be sent.

    ``flushed_at`` is when the collect returned (epoch seconds): a collect leaves every claim at
    least half of ``claim_seconds`` (the SQS backend sizes its visibility for it), so that is
    the first confirmation assumed; the heartbeat's first beat, at once, confirms it for real.
    ``holds`` asks no one: a claim confirmed less than ``LAPSE_SHARE`` of a claim ago is held
    (no other consumer may take it before it lapses), an older one is lost.
    """

    def __init__(
        self, queue: BatchQueue, claim_seconds: float, group_id: str, receipts: Iterable[str], flushed_at: float
    ) -> None:
        self.queue = queue
        self.claim_seconds = claim_seconds
        self.group_id = group_id
        self.interval = claim_seconds / 3
        self.lost: set[str] = set()
        self._held = set(receipts)
        self._lock = threading.Lock()
        self._confirmed = time.monotonic() - claim_seconds / 2 - max(0.0, time.time() - flushed_at)

    def holds(self, receipts: Iterable[str]) -> bool:
        """True unless one of ``receipts`` is lost (reported by the queue, or not renewed in time)."""
        with self._lock:
            self._expire(time.monotonic())
            return self.lost.isdisjoint(receipts)

    def take(self, receipts: Iterable[str]) -> list[str]:
        """Stop renewing ``receipts`` (about to be acked, released or dead-lettered); return those still held."""
        with self._lock:
            self._expire(time.monotonic())
            held = [r for r in receipts if r in self._held]
            self._held.difference_update(held)
        return held

    def renew(self) -> None:
        """Renew what is held; what the queue reports lost, or what lapsed unrenewed, is moved to ``lost``."""
        with self._lock:
            started = time.monotonic()
            if self._expire(started) or not self._held:
                return
            try:
                lost = self.queue.extend(sorted(self._held), self.claim_seconds) & self._held
            except Exception:  # the queue unreachable: the claims may still hold; the clock decides later
                log.warning("group %s: could not renew its claims", self.group_id, exc_info=True)
                return
            self._confirmed = started
            self._lose(lost, "another consumer holds them now, or they were acknowledged")

    def _expire(self, now: float) -> bool:
        """Lose every held claim once the last confirmation is ``LAPSE_SHARE`` of a claim old; True if it did."""
        since = now - self._confirmed
        if not self._held or since < LAPSE_SHARE * self.claim_seconds:
            return False
        self._lose(set(self._held), f"not renewed for {since:.1f} s of a {self.claim_seconds:g} s claim")
        return True

    def _lose(self, lost: set[str], why: str) -> None:
        if not lost:
            return
        self._held -= lost
        self.lost |= lost
        log.warning(
            "group %s: lost the claim on %d message(s) (%s); this worker stops sending them and leaves them "
            "to whoever holds them now",
            self.group_id,
            len(lost),
            why,
        )

    @contextmanager
    def heartbeat(self) -> Iterator[None]:
        """Renew at once, then every third of ``claim_seconds``, until the block ends."""
        done = threading.Event()

        def beat() -> None:
            self.renew()
            while not done.wait(self.interval):
                self.renew()

        thread = threading.Thread(target=beat, name=f"heartbeat-{self.group_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
