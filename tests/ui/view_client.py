"""The view's FastAPI app in-process, on a real Airflow metadata schema in an in-memory SQLite database.

Fast (about a second): Airflow's own models create the tables, rows go in as Airflow stores them
(XComs through ``XComModel.serialize_value``, as the REST API and the task SDK do), and the real
routes, queries, pages and middleware answer through Starlette's TestClient. Only Airflow's
authentication is replaced (every request is a user who may read everything): who may read what
is tested on a real api-server (tests/security/test_view_dag_scope.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool


class ViewDB:
    """An empty Airflow metadata database with helpers to add a run, its task instances and XComs."""

    def __init__(self) -> None:
        from airflow.models import import_all_models
        from airflow.models.base import Base

        import_all_models()
        engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
        Base.metadata.create_all(engine)
        self.session = Session(engine)

    def run(self, dag_id: str, run_id: str, state: str = "running") -> int:
        """Add a DAG run; return its primary key."""
        from airflow.models.dagrun import DagRun

        table = DagRun.__table__
        self.session.execute(
            table.insert().values(
                dag_id=dag_id, run_id=run_id, run_type="manual", state=state, data_interval_end=None, logical_date=None
            )
        )
        self.session.commit()
        return int(self.session.scalar(table.select().with_only_columns(table.c.id).where(table.c.run_id == run_id)))

    def task(self, dag_id: str, run_id: str, task_id: str, operator: str, map_index: int = -1) -> None:
        """Add a successful task instance of ``operator`` (the class name the view looks for)."""
        from airflow.models.taskinstance import TaskInstance

        values = {"id": uuid.uuid4(), "dag_id": dag_id, "run_id": run_id, "task_id": task_id,
                  "map_index": map_index, "operator": operator, "state": "success", "pool": "default_pool",
                  "try_number": 1}  # fmt: skip
        self.session.execute(TaskInstance.__table__.insert().values(**values))
        self.session.commit()

    def xcom(self, run_pk: int, dag_id: str, run_id: str, task_id: str, key: str, value: Any, map_index: int = -1):
        """Store an XCom as the REST API does (``XComModel.serialize_value``)."""
        from airflow.models.xcom import XComModel

        self.raw_xcom(run_pk, dag_id, run_id, task_id, key, XComModel.serialize_value(value), map_index)

    def raw_xcom(self, run_pk: int, dag_id: str, run_id: str, task_id: str, key: str, stored: Any, map_index: int = -1):
        """Store an XCom's column value as it is (what a task or the execution API may leave there)."""
        from airflow.models.xcom import XComModel

        row = {"dag_run_id": run_pk, "dag_id": dag_id, "run_id": run_id, "task_id": task_id,
               "map_index": map_index, "key": key, "value": stored}  # fmt: skip
        self.session.execute(XComModel.__table__.insert().values(**row))
        self.session.commit()


@contextmanager
def view_client(db: ViewDB) -> Iterator[Any]:
    """Yield a TestClient of the view's app on ``db``, every request made by a user who may read everything."""
    from airflow.api_fastapi.common.db.common import _get_session
    from fastapi.testclient import TestClient

    from airflow_batch_provider.ui.app import READ_RUN, app, readable_dag_ids

    def session() -> Iterator[Session]:
        yield db.session

    overrides: dict[Any, Any] = {dep.dependency: (lambda: None) for dep in READ_RUN}
    overrides |= {_get_session: session, readable_dag_ids: lambda: None}
    app.dependency_overrides.update(overrides)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield client
    finally:
        app.dependency_overrides.clear()
