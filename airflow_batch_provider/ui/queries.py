"""Read what the view needs for DAG runs from the metadata DB: three queries, whatever the chunk or run count."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from airflow_batch_provider.progress import ERRORS_KEY, PROGRESS_KEY, STOPPED_KEY
from airflow_batch_provider.ui.model import (
    ANSWERING_OPERATORS,
    OUR_OPERATORS,
    SENSOR_OPERATOR,
    RunView,
    TaskRecord,
    build_run_view,
)
from airflow_batch_provider.ui.values import UNREADABLE, mapping

SENSOR_CHECKPOINT = "batch_wait"  # BatchCompleteSensor's CHECKPOINT_KEY (not imported: the sensor pulls in the SDKs)
RECENT_RUNS = 50


def _xcom_value(raw: Any) -> Any:
    """Return a stored XCom as Airflow's REST API does, or UNREADABLE when it cannot be decoded.

    Airflow's decoder rebuilds objects named by ``__classname__`` (a class outside the allow list
    raises ImportError) and recurses into nesting (RecursionError): a value anyone could have
    written must leave the page to show the rest.
    """
    from airflow.models.xcom import XComModel

    class _Row:  # deserialize_value reads ``.value`` of a result row
        value = raw

    try:
        return XComModel.deserialize_value(_Row)
    except Exception:
        return UNREADABLE


def load_run_view(session: Session, dag_id: str, run_id: str) -> RunView | None:
    """Return the view of one run, or None when the run does not exist."""
    from airflow.models.dagrun import DagRun

    run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if run is None:
        return None
    return _load_views(session, [run])[0]


def _load_views(session: Session, runs: list[Any]) -> list[RunView]:
    """Return the views of ``runs`` (DagRun rows) in that order: three queries, whatever their count."""
    from airflow.models.taskinstance import TaskInstance

    if not runs:
        return []
    by_key = {(run.dag_id, run.run_id): run for run in runs}
    tis = session.execute(
        select(
            TaskInstance.dag_id,
            TaskInstance.run_id,
            TaskInstance.task_id,
            TaskInstance.map_index,
            TaskInstance.operator,
            TaskInstance.state,
            TaskInstance.start_date,
            TaskInstance.end_date,
            TaskInstance.try_number,
        ).where(
            TaskInstance.dag_id.in_({run.dag_id for run in runs}),
            TaskInstance.run_id.in_({run.run_id for run in runs}),
            TaskInstance.operator.in_(OUR_OPERATORS),
        )
    ).all()
    tis = [ti for ti in tis if (ti.dag_id, ti.run_id) in by_key]
    run_ids = {by_key[(ti.dag_id, ti.run_id)].id for ti in tis}
    xcoms = _xcoms(session, run_ids, sorted({ti.task_id for ti in tis}))
    checkpoints = _checkpoints(session, run_ids, sorted({ti.task_id for ti in tis if ti.operator == SENSOR_OPERATOR}))
    records: dict[int, list[TaskRecord]] = {run.id: [] for run in runs}
    for ti in tis:
        run_pk = by_key[(ti.dag_id, ti.run_id)].id
        key = (run_pk, ti.task_id, ti.map_index)
        values = xcoms.get(key, {})
        records[run_pk].append(
            TaskRecord(
                task_id=ti.task_id,
                map_index=ti.map_index,
                operator=ti.operator or "",
                state=str(ti.state) if ti.state else None,
                start_date=ti.start_date,
                end_date=ti.end_date,
                try_number=ti.try_number,
                result=values.get("return_value"),
                progress=mapping(values.get(PROGRESS_KEY)) or None,
                checkpoint=mapping(checkpoints.get(key)) or None,
                errors=_attempt_errors(values),
                stopped=mapping(values.get(STOPPED_KEY)) or None,
            )
        )
    return [build_run_view(run.dag_id, run.run_id, str(run.state), records[run.id]) for run in runs]


def _xcoms(session: Session, run_ids: set[int], task_ids: list[str]) -> dict[tuple[int, str, int], dict[str, Any]]:
    """Return the view's XComs by (dag run pk, task id, map index), then key."""
    from airflow.models.xcom import XComModel

    found: dict[tuple[int, str, int], dict[str, Any]] = {}
    if not task_ids:
        return found
    wanted = or_(
        XComModel.key.in_(("return_value", PROGRESS_KEY, STOPPED_KEY)),
        XComModel.key.like(f"{ERRORS_KEY}.attempt-%"),
    )
    for run_pk, task_id, map_index, key, value in session.execute(
        select(XComModel.dag_run_id, XComModel.task_id, XComModel.map_index, XComModel.key, XComModel.value).where(
            XComModel.dag_run_id.in_(run_ids), XComModel.task_id.in_(task_ids), wanted
        )
    ):
        found.setdefault((run_pk, task_id, map_index), {})[key] = _xcom_value(value)
    return found


def _checkpoints(session: Session, run_ids: set[int], sensors: list[str]) -> dict[tuple[int, str, int], Any]:
    from airflow.models.task_state_store import TaskStateStoreModel

    if not sensors:
        return {}
    rows = session.execute(
        select(
            TaskStateStoreModel.dag_run_id,
            TaskStateStoreModel.task_id,
            TaskStateStoreModel.map_index,
            TaskStateStoreModel.value,
        ).where(
            TaskStateStoreModel.dag_run_id.in_(run_ids),
            TaskStateStoreModel.task_id.in_(sensors),
            TaskStateStoreModel.key == SENSOR_CHECKPOINT,
        )
    )
    return {(run_pk, task_id, map_index): _loads(value) for run_pk, task_id, map_index, value in rows}


def _attempt_errors(values: dict[str, Any]) -> dict[int, Any]:
    """Return the sensor's failure records by attempt (keys ``llm_batch_errors.attempt-N``)."""
    prefix = f"{ERRORS_KEY}.attempt-"
    found = {}
    for key, value in values.items():
        number = key[len(prefix) :] if key.startswith(prefix) else ""
        if number.isdigit() and isinstance(value, dict):
            found[int(number)] = value
    return found


def _loads(value: str) -> Any:
    try:
        return json.loads(value)
    except (TypeError, ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return None


def load_recent_runs(session: Session, dag_ids: set[str] | None) -> list[dict[str, Any]]:
    """Return the latest runs of the DAGs that use these operators (``dag_ids``: those the user may read).

    Each run comes with its view (progress, failures, cost), loaded for all runs at once.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance

    uses_us = select(TaskInstance.dag_id).where(TaskInstance.operator.in_(ANSWERING_OPERATORS)).distinct()
    query = select(DagRun).where(DagRun.dag_id.in_(uses_us))
    if dag_ids is not None:
        query = query.where(DagRun.dag_id.in_(dag_ids))
    runs = list(session.scalars(query.order_by(DagRun.id.desc()).limit(RECENT_RUNS)))
    return [
        {
            "dag_id": run.dag_id,
            "run_id": run.run_id,
            "state": str(run.state),
            "start_date": run.start_date,
            "end_date": run.end_date,
            "view": view,
        }
        for run, view in zip(runs, _load_views(session, runs), strict=True)
    ]
