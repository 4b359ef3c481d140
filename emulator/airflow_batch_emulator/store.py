"""In-memory state shared by the HTTP threads and the batch worker: objects, faults and counters.

One re-entrant lock guards everything; the worker does its heavy per-line work outside it and
only commits under it. Ids come from a counter that survives resets, so an id is never reused
by one emulator process.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from airflow_batch_emulator.faults import Faults, HttpDice
from airflow_batch_emulator.records import AnthropicBatch, OpenAIBatch, StoredFile
from airflow_batch_emulator.scheduling import RealtimeScheduler

_SECTIONS = ("openai", "anthropic", "bedrock", "realtime", "http", "routes")


@dataclass
class HeldCall:
    """One request held by a route delay; setting ``release`` ends the hold early (``POST /_emulator/release``)."""

    id: int
    phase: str
    request: str
    client: str
    since: float = field(default_factory=time.monotonic)
    release: threading.Event = field(default_factory=threading.Event)

    def to_dict(self) -> dict[str, Any]:
        """The call as ``GET /_emulator/stats`` lists it under ``http.delayed_calls``."""
        held = round(time.monotonic() - self.since, 3)
        return {"id": self.id, "phase": self.phase, "request": self.request, "client": self.client, "held_s": held}


class Store:
    """Files, batches, fault settings and counters of one emulator."""

    def __init__(self, faults: Faults) -> None:
        self.lock = threading.RLock()
        self.initial_faults = faults
        self.faults = faults
        self.dice = HttpDice()
        self.files: dict[str, StoredFile] = {}
        self.openai_batches: dict[str, OpenAIBatch] = {}
        self.anthropic_batches: dict[str, AnthropicBatch] = {}
        self.counters: dict[str, Counter[str]] = {name: Counter() for name in _SECTIONS}
        # The realtime requests' ``priority`` field as received (JSON text; "absent"): what a client sent.
        self.realtime_priorities: Counter[str] = Counter()
        self._ids = itertools.count()
        self._realtime_ids = itertools.count()
        self._in_flight = 0
        self._delayed: Counter[tuple[str, str]] = Counter()
        self._held: dict[int, HeldCall] = {}
        self._held_ids = itertools.count(1)
        self.wakeup = threading.Event()
        # Replaced by BatchEmulator with the configured slots; unlimited until then.
        self.scheduler = RealtimeScheduler()

    # ids and counters -------------------------------------------------------------------------

    def new_id(self, prefix: str, length: int = 24) -> str:
        """Return ``prefix`` + a deterministic hex id from (seed, sequence number)."""
        n = next(self._ids)
        digest = hashlib.blake2b(f"{self.initial_faults.seed}:{n}".encode(), digest_size=16).hexdigest()
        return prefix + digest[:length]

    def new_realtime_id(self) -> str:
        """Return the id of a real-time answer, from a sequence of its own.

        So the ids of files and batches do not depend on how many real-time calls came first (a
        client's pre-flight canary, for one).
        """
        n = next(self._realtime_ids)
        return hashlib.blake2b(f"{self.initial_faults.seed}:realtime:{n}".encode(), digest_size=16).hexdigest()[:24]

    def bump(self, section: str, key: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``section.key``."""
        with self.lock:
            self.counters[section][key] += amount

    def realtime_enter(self, cap: int = 0) -> bool:
        """Count one realtime request as in flight and track the peak; False (counted as rejected) at ``cap``."""
        with self.lock:
            if cap and self._in_flight >= cap:
                self.counters["realtime"]["rejected_over_capacity"] += 1
                return False
            self._in_flight += 1
            realtime = self.counters["realtime"]
            realtime["requests"] += 1
            realtime["realtime_max_concurrency"] = max(realtime["realtime_max_concurrency"], self._in_flight)
            return True

    def realtime_priority(self, body: dict[str, Any]) -> None:
        """Count the ``priority`` field of one realtime request body, as sent (``stats()["realtime"]``)."""
        key = orjson.dumps(body["priority"]).decode()[:40] if "priority" in body else "absent"
        with self.lock:
            self.realtime_priorities[key] += 1

    def realtime_exit(self) -> None:
        """Mark one realtime request as finished."""
        with self.lock:
            self._in_flight -= 1

    def delay_enter(self, phase: str, what: str, client: str = "") -> HeldCall:
        """Count one request as held by a route delay (``phase`` is ``before`` or ``after``); return its record.

        ``client`` is the caller's ``host:port``, so a test can tell whose call is held.
        """
        with self.lock:
            self._delayed[(phase, what)] += 1
            self.counters["http"]["delayed"] += 1
            call = HeldCall(next(self._held_ids), phase, what, client)
            self._held[call.id] = call
            return call

    def delay_exit(self, call: HeldCall) -> None:
        """Mark one delayed request as no longer held (answered, released or abandoned)."""
        with self.lock:
            key = (call.phase, call.request)
            self._delayed[key] -= 1
            if self._delayed[key] <= 0:
                del self._delayed[key]
            self._held.pop(call.id, None)

    def hurry(self) -> int:
        """End the ``slow`` fault of every OpenAI and Anthropic batch now; return how many had one.

        A benchmark holds every batch in progress until all of a job's chunks are deferred, then
        lets them finish at the normal pace.
        """
        with self.lock:
            every: list[OpenAIBatch | AnthropicBatch] = [*self.openai_batches.values()]
            every += self.anthropic_batches.values()
            slowed = [batch for batch in every if batch.faults.slow]
            for batch in slowed:
                batch.faults = replace(batch.faults, slow=0.0)
        self.wakeup.set()
        return len(slowed)

    def release(self, ids: list[int] | None = None) -> list[int]:
        """End the hold of the held calls ``ids`` (every held call when None) now; return the ids released.

        A released call goes on as if its delay had run out: before the route, the route runs;
        after it, the answer goes out. Unknown ids (no longer held) are skipped.
        """
        with self.lock:
            calls = [call for call in self._held.values() if ids is None or call.id in ids]
            for call in calls:
                call.release.set()
                self.counters["http"]["delayed_released"] += 1
            return [call.id for call in calls]

    # files ------------------------------------------------------------------------------------

    def add_file(self, filename: str, purpose: str, data: bytes, expires_after: int | None = None) -> StoredFile:
        """Store ``data`` as a new file and return its record."""
        now = int(time.time())
        record = StoredFile(
            id=self.new_id("file-", 22),
            filename=filename,
            purpose=purpose,
            data=data,
            created_at=now,
            expires_at=now + expires_after if expires_after else None,
        )
        with self.lock:
            self.files[record.id] = record
        return record

    # control ----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every object and counter; faults go back to the start-up settings."""
        with self.lock:
            self.files.clear()
            self.openai_batches.clear()
            self.anthropic_batches.clear()
            for counter in self.counters.values():
                counter.clear()
            self.realtime_priorities.clear()
            self.faults = self.initial_faults
            self.dice.reset()

    def set_faults(self, faults: Faults) -> None:
        """Replace the fault settings (new batches pick them up) and restart the HTTP dice."""
        with self.lock:
            self.faults = faults
            self.dice.reset()

    def stats(self) -> dict[str, Any]:
        """Return the counters, plus batches by status, as JSON."""
        with self.lock:
            result: dict[str, Any] = {name: dict(counter) for name, counter in self.counters.items()}
            openai_status = Counter(b.status for b in self.openai_batches.values())
            anthropic_status = Counter(b.status for b in self.anthropic_batches.values())
            in_flight = self._in_flight
            priorities = dict(self.realtime_priorities)
            delayed = [
                {"phase": phase, "request": what, "count": count} for (phase, what), count in self._delayed.items()
            ]
            held = [call.to_dict() for call in self._held.values()]
        defaults = {
            "openai": (
                "files_uploaded",
                "files_deleted",
                "batches_created",
                "batches_cancelled",
                "batches_cancelled_by_provider",
                "batches_held_for_polls",
                "requests_processed",
                "requests_succeeded",
                "requests_failed",
                "requests_expired",
            ),
            "anthropic": (
                "batches_created",
                "batches_cancelled",
                "batches_cancelled_by_provider",
                "batches_held_for_polls",
                "batches_deleted",
                "requests_processed",
                "requests_succeeded",
                "requests_errored",
                "requests_canceled",
                "requests_expired",
            ),
            "realtime": ("requests", "realtime_max_concurrency"),
            "http": (
                "requests",
                "injected_429",
                "injected_500",
                "dropped",
                "delayed",
                "delayed_abandoned",
                "delayed_released",
            ),
        }
        for section, keys in defaults.items():
            for key in keys:
                result[section].setdefault(key, 0)
        result["openai"]["batches_by_status"] = dict(openai_status)
        result["anthropic"]["batches_by_status"] = dict(anthropic_status)
        result["realtime"]["in_flight"] = in_flight
        result["realtime"]["requests_by_priority"] = priorities
        result["http"]["delayed_in_flight"] = sorted(delayed, key=lambda d: (d["phase"], d["request"]))
        result["http"]["delayed_calls"] = sorted(held, key=lambda d: d["id"])
        return result

    def batches(self, include_custom_ids: bool = False) -> list[dict[str, Any]]:
        """List every batch of both providers, oldest first, with status and request count.

        ``polls`` counts the batch's status retrieves; ``held`` is true while a finished batch waits
        for ``polls_before_done`` of them.
        """
        with self.lock:
            openai = list(self.openai_batches.values())
            anthropic = list(self.anthropic_batches.values())
        rows: list[dict[str, Any]] = []
        for ob in openai:
            row: dict[str, Any] = {
                "provider": "openai",
                "id": ob.id,
                "status": ob.status,
                "endpoint": ob.endpoint,
                "model": ob.model,
                "custom_id_count": ob.total or ob.request_count_hint,
                "metadata": ob.metadata,
                "created_at": ob.created_at,
                "polls": ob.polls,
                "held": bool(ob.held),
            }
            if include_custom_ids:
                row["custom_ids"] = self._openai_custom_ids(ob)
            rows.append(row)
        for ab in anthropic:
            row = {
                "provider": "anthropic",
                "id": ab.id,
                "status": ab.status,
                "custom_id_count": len(ab.requests),
                "created_at": int(ab.created_at),
                "polls": ab.polls,
                "held": bool(ab.held),
            }
            if include_custom_ids:
                row["custom_ids"] = [cid for cid, _ in ab.requests]
            rows.append(row)
        return rows

    def _openai_custom_ids(self, batch: OpenAIBatch) -> list[str]:
        """Read the custom_ids of a batch's input file (best effort; bad lines are skipped)."""
        stored = self.files.get(batch.input_file_id)
        if stored is None:
            return []
        ids: list[str] = []
        for line in stored.data.splitlines():
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
                ids.append(obj["custom_id"])
        return ids
