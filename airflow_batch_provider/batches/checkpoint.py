"""Checkpoints on Airflow's task state store, with a logged fallback when there is none.

``context["task_state_store"]`` (Airflow 3.3+) survives retries and is scoped to one task
instance, map index included; XCom does not survive a retry. A bare unit-test context has
no store: then nothing is checkpointed and the log says so once.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class Checkpoint:
    """A small JSON record under one key of the task state store."""

    def __init__(self, context: Any, key: str) -> None:
        self.key = key
        self.store = context.get("task_state_store") if hasattr(context, "get") else None
        if self.store is None:
            log.warning(
                "No task_state_store in this context (Airflow < 3.3 or a bare test context): "
                "checkpoint %r is kept in memory only and a retry cannot use it.",
                key,
            )
        self._memory: dict[str, Any] | None = None

    @property
    def durable(self) -> bool:
        """True when the checkpoint survives a retry."""
        return self.store is not None

    def load(self) -> dict[str, Any] | None:
        """Return the stored record, or None."""
        if self.store is None:
            return self._memory
        value = self.store.get(self.key, None)
        return dict(value) if isinstance(value, dict) else None

    def save(self, record: dict[str, Any]) -> None:
        """Store ``record`` (JSON-able) under the key."""
        if self.store is None:
            self._memory = dict(record)
        else:
            self.store.set(self.key, record)

    def clear(self) -> None:
        """Remove the record."""
        if self.store is None:
            self._memory = None
        else:
            self.store.delete(self.key)
