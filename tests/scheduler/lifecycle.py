"""Start a real Airflow deployment on a throwaway PostgreSQL database, and always take it down.

The scheduler, browser and distributed suites each run one (LocalExecutor or CeleryExecutor); this
is the one place that creates the database, starts the emulator and the components, waits for the
DAGs, turns a failed start into an error that carries every component's log tail, and stops,
drops and cleans up however the suite ends.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from tests.scheduler.postgres import create_database, drop_database
from tests.scheduler.processes import DeploymentError


class Startable(Protocol):
    """What :func:`running` needs of a deployment."""

    def start_emulator(self, *extra: str) -> None: ...
    def start(self) -> None: ...
    def wait_for_dag(self, dag_id: str, timeout: float = ...) -> None: ...
    def diagnostics(self, lines: int = ...) -> str: ...
    def stop(self, timeout: float = ...) -> Any: ...


D = TypeVar("D", bound=Startable)


@contextmanager
def running(suite: str, prefix: str, root: Path, build: Callable[[str], D], dag_ids: Sequence[str]) -> Iterator[D]:
    """Yield ``build(database)`` started, with ``dag_ids`` registered; ``suite`` names it in errors."""
    try:
        database = create_database(prefix)
    except Exception as exc:  # psycopg2.OperationalError and friends
        pytest.fail(f"the {suite} needs PostgreSQL on 127.0.0.1:5432 (user postgres): {exc}")
    deployment = build(database)
    try:
        try:
            deployment.start_emulator()
            deployment.start()
            for dag_id in dag_ids:
                deployment.wait_for_dag(dag_id)
        except Exception as exc:
            raise DeploymentError(f"the deployment did not start: {exc}\n\n{deployment.diagnostics()}") from exc
        yield deployment
    finally:
        try:
            deployment.stop()
        finally:
            drop_database(database)
            shutil.rmtree(root / "jobs", ignore_errors=True)  # chunk files: tens of MB per run
