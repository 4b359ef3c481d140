"""Routes another package adds to the emulator: the ``airflow_batch_emulator.routes`` entry-point group.

A backend that lives in its own distribution brings its fake with one line in its metadata::

    [project.entry-points."airflow_batch_emulator.routes"]
    mistral = "my_package.mistral_fake:MistralRoutes"

The entry point names a callable taking the :class:`~airflow_batch_emulator.server.BatchEmulator`
(what a route set may use of it: :class:`Emulator`) and returning a :class:`RouteSet` (a subclass,
or any object with the same attributes). The emulator adds its routes after the built-in ones,
answers errors on paths under its ``prefix`` in its ``error`` shape, accepts its ``key_headers``
as an API key, and calls ``reset()`` / ``close()`` with its own. A route set may use the
emulator's store and engines (``emulator.store``, ``emulator.openai_api``): Azure's
(:mod:`.azure_api`) serves its paths with the OpenAI engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any, Protocol

from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_emulator.openai_api import OpenAIApi
from airflow_batch_emulator.store import Store
from airflow_batch_emulator.wire import ErrorFactory, Request, Response, openai_error

log = logging.getLogger("airflow_batch_emulator")

ROUTES_GROUP = "airflow_batch_emulator.routes"

Route = tuple[str, str, Callable[[Request], Response]]


class Emulator(Protocol):
    """What a route set may use of the emulator that loads it (a protocol: the server imports this module)."""

    store: Store
    config: EmulatorConfig
    openai_api: OpenAIApi


class RouteSet:
    """One package's routes: ``(method, path regex, handler)`` and how their requests are answered."""

    #: Paths this set answers start with it (its errors then take the ``error`` shape).
    prefix: str = ""
    error: ErrorFactory = staticmethod(openai_error)
    #: Request headers that carry an API key for these routes (``Authorization: Bearer`` always does).
    key_headers: tuple[str, ...] = ()

    def routes(self) -> Iterable[Route]:
        """Return every route of this set."""
        return ()

    def batches(self, include_custom_ids: bool) -> list[dict[str, Any]]:
        """Return this set's own batches for ``/_emulator/batches`` (none when it keeps them in the store)."""
        return []

    def reset(self) -> None:
        """Forget what this set keeps outside the emulator's store."""

    def close(self) -> None:
        """Stop what this set started (workers, servers)."""


def load_route_sets(emulator: Emulator) -> list[RouteSet]:
    """Build every installed route set, by entry-point name."""
    found = []
    for point in sorted(entry_points(group=ROUTES_GROUP), key=lambda p: p.name):
        found.append(point.load()(emulator))
        log.debug("emulator routes %r from %s", point.name, point.value)
    return found
