"""BatchCompleteSensor's typed state: the retry record of one chunk, and what an ended batch leads to.

The record is small and JSON-able: it is checkpointed in the task state store and carried
through the trigger (``carry``), so ``execute_complete`` knows which attempt an event is about
even without a store. Its dict form is the checkpoint format; keep :meth:`WaitRecord.to_dict`
and :meth:`WaitRecord.from_dict` symmetrical.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_batch_provider.descriptors import CompletedBatch
from airflow_batch_provider.status import BatchState


@dataclass
class Attempt:
    """One attempt at a chunk's lines: its current batch, the batches it replaced, its end state."""

    batch_id: str
    replaced: list[str] = field(default_factory=list)  # refused or cancelled-by-us batches, oldest first
    state: BatchState | None = None  # set once the batch ended completed or expired

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-able form (keys without a value are left out)."""
        data: dict[str, Any] = {"batch_id": self.batch_id}
        if self.replaced:
            data["replaced"] = list(self.replaced)
        if self.state is not None:
            data["state"] = self.state.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Attempt:
        """Rebuild an attempt from :meth:`to_dict` output."""
        state = data.get("state")
        return cls(
            batch_id=str(data["batch_id"]),
            replaced=list(data.get("replaced") or ()),
            state=BatchState.from_dict(state) if state else None,
        )


@dataclass
class WaitRecord:
    """Every attempt of one chunk (the first is the submitted batch), our cancels, and a refusal wait.

    ``origin`` is the submitted batch id: a record for another origin belongs to an earlier
    submission and is dropped. ``cancelled`` maps batch ids this pipeline cancelled to why.
    ``token_wait`` is :func:`~airflow_batch_provider.batches.token_budget.refusal_step`'s state
    while a ``token_limit_exceeded`` refusal is waited out.
    """

    origin: str
    attempts: list[Attempt]
    cancelled: dict[str, str] = field(default_factory=dict)
    token_wait: dict[str, float] | None = None

    @classmethod
    def start(cls, batch_id: str) -> WaitRecord:
        """Return the record of a freshly submitted batch: one attempt, nothing else."""
        return cls(origin=batch_id, attempts=[Attempt(batch_id)])

    @property
    def current(self) -> Attempt:
        """The attempt being waited for (the last one)."""
        return self.attempts[-1]

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-able form (the checkpoint and the trigger's ``carry``)."""
        data: dict[str, Any] = {
            "origin": self.origin,
            "attempts": [attempt.to_dict() for attempt in self.attempts],
            "cancelled": dict(self.cancelled),
        }
        if self.token_wait is not None:
            data["token_wait"] = dict(self.token_wait)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WaitRecord:
        """Rebuild a record from :meth:`to_dict` output."""
        wait = data.get("token_wait")
        return cls(
            origin=str(data["origin"]),
            attempts=[Attempt.from_dict(a) for a in data["attempts"]],
            cancelled=dict(data.get("cancelled") or {}),
            token_wait=dict(wait) if wait is not None else None,
        )


# -- what looking at an ended batch decides (or it raises a typed error) -------------------------------


@dataclass(frozen=True)
class Finished:
    """Every attempt ended: return ``result`` (the chunk plus every attempt's state)."""

    result: CompletedBatch


@dataclass(frozen=True)
class WaitUntil:
    """The current batch ended but must not be looked at again before ``until`` (epoch seconds)."""

    until: float


@dataclass(frozen=True)
class PollNext:
    """A new batch was created for the current or the next attempt: poll ``batch_id`` now."""

    batch_id: str


Outcome = Finished | WaitUntil | PollNext
