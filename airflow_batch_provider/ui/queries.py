"""Read what the view needs for one DAG run from the metadata DB: three queries, whatever the chunk count."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_batch_provider.progress import PROGRESS_KEY
from airflow_batch_provider.ui.model import OUR_OPERATORS, SENSOR_OPERATOR, RunView, TaskRecord, build_run_view

SENSOR_CHECKPOINT = "batch_wait"  # BatchCompleteSensor's CHECKPOINT_KEY (not imported: the sensor pulls in the SDKs)
RECENT_RUNS = 50


def _xcom_value(raw: Any) -> Any:
    from airflow.models.xcom import XComModel

    class _Row:  # deserialize_value reads ``.value`` of a result row
        value = raw

    return XComModel.deserialize_value(_Row)


def load_run_view(session: Session, dag_id: str, run_id: str) -> RunView | None:
    """Return the view of one run, or None when the run does not exist."""
    from airflow.models.dagrun import DagRun
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel

    run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if run is None:
        return None
    tis = session.execute(
        select(
            TaskInstance.task_id,
            TaskInstance.map_index,
            TaskInstance.operator,
            TaskInstance.state,
            TaskInstance.start_date,
            TaskInstance.end_date,
            TaskInstance.try_number,
        ).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.operator.in_(OUR_OPERATORS))
    ).all()
    task_ids = sorted({ti.task_id for ti in tis})
    xcoms: dict[tuple[str, int, str], Any] = {}
    for task_id, map_index, key, value in session.execute(
        select(XComModel.task_id, XComModel.map_index, XComModel.key, XComModel.value).where(
            XComModel.dag_run_id == run.id,
            XComModel.task_id.in_(task_ids),
            XComModel.key.in_(("return_value", PROGRESS_KEY)),
        )
    ):
        xcoms[(task_id, map_index, key)] = _xcom_value(value)
    checkpoints: dict[tuple[str, int], Any] = {}
    sensors = sorted({ti.task_id for ti in tis if ti.operator == SENSOR_OPERATOR})
    if sensors:
        for task_id, map_index, value in session.execute(
            select(TaskStateStoreModel.task_id, TaskStateStoreModel.map_index, TaskStateStoreModel.value).where(
                TaskStateStoreModel.dag_run_id == run.id,
                TaskStateStoreModel.task_id.in_(sensors),
                TaskStateStoreModel.key == SENSOR_CHECKPOINT,
            )
        ):
            checkpoints[(task_id, map_index)] = _loads(value)
    records = [
        TaskRecord(
            task_id=ti.task_id,
            map_index=ti.map_index,
            operator=ti.operator or "",
            state=str(ti.state) if ti.state else None,
            start_date=ti.start_date,
            end_date=ti.end_date,
            try_number=ti.try_number,
            result=xcoms.get((ti.task_id, ti.map_index, "return_value")),
            progress=xcoms.get((ti.task_id, ti.map_index, PROGRESS_KEY)),
            checkpoint=checkpoints.get((ti.task_id, ti.map_index)),
        )
        for ti in tis
    ]
    return build_run_view(dag_id, run_id, str(run.state), records)


def _loads(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None


def load_recent_runs(session: Session, dag_ids: set[str] | None) -> list[dict[str, Any]]:
    """Return the latest runs of the DAGs that use these operators (``dag_ids``: those the user may read)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance

    uses_us = select(TaskInstance.dag_id).where(TaskInstance.operator == SENSOR_OPERATOR).distinct()
    query = select(DagRun).where(DagRun.dag_id.in_(uses_us))
    if dag_ids is not None:
        query = query.where(DagRun.dag_id.in_(dag_ids))
    query = query.order_by(DagRun.id.desc()).limit(RECENT_RUNS)
    return [
        {
            "dag_id": run.dag_id,
            "run_id": run.run_id,
            "state": str(run.state),
            "start_date": run.start_date,
            "end_date": run.end_date,
        }
        for run in session.scalars(query)
    ]
