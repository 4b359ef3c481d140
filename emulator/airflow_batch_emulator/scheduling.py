"""A fixed number of model "slots" for the realtime routes, shared out by request priority.

It stands in for an inference server's scheduler so the effect of priorities can be measured
on a CPU: a realtime request holds one of ``slots`` slots for ``--realtime-delay`` seconds (its
simulated model time); when all are busy it waits. Two policies, named as vLLM's
``--scheduling-policy``:

- ``priority``: waiting requests are served by (``priority``, arrival); lower values first, as
  vLLM's request ``priority`` field. A request that arrives while every slot is held by a
  *lower*-priority (higher value) one preempts it, as vLLM does under this policy: the preempted
  request goes back to the waiting line with the model time it still needs.
- ``fcfs``: arrival order; ``priority`` is ignored (vLLM's default).

``slots = 0`` (the default) keeps the emulator's old behaviour: no limit, no waiting.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from dataclasses import dataclass, field

POLICIES = ("priority", "fcfs")


@dataclass(eq=False)
class _Run:
    """One spell in a slot. Times are set under the lock when the slot is granted / taken away, so
    the service clock counts only time actually held, not the moments a thread takes to wake up."""

    started_at: float
    preempted_at: float = 0.0
    preempted: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class _Ticket:
    priority: int
    seq: int
    remaining: float
    running: bool = False
    run: _Run | None = None


class RealtimeScheduler:
    """Serve ``run(priority, seconds)`` calls through ``slots`` slots under ``policy``."""

    def __init__(self, slots: int = 0, policy: str = "priority") -> None:
        if slots < 0 or policy not in POLICIES:
            raise ValueError(f"slots={slots!r} must be >= 0 and policy={policy!r} one of {POLICIES}")
        self.slots = slots
        self.policy = policy
        self._cond = threading.Condition()
        self._waiting: list[tuple[int, int, _Ticket]] = []
        self._running: set[_Ticket] = set()
        self._seq = itertools.count()
        self.preemptions = 0

    def _key(self, ticket: _Ticket) -> int:
        return ticket.priority if self.policy == "priority" else 0

    def run(self, priority: int, seconds: float) -> None:
        """Hold a slot for ``seconds`` of service (waiting, and being preempted, as the policy says)."""
        if self.slots == 0:
            if seconds:
                time.sleep(seconds)
            return
        ticket = _Ticket(priority, next(self._seq), seconds)
        with self._cond:
            heapq.heappush(self._waiting, (self._key(ticket), ticket.seq, ticket))
            self._dispatch()
        while True:
            with self._cond:
                while not ticket.running:
                    self._cond.wait()
                spell = ticket.run
            assert spell is not None  # set whenever running is
            spell.preempted.wait(max(0.0, spell.started_at + ticket.remaining - time.monotonic()))
            with self._cond:
                # Read under the lock: a preemption landing just as the wait timed out still counts
                # (the ticket is back in the waiting line and must be run out from there).
                if spell.preempted.is_set():
                    ticket.remaining -= spell.preempted_at - spell.started_at
                else:
                    self._running.discard(ticket)
                    ticket.running = False
                    self._dispatch()
                    return

    def _dispatch(self) -> None:
        """Fill free slots from the waiting line; under ``priority`` preempt lower-priority runners."""
        while self._waiting and len(self._running) < self.slots:
            self._start(heapq.heappop(self._waiting)[2])
        while self.policy == "priority" and self._waiting and self._running:
            best = self._waiting[0][2]
            worst = max(self._running, key=lambda t: (t.priority, t.seq))
            if best.priority >= worst.priority:
                break
            self._running.discard(worst)
            worst.running = False
            assert worst.run is not None
            worst.run.preempted_at = time.monotonic()
            worst.run.preempted.set()  # its thread stops its clock and waits to run again
            heapq.heappush(self._waiting, (self._key(worst), worst.seq, worst))
            self.preemptions += 1
            self._start(heapq.heappop(self._waiting)[2])
        self._cond.notify_all()

    def _start(self, ticket: _Ticket) -> None:
        ticket.running = True
        ticket.run = _Run(started_at=time.monotonic())
        self._running.add(ticket)

    def stats(self) -> dict[str, int | str]:
        """Return slots, policy, requests running and waiting, and preemptions so far."""
        with self._cond:
            return {
                "slots": self.slots,
                "policy": self.policy,
                "running": len(self._running),
                "waiting": len(self._waiting),
                "preemptions": self.preemptions,
            }


def request_priority(body: dict[str, object]) -> int:
    """Return the request's ``priority`` field (vLLM's extension; 0 when absent or not an integer)."""
    value = body.get("priority", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
